"""GAE on the CPU: tdrl.core.values.gae vs TorchRL's GAE functions, side by side.

Run (one torch thread, in the peers venv)::

    flock /tmp/tdrl-cpu.lock .venv-bench/bin/python -m benchmarks.gae

Shapes: 256 envs x 1024 steps, ``[256, 1024, 1]`` float32, ~1% of steps done (half of
them terminated). Prints the median of ``--repeat`` timed calls for each implementation
and the ratio of TorchRL's fastest to ours.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def _median_ms(fn, repeat: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, default=256)
    parser.add_argument("--steps", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--done-prob", type=float, default=0.01)
    parser.add_argument("--record", action="store_true",
                        help="also store the rows in benchmarks/results (then run make_results.py)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)

    from tdrl.core.values import functional as F

    shape = (args.envs, args.steps, 1)
    reward, value, next_value = torch.randn(shape), torch.randn(shape), torch.randn(shape)
    done = torch.rand(shape) < args.done_prob
    terminated = done & (torch.rand(shape) < 0.5)
    gamma, lmbda = 0.99, 0.95

    ours = {
        "tdrl gae (core torch scan)": lambda: F.gae(
            reward, value, next_value, done, terminated, gamma, lmbda, backend="torch"
        ),
    }
    if F.kernels_available("gae"):
        ours["tdrl gae (kernels dispatch)"] = lambda: F.gae(
            reward, value, next_value, done, terminated, gamma, lmbda, backend="kernels"
        )
    peers = {}
    try:
        import torchrl
        from torchrl.objectives.value import functional as TF

        peers[f"torchrl {torchrl.__version__} generalized_advantage_estimate"] = (
            lambda: TF.generalized_advantage_estimate(
                gamma, lmbda, value, next_value, reward, done=done, terminated=terminated
            )
        )
        peers[f"torchrl {torchrl.__version__} vec_generalized_advantage_estimate"] = (
            lambda: TF.vec_generalized_advantage_estimate(
                gamma, lmbda, value, next_value, reward, done=done, terminated=terminated
            )
        )
        ref = TF.generalized_advantage_estimate(
            gamma, lmbda, value, next_value, reward, done=done, terminated=terminated
        )[0]
        mine = F.gae(reward, value, next_value, done, terminated, gamma, lmbda)[0]
        core = F.gae(reward, value, next_value, done, terminated, gamma, lmbda, backend="torch")[0]
        err = (ref - mine).abs().max().item()
        err_core = (ref - core).abs().max().item()
    except ImportError:
        err = err_core = float("nan")

    print(f"GAE {tuple(shape)} float32, 1 thread, median of {args.repeat}")
    results = {}
    for name, fn in {**ours, **peers}.items():
        results[name] = _median_ms(fn, args.repeat)
        print(f"  {name:<60s} {results[name]:8.2f} ms")
    if peers:
        best_peer = min(peers, key=results.get)
        best_ours = min(ours, key=results.get)
        print(f"max |ours - torchrl| = {err:.2e} (default path), {err_core:.2e} (core torch scan)")
        for name in ours:
            print(
                f"  speed-up of {name} over fastest TorchRL ({best_peer}): "
                f"{results[best_peer] / results[name]:.2f}x"
            )
        print(f"best: {best_ours} {results[best_ours]:.2f} ms vs {results[best_peer]:.2f} ms")
        if args.record:
            _record(args, results, ours, peers, best_peer)
    else:
        print("TorchRL not importable: run with .venv-bench/bin/python for the comparison.")


# RESULTS.md row names of the contenders (section "Learning (library)")
_ROWS = {
    "tdrl gae (core torch scan)": 'tdrl values.gae, backend="torch" (core blocked scan, no kernels)',
    "tdrl gae (kernels dispatch)": "tdrl values.gae, default (dispatches to tdrl.kernels.gae)",
    "generalized_advantage_estimate": "TorchRL generalized_advantage_estimate (loop)",
    "vec_generalized_advantage_estimate": "TorchRL vec_generalized_advantage_estimate",
}


def _record(args, results: dict, ours: dict, peers: dict, best_peer: str) -> None:
    from benchmarks.records import write_record

    table = (f"GAE, {args.envs} envs x {args.steps} steps ([{args.envs}, {args.steps}, 1] float32, "
             f"~{args.done_prob:.0%} done)")
    for name, ms in results.items():
        row = _ROWS.get(name) or _ROWS[name.split()[-1]]
        ratio = f"{results[best_peer] / ms:.2f}x faster" if name in ours else f"{results[best_peer] / ms:.2f}x"
        write_record("Learning (library)", table, row, {"median ms": round(ms, 2)},
                     peer="TorchRL loop", ratio=ratio)


if __name__ == "__main__":
    main()
