"""Simulations per second of tdrl's batched tensor MCTS vs a plain Python-object MCTS.

Both run the same algorithm (MuZero PUCT search, Q-values min-max normalised by the parent
and its siblings, ties to the lowest action, no root noise) on the same tiny MuZero-style
model (8-dim latent state, 4 actions, random linear dynamics / reward / prior / value heads).
The Python version is what one writes by hand: a ``Node`` object per node, one tree at a
time, one batch-1 model call per simulation. tests/core/test_mcts_reference.py checks that
the two give the same visit counts.

With ``--mctx`` the same search also runs in **mctx** (JAX, ``jit``, CPU, one thread) in its
own venv (``/work/venvs/mctx``, see benchmarks/setup_peers.sh) as a subprocess on the same
weights and root embeddings (benchmarks/mcts_mctx.py), timed in alternate blocks (one of tdrl,
one of mctx, ``--repeats`` times, so that both meet the same load on a shared machine), and
the ratio tdrl / mctx is printed (of the two medians, and "paired": the median over the
alternations of each pair's ratio, which a change of load between pairs moves less);
``--record`` writes those rows to benchmarks/results/mcts.jsonl.

Run:  python -m benchmarks.mcts  [--simulations 32 --repeats 3 --batch-sizes 1 64 512]
      python -m benchmarks.mcts --mctx --skip-peer --record
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import statistics
import time

import torch

from tdrl.core.mcts import RecurrentOutput, RootOutput, muzero_policy


class TinyModel:
    """A tiny MuZero-style model on ``[B, dim]`` latent states with ``num_actions`` actions."""

    def __init__(
        self, dim: int = 8, num_actions: int = 4, seed: int = 0, dtype=torch.float32
    ) -> None:
        g = torch.Generator().manual_seed(seed)
        self.num_actions = num_actions
        self.dynamics = (torch.randn(num_actions, dim, dim, generator=g) / dim**0.5).to(dtype)
        self.reward_head = torch.randn(num_actions, dim, generator=g).to(dtype)
        self.policy_head = torch.randn(dim, num_actions, generator=g).to(dtype)
        self.value_head = torch.randn(dim, generator=g).to(dtype)
        self.discount = 0.97

    def to(self, device: torch.device | str) -> TinyModel:
        """Move the weights (in place) and return self."""
        for name in ("dynamics", "reward_head", "policy_head", "value_head"):
            setattr(self, name, getattr(self, name).to(device))
        return self

    def root(self, embedding: torch.Tensor) -> RootOutput:
        """``embedding`` ``[B, dim]`` -> RootOutput."""
        return RootOutput(
            embedding @ self.policy_head, torch.tanh(embedding @ self.value_head), embedding
        )

    def recurrent(self, embedding: torch.Tensor, action: torch.Tensor) -> RecurrentOutput:
        """``(embedding [B, dim], action [B]) -> RecurrentOutput``."""
        next_embedding = torch.tanh(
            torch.bmm(self.dynamics[action], embedding.unsqueeze(-1)).squeeze(-1)
        )
        reward = torch.tanh((self.reward_head[action] * embedding).sum(-1))
        discount = torch.full_like(reward, self.discount)
        return RecurrentOutput(
            next_embedding,
            reward,
            discount,
            next_embedding @ self.policy_head,
            torch.tanh(next_embedding @ self.value_head),
        )


# ------------------------------------------------------------------ the plain Python MCTS


class Node:
    """One search node, a plain Python object."""

    __slots__ = (
        "prior_logits", "raw_value", "embedding", "reward", "discount",
        "visit_count", "value_sum", "children",
    )  # fmt: skip

    def __init__(self, prior_logits, raw_value, embedding, reward=0.0, discount=0.0):
        self.prior_logits = prior_logits
        self.raw_value = raw_value
        self.embedding = embedding
        self.reward = reward
        self.discount = discount
        self.visit_count = 0
        self.value_sum = 0.0
        self.children: dict[int, Node] = {}

    def value(self) -> float:
        return self.value_sum / max(self.visit_count, 1)


def _softmax(logits: list[float]) -> list[float]:
    top = max(logits)
    exps = [math.exp(x - top) for x in logits]
    total = sum(exps)
    return [e / total for e in exps]


def _puct_action(node: Node, pb_c_init: float, pb_c_base: float) -> int:
    visits = node.visit_count
    pb_c = pb_c_init + math.log((visits + pb_c_base + 1.0) / pb_c_base)
    probs = _softmax(node.prior_logits)
    node_value = node.value()
    qvalues = {a: c.reward + c.discount * c.value() for a, c in node.children.items()}
    low = min([node_value, *qvalues.values()])
    high = max([node_value, *qvalues.values()])
    scale = max(high - low, 1e-8)
    best, best_score = 0, -math.inf
    for a, p in enumerate(probs):
        child = node.children.get(a)
        q = (qvalues[a] - low) / scale if child is not None else 0.0
        n = child.visit_count if child is not None else 0
        score = q + math.sqrt(visits) * pb_c * p / (n + 1)
        if score > best_score:
            best, best_score = a, score
    return best


def python_puct_search(
    model: TinyModel,
    embedding: torch.Tensor,
    num_simulations: int,
    pb_c_init: float = 1.25,
    pb_c_base: float = 19652.0,
) -> Node:
    """Search one tree from ``embedding`` ``[dim]``; returns the root ``Node``."""
    out = model.root(embedding[None])
    root = Node(out.prior_logits[0].tolist(), float(out.value[0]), embedding)
    root.visit_count, root.value_sum = 1, root.raw_value
    for _ in range(num_simulations):
        node, path = root, [root]
        while True:
            action = _puct_action(node, pb_c_init, pb_c_base)
            child = node.children.get(action)
            if child is None:
                break
            node = child
            path.append(node)
        step = model.recurrent(node.embedding[None], torch.tensor([action]))
        leaf = Node(
            step.prior_logits[0].tolist(),
            float(step.value[0]),
            step.next_embedding[0],
            float(step.reward[0]),
            float(step.discount[0]),
        )
        node.children[action] = leaf
        value = leaf.raw_value
        leaf.visit_count, leaf.value_sum = 1, value
        child = leaf
        for parent in reversed(path):
            value = child.reward + child.discount * value
            parent.visit_count += 1
            parent.value_sum += value
            child = parent
    return root


# ------------------------------------------------------------------------------ benchmark


def _median_time(fn, repeats: int, min_block_s: float = 0.2) -> float:
    """Median seconds per call of ``fn`` over ``repeats`` blocks of calls, each block long
    enough (``min_block_s``) that a short search is not timed from one call (mcts_mctx.py
    times the same way)."""
    start = time.perf_counter()
    fn()
    calls = max(1, math.ceil(min_block_s / max(time.perf_counter() - start, 1e-6)))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--simulations", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 64, 512])
    parser.add_argument("--device", default="cpu", help="device of the tensor search (the Python one stays on the CPU)")
    parser.add_argument("--skip-peer", action="store_true", help="skip the Python-object MCTS")
    parser.add_argument("--mctx", action="store_true", help="also run mctx in its venv")
    parser.add_argument("--mctx-python", default=os.environ.get("MCTX_PYTHON", "/work/venvs/mctx/bin/python"))
    parser.add_argument("--record", action="store_true", help="record the mctx rows")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, device_model = TinyModel(), TinyModel().to(args.device)
    n = args.simulations
    print(f"MCTS, PUCT, {n} simulations per tree, tiny model (dim 8, 4 actions), 1 thread, "
          f"tdrl on {args.device}")  # fmt: skip
    print(f"{'B':>5} {'tdrl sims/s':>14} {'python sims/s':>14} {'ratio':>8}")
    ours_rates, ours_visits, model_seconds, peer_rates, paired = {}, {}, {}, {}, {}
    peer = _MctxServer(args, model) if args.mctx else None
    for batch in args.batch_sizes:
        embeddings = torch.randn(batch, 8, generator=torch.Generator().manual_seed(batch))
        on_device = embeddings.to(args.device)

        def ours(embeddings=on_device):
            out = muzero_policy(
                device_model.root(embeddings), device_model.recurrent, n,
                dirichlet_fraction=0.0, temperature=0.0,
            )  # fmt: skip
            out["action"].cpu()  # waits for the device

        def plain(embeddings=embeddings):
            for row in embeddings:
                python_puct_search(model, row, n)

        ours()  # warm-up
        if peer is not None:  # alternate blocks of tdrl and mctx, so that both meet the same load
            t_ours, t_peer, paired[batch] = _alternating(ours, peer, batch, args.repeats)
            peer_rates[batch] = batch * n / t_peer
        else:
            t_ours = _median_time(ours, args.repeats)
        actions = torch.zeros(batch, dtype=torch.int64, device=args.device)
        # the model call alone: what bounds a simulation at small B
        model_seconds[batch] = _median_time(
            lambda: device_model.recurrent(on_device, actions), args.repeats, 0.05
        )
        rate_ours = batch * n / t_ours
        ours_rates[batch] = rate_ours
        ours_visits[batch] = muzero_policy(
            model.root(embeddings[:4]), model.recurrent, n, dirichlet_fraction=0.0, temperature=0.0
        )["visit_counts"].tolist()
        if args.skip_peer:
            print(f"{batch:>5} {rate_ours:>14,.0f} {'-':>14} {'-':>8}")
            continue
        rate_plain = batch * n / _median_time(plain, args.repeats)
        print(f"{batch:>5} {rate_ours:>14,.0f} {rate_plain:>14,.0f} {rate_ours / rate_plain:>7.1f}x")
    if peer is not None:
        peer.close()
        _versus_mctx(args, peer.info, peer_rates, ours_rates, ours_visits, model_seconds, paired)


def _alternating(ours, peer: _MctxServer, batch: int, repeats: int) -> tuple[float, float, float]:
    """Median seconds per call of ``ours`` and of mctx's search of ``batch`` trees, timed in
    alternate blocks of >= 0.2 s each (as :func:`_median_time`), and the median over the
    alternations of mctx's time / tdrl's (each pair of blocks met about the same load)."""
    start = time.perf_counter()
    ours()
    calls = max(1, math.ceil(0.2 / max(time.perf_counter() - start, 1e-6)))
    peer_calls = max(1, math.ceil(0.2 / max(peer.time(batch, 1), 1e-6)))
    times, peer_times = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            ours()
        times.append((time.perf_counter() - start) / calls)
        peer_times.append(peer.time(batch, peer_calls) / peer_calls)
    pairs = [theirs / mine for mine, theirs in zip(times, peer_times, strict=True)]
    return statistics.median(times), statistics.median(peer_times), statistics.median(pairs)


class _MctxServer:
    """benchmarks/mcts_mctx.py in the mctx venv, serving timed blocks of its search on the
    tiny model's weights and the benchmark's roots (compiled for every batch size first)."""

    def __init__(self, args, model: TinyModel) -> None:
        import numpy as np

        self.tmp = tempfile.TemporaryDirectory()
        path = os.path.join(self.tmp.name, "w.npz")
        weights = {k: getattr(model, k).numpy() for k in ("dynamics", "reward_head", "policy_head", "value_head")}
        np.savez(path, discount=np.float32(model.discount), **weights)
        for b in args.batch_sizes:
            emb = torch.randn(b, 8, generator=torch.Generator().manual_seed(b))
            np.save(path.replace(".npz", f"_emb{b}.npy"), emb.numpy())
        env = dict(os.environ, XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
                   JAX_PLATFORMS="cpu", PYTHONPATH="")  # fmt: skip
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mcts_mctx.py")
        cmd = [args.mctx_python, script, path, str(-args.simulations), str(args.repeats),
               *map(str, args.batch_sizes)]  # fmt: skip
        self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)  # fmt: skip
        line = self.proc.stdout.readline()
        if not line:
            sys.exit(f"mctx side failed (is {args.mctx_python} the mctx venv?):\n{self.proc.stderr.read()[-2000:]}")
        self.info = json.loads(line)

    def time(self, batch: int, calls: int) -> float:
        """Seconds of ``calls`` mctx searches of ``batch`` trees."""
        self.proc.stdin.write(f"{batch} {calls}\n")
        self.proc.stdin.flush()
        return float(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()
        self.tmp.cleanup()


def _backend_name() -> str:
    """What ``method="auto"`` runs on the CPU here."""
    import importlib.util

    if importlib.util.find_spec("numba") is not None:
        return "the numba backend, mcts/numba_backend.py"
    return "the tensor engine (numba is not installed), mcts/search.py"


def _versus_mctx(
    args, peer: dict, peer_rates: dict, ours_rates: dict, ours_visits: dict, model_seconds: dict,
    paired: dict,
) -> None:
    """Print (and with ``--record`` write) the ratios to mctx, timed in alternate blocks."""
    print(f"\nvs mctx {peer['mctx']} (jax {peer['jax']}, jit, CPU, one thread)")
    print(f"{'B':>5} {'tdrl sims/s':>14} {'mctx sims/s':>14} {'ratio':>8} {'paired':>8}  same visits (first 4 trees)")
    targets = {1: 1.0, 64: 2.5, 512: 4.5}  # issue 38
    for b in args.batch_sizes:
        theirs = peer_rates[b]
        ratio = ours_rates[b] / theirs
        same = peer["visits"][str(b)] == [[int(v) for v in row] for row in ours_visits[b]]
        print(f"{b:>5} {ours_rates[b]:>14,.0f} {theirs:>14,.0f} {ratio:>7.2f}x {paired[b]:>7.2f}x  {same}")
        if args.record:
            from benchmarks.records import write_record

            target = targets.get(b)
            verdict = "" if target is None else f" (target {target}x: {'met' if ratio >= target else 'not met'})"
            write_record(
                "MCTS", "Batched search vs mctx (JAX jit, CPU)", f"B={b} trees",
                {"tdrl sims/s": round(ours_rates[b]), "mctx sims/s": round(theirs)},
                peer=f"mctx {peer['mctx']} (jax {peer['jax']})", ratio=f"{ratio:.2f}x{verdict}",
                note=f"PUCT, {args.simulations} simulations, min-max Q (qtransform_by_parent_and_siblings), "
                "no root noise, tiny model (dim 8, 4 actions), same weights and roots, timed in alternate "
                "blocks (tdrl, then mctx, repeats times); tdrl with "
                f"method='auto' ({_backend_name()}); both on one CPU "
                "thread (XLA_FLAGS single-threaded); median of repeats, each a block of calls of "
                ">= 0.2 s, jit compile excluded; median over the alternations of the pair's ratio "
                f"{paired[b]:.2f}x; "
                f"visit counts of the first 4 trees identical: {same}; per simulation tdrl "
                f"{1e6 * b / ours_rates[b]:.1f} us (the tiny model's own call "
                f"{1e6 * model_seconds[b]:.1f} us, eager torch), mctx {1e6 * b / theirs:.1f} us; "
                f"load average {os.getloadavg()[0]:.1f} on "
                f"{os.cpu_count()} cores",
            )  # fmt: skip


if __name__ == "__main__":
    main()
