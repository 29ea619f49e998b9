"""EnvPool wrapper benchmark (not named envpool.py: it would shadow the package): ``EnvPoolEnv`` per-step cost vs raw EnvPool, side by side, one run.

For each task (CartPole-v1, HalfCheetah-v5) and batch (8, 64), one EnvPool thread, the same
pre-drawn actions on every side:

- ``raw``: ``pool.step(actions)`` and, where a sub-env finished, ``pool.reset(ids)`` for
  those ids: the raw loop that records no made-up step (EnvPool's own auto-reset would
  return a reset observation with reward 0 as the next step's transition);
- ``raw auto-reset``: ``pool.step(actions)`` alone (EnvPool's made-up steps included), to
  show what the exact semantics cost on a task with frequent episode ends;
- ``raw C``: the ``raw`` loop on EnvPool's C++ calls (``_send`` / ``_recv`` / ``_reset``,
  with the arrays its Python layer would pass), what ``EnvPoolEnv`` calls: the floor of any
  wrapper, and the honest baseline of tdrl's own overhead (``raw`` includes EnvPool's
  Python layer, ~15-20 us a step on CartPole, which tdrl skips);
- ``tdrl``: ``EnvPoolEnv.step_and_maybe_reset(td)`` (the public TensorDict API: step,
  next root, partial reset);
- ``tdrl dict``: the env's dict stepper and dict resetter (what the ``Collector``'s loop
  runs).

Target: tdrl <= 1.1x raw at batch 8 and 64. Every figure is the median over ``--repeats``
interleaved blocks of ``--steps`` steps, one torch thread.

    flock /tmp/tdrl-cpu.lock python -m benchmarks.envpool_step --record
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import numpy as np
import torch

warnings.filterwarnings("ignore")
torch.set_num_threads(1)

TASKS = {"CartPole-v1": 1.0, "HalfCheetah-v5": 0.2}  # share of --steps (HalfCheetah: ~1 ms/step)
BATCHES = (8, 64)


def _actions(env, steps: int, rng: np.random.Generator) -> tuple[list, list]:
    """``steps`` random actions: numpy for the raw pool, tensors for tdrl (same values)."""
    spec = env.action_spec
    n = env.num_envs
    if spec.dtype == torch.int64:  # OneHot CartPole
        k = spec.shape[-1]
        idx = rng.integers(0, k, (steps, n))
        raw = [a.astype(np.int64) for a in idx]
        ours = [torch.nn.functional.one_hot(torch.from_numpy(a), k) for a in idx]
    else:
        arr = rng.uniform(-1, 1, (steps, *spec.shape)).astype(np.float64)
        raw = list(arr)
        ours = [torch.from_numpy(a).to(spec.dtype) for a in arr]
    return raw, ours


def _time_raw(pool, acts: list, exact: bool) -> float:
    pool.reset()
    t = time.perf_counter()
    for a in acts:
        _, _, term, trunc, _ = pool.step(a)
        if exact:
            done = term | trunc
            if done.any():
                pool.reset(np.flatnonzero(done).astype(np.int32))
    return time.perf_counter() - t


def _time_raw_c(pool, acts: list) -> float:
    """``_time_raw(exact=True)`` on EnvPool's C++ methods (a synchronous one-player pool)."""
    keys = list(pool._state_keys)
    i_trunc, i_done = keys.index("trunc"), keys.index("done")
    ids = np.arange(len(pool), dtype=np.int32)
    dtype = pool._spec._action_spec[-1][0]
    send, recv, reset = pool._send, pool._recv, pool._reset
    pool.reset()
    t = time.perf_counter()
    for a in acts:
        send([ids, ids, a.astype(dtype, order="C")])
        s = recv()
        trunc = s[i_trunc]
        term = s[i_done] & ~trunc
        done = term | trunc
        if done.any():
            reset(np.flatnonzero(done).astype(np.int32))
            recv()
    return time.perf_counter() - t


def _time_tdrl(env, acts: list) -> float:
    td = env.reset()
    t = time.perf_counter()
    for a in acts:
        td["action"] = a
        _, td = env.step_and_maybe_reset(td)
    return time.perf_counter() - t


def _time_dict(env, acts: list) -> float:
    stepper, resetter = env.dict_stepper(), env.dict_resetter()
    env.reset()
    t = time.perf_counter()
    for a in acts:
        nxt, any_done = stepper({"action": a})
        if any_done:  # the Collector's reset of finished sub-envs, on the dicts too
            nxt.pop("reward")
            resetter(nxt, nxt["done"])
    return time.perf_counter() - t


def bench(env_id: str, batch: int, steps: int, repeats: int) -> dict:
    from tdrl.core.envs import EnvPoolEnv

    env = EnvPoolEnv(env_id, batch, num_threads=1, seed=0)
    pool = EnvPoolEnv(env_id, batch, num_threads=1, seed=0).pool
    raw_acts, our_acts = _actions(env, steps, np.random.default_rng(0))
    res = {"raw": [], "raw C": [], "raw auto-reset": [], "tdrl": [], "tdrl dict": []}
    _time_tdrl(env, our_acts[: steps // 10])  # warm-up
    for _ in range(repeats):
        res["raw"].append(_time_raw(pool, raw_acts, exact=True))
        res["tdrl"].append(_time_tdrl(env, our_acts))
        res["raw auto-reset"].append(_time_raw(pool, raw_acts, exact=False))
        res["raw C"].append(_time_raw_c(pool, raw_acts))
        res["tdrl dict"].append(_time_dict(env, our_acts))
    us = {k: statistics.median(v) / steps * 1e6 for k, v in res.items()}
    print(f"{env_id:<15} batch {batch:3d}: " + " | ".join(f"{k} {v:8.1f} us/step" for k, v in us.items())
          + f" | tdrl/raw {us['tdrl'] / us['raw']:.2f}x, dict/raw {us['tdrl dict'] / us['raw']:.2f}x"
          + f", tdrl/raw C {us['tdrl'] / us['raw C']:.2f}x",
          flush=True)
    env.close()
    return us


def _record(results: dict, args) -> None:
    import os

    from benchmarks.records import cpu_model, write_record

    load = os.getloadavg()[0]
    for (env_id, batch), us in results.items():
        ratio = us["tdrl"] / us["raw"]
        write_record(
            "Environments", "EnvPoolEnv vs raw EnvPool (1 EnvPool thread)", f"{env_id}, batch {batch}",
            {"tdrl us/step": round(us["tdrl"], 1), "tdrl dict us/step": round(us["tdrl dict"], 1),
             "raw us/step": round(us["raw"], 1), "raw C us/step": round(us["raw C"], 1),
             "raw auto-reset us/step": round(us["raw auto-reset"], 1)},
            peer="envpool 1.2.5, same actions; raw = step + pool.reset(ids) of finished sub-envs",
            ratio=f"{ratio:.2f}x raw (target <= 1.1x: {'met' if ratio <= 1.1 else 'missed'}); "
                  f"dict {us['tdrl dict'] / us['raw']:.2f}x; {us['tdrl'] / us['raw C']:.2f}x raw C",
            machine=f"shared 2-core CPU box ({cpu_model()}), load {load:.1f}, one torch thread",
            note=(f"Median of {args.repeats} interleaved repeats of {args.steps} (CartPole) / "
                  f"{int(args.steps * TASKS['HalfCheetah-v5'])} (HalfCheetah) steps. "
                  "'raw auto-reset' lets EnvPool reset finished sub-envs on their next step "
                  "(recording a made-up step); tdrl and 'raw' reset them at once, as the data "
                  "contract needs. 'raw C' is the 'raw' loop on EnvPool's C++ send/recv/reset "
                  "(what EnvPoolEnv calls, skipping EnvPool's per-call Python layer): tdrl's "
                  "own overhead is tdrl - raw C."),
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--record", action="store_true", help="write the rows to benchmarks/results")
    args = p.parse_args()
    print(f"torch {torch.__version__}, 1 thread; median of {args.repeats} interleaved repeats "
          f"of {args.steps} steps", flush=True)
    results = {(e, b): bench(e, b, int(args.steps * share), args.repeats)
               for e, share in TASKS.items() for b in BATCHES}
    if args.record:
        _record(results, args)


if __name__ == "__main__":
    main()
