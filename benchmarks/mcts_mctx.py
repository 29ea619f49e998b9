"""The mctx side of benchmarks/mcts.py: run in the peer venv (/work/venvs/mctx, JAX on CPU).

Reads the tiny model's weights from an ``.npz`` written by benchmarks/mcts.py, runs
``mctx.muzero_policy`` (PUCT, ``qtransform_by_parent_and_siblings`` = min-max Q, no root
noise, greedy action) under ``jax.jit`` on one CPU thread, and prints one JSON line
``{"batch": simulations per second, ...}`` (median of repeats, each a block of calls of at
least 0.2 s, compile excluded).

A negative simulation count serves instead: after compiling it prints the visits, then reads
``B CALLS`` lines from stdin and answers each with the seconds of ``CALLS`` searches of ``B``
trees (benchmarks/mcts.py times both libraries in alternate blocks this way).

Run (normally by benchmarks/mcts.py --mctx):
    XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1" \\
        /work/venvs/mctx/bin/python -m benchmarks.mcts_mctx WEIGHTS.npz 32 3 1 64 512
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import mctx
import numpy as np


def main() -> None:
    path, sims, repeats, *batches = sys.argv[1:]
    sims, repeats = int(sims), int(repeats)
    w = {k: jnp.asarray(v) for k, v in np.load(path).items()}
    discount = float(w.pop("discount"))

    def recurrent_fn(params, rng_key, action, embedding):
        nxt = jnp.tanh(jnp.einsum("bij,bj->bi", params["dynamics"][action], embedding))
        reward = jnp.tanh((params["reward_head"][action] * embedding).sum(-1))
        out = mctx.RecurrentFnOutput(
            reward=reward,
            discount=jnp.full_like(reward, discount),
            prior_logits=nxt @ params["policy_head"],
            value=jnp.tanh(nxt @ params["value_head"]),
        )
        return out, nxt

    @jax.jit
    def search(params, embeddings):
        root = mctx.RootFnOutput(
            prior_logits=embeddings @ params["policy_head"],
            value=jnp.tanh(embeddings @ params["value_head"]),
            embedding=embeddings,
        )
        out = mctx.muzero_policy(
            params, jax.random.PRNGKey(0), root, recurrent_fn, sims,
            dirichlet_fraction=0.0, temperature=0.0,
            qtransform=mctx.qtransform_by_parent_and_siblings,
        )  # fmt: skip
        return out.action, out.search_tree.summary().visit_counts

    serve = sims < 0  # interleaved: compile, report the visits, then time blocks on request
    sims = abs(sims)
    rates, visits = {}, {}
    for b in map(int, batches):
        emb = jnp.asarray(np.load(path.replace(".npz", f"_emb{b}.npy")))
        jax.block_until_ready(search(w, emb))  # compile
        visits[b] = np.asarray(search(w, emb)[1][:4]).tolist()
        if serve:
            continue
        t0 = time.perf_counter()
        jax.block_until_ready(search(w, emb))
        calls = max(1, math.ceil(0.2 / max(time.perf_counter() - t0, 1e-6)))  # blocks of >= 0.2 s
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(calls):
                jax.block_until_ready(search(w, emb))
            times.append((time.perf_counter() - t0) / calls)
        rates[b] = b * sims / statistics.median(times)
    print(json.dumps({"rates": rates, "visits": visits, "jax": jax.__version__, "mctx": mctx.__version__}), flush=True)
    if not serve:
        return
    roots = {b: jnp.asarray(np.load(path.replace(".npz", f"_emb{b}.npy"))) for b in map(int, batches)}
    for line in sys.stdin:  # "B CALLS": seconds of CALLS searches of B trees, one after another
        b, calls = map(int, line.split())
        t0 = time.perf_counter()
        for _ in range(calls):
            jax.block_until_ready(search(w, roots[b]))
        print(time.perf_counter() - t0, flush=True)

if __name__ == "__main__":
    main()
