"""Asynchronous rewards: the code-execution reward with its programs on a bounded pool against
the same reward running them one after another (``workers=1``, the synchronous path).

Each of N completions is a small Python function with its test (half of them fail), run in the
bubblewrap sandbox (:func:`tdrl.llm.run_python_sandboxed`) under the reward's limits; both sides
score the same batch in the same process, interleaved, median of repeats; the scores must match.

    flock /tmp/tdrl-cpu.lock python -m benchmarks.async_rewards --n 32 --workers 4 --repeats 3
    flock /tmp/tdrl-cpu.lock python -m benchmarks.async_rewards --record   # also write the RESULTS row
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from tdrl.llm import code_execution_reward
from tdrl.llm.rewards import sandbox_mode


def _batch(n: int, sleep_s: float):
    completions, tests = [], []
    for i in range(n):
        wait = f"import time\ntime.sleep({sleep_s})\n" if sleep_s else ""
        completions.append(f"```python\n{wait}def f(x):\n    return sum(range(x)) + {i}\n```")
        want = sum(range(100)) + (i if i % 2 == 0 else -1)
        tests.append(f"assert f(100) == {want}")
    return completions, tests


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=32, help="completions per batch")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sleep", type=float, default=0.0, help="seconds each program waits (an I/O-bound test)")
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    completions, tests = _batch(args.n, args.sleep)
    seq = code_execution_reward(timeout=5.0, workers=1)
    par = code_execution_reward(timeout=5.0, workers=args.workers)
    seq(None, completions[:2], tests=tests[:2])  # warm-up: sandbox probe
    t_seq, t_par = [], []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        s = seq(None, completions, tests=tests)
        t_seq.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        p = par(None, completions, tests=tests)
        t_par.append(time.perf_counter() - t0)
        assert s == p == [1.0 if i % 2 == 0 else 0.0 for i in range(args.n)], (s, p)
    ms, mp = statistics.median(t_seq), statistics.median(t_par)
    print(f"sandbox mode: {sandbox_mode()}")
    print(f"workers=1: {ms:.3f} s/batch ({args.n / ms:.1f} programs/s)")
    print(f"workers={args.workers}: {mp:.3f} s/batch ({args.n / mp:.1f} programs/s)  -> x{ms / mp:.2f}")
    if args.record:
        from benchmarks.records import write_record

        table = f"code_execution_reward, {args.n} sandboxed programs per batch ({sandbox_mode()})"
        if args.sleep:
            table += f", each waiting {args.sleep:g} s"
        note = ("Same batch and scores on both sides (half the tests fail), interleaved, median of "
                f"{args.repeats}; the pool's threads wait on sandboxed processes, so the gain is bounded "
                "by the CPU cores when programs compute and by the worker count when they wait.")
        write_record("LLM (GRPO)", table, "workers=1 (synchronous path)",
                     {"s/batch": round(ms, 3), "programs/s": round(args.n / ms, 1)}, note=note)
        write_record("LLM (GRPO)", table, f"workers={args.workers} (bounded pool)",
                     {"s/batch": round(mp, 3), "programs/s": round(args.n / mp, 1)},
                     peer="workers=1", ratio=f"x{ms / mp:.2f} programs/s", note=note)


if __name__ == "__main__":
    main()
