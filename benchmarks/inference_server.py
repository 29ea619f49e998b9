"""Inference server benchmark: 8 CPU env workers, a 64x64 MLP policy, frames/s in one run.

Contenders (the same 8 Pendulum-v1 GymEnv workers, the same policy, one torch thread each):

- ``InferenceCollector(transport="process")``: spawned env workers, one batched policy
  forward in the trainer's server thread;
- ``InferenceCollector(transport="thread")``: env workers as threads of the trainer;
- ``InferenceCollector(transport="local")``: the same process workers each running their
  own policy copy (no server);
- ``MultiSyncCollector``: the existing multi-process collector (a Collector per worker);
- with ``--ray``, ``InferenceCollector(transport="ray")`` too (Ray actors, one actor call per
  step and worker: the transport that crosses machines; not in the ratios).

Targets (issue 21): server >= 1.5x the own-copy workers, and no slower than MultiSync.
Per round, each contender gets a fresh collector, one warm-up batch and ``--repeats`` timed
batches (their median); the figure is the median over ``--rounds`` rounds, since one contender
after another drifts by tens of percent on a shared 2-core box. Start-up is not timed.

    flock /tmp/tdrl-cpu.lock python -m benchmarks.inference_server --record
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time
import warnings

import torch

warnings.filterwarnings("ignore")
torch.set_num_threads(1)


def make_env():
    from tdrl.core.envs import GymEnv

    return GymEnv("Pendulum-v1")


def make_policy(cells: int = 64):
    from tensordict.nn import TensorDictModule

    from tdrl.core.modules import MLP

    torch.manual_seed(0)
    return TensorDictModule(MLP(3, 1, num_cells=(cells, cells), activation=torch.nn.Tanh),
                            ["observation"], ["action"])


def _fps(col, frames: int, repeats: int) -> float:
    col.next_batch()  # warm-up
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        col.next_batch()
        times.append(time.perf_counter() - t)
    return frames / statistics.median(times)


def main() -> None:
    from tdrl.core.collectors import InferenceCollector, MultiSyncCollector

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--frames", type=int, default=1600, help="frames per batch over all workers")
    p.add_argument("--repeats", type=int, default=3, help="timed batches per contender and round")
    p.add_argument("--rounds", type=int, default=3,
                   help="rounds over every contender (a fresh collector each); the figure is the "
                        "median over rounds (one contender after another drifts on a shared box)")
    p.add_argument("--cells", type=int, default=64, help="width of the policy's two hidden layers")
    p.add_argument("--server-device", default="cpu",
                   help="where the server's policy runs (e.g. cuda; the own copies stay on the CPU)")
    p.add_argument("--ray", action="store_true",
                   help="also time transport='ray' once after the rounds (Ray actors as env "
                        "workers; not in the ratios)")
    p.add_argument("--record", action="store_true")
    args = p.parse_args()
    policy = make_policy(args.cells)  # the workers' copies (CPU)
    served = copy.deepcopy(policy).to(args.server_device)
    samples: dict[str, list[float]] = {}
    plan = [n for _ in range(args.rounds) for n in ("process", "thread", "local", "multisync")]
    for name in plan + (["ray"] if args.ray else []):
        if name == "ray":  # started last: its daemons would slow the other contenders
            import ray

            os.environ.setdefault("RAY_AUTH_MODE", "disabled")
            ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
        if name == "multisync":
            col = MultiSyncCollector(make_env, policy, num_workers=args.workers,
                                     frames_per_batch=args.frames)
        else:
            col = InferenceCollector(make_env, policy if name == "local" else served,
                                     num_workers=args.workers, frames_per_batch=args.frames,
                                     transport=name,  # Ray: the actors share the box's CPUs
                                     ray_options={"num_cpus": os.cpu_count() / args.workers})
        samples.setdefault(name, []).append(_fps(col, args.frames, args.repeats))
        extra = ""
        if name in ("process", "thread", "ray"):
            extra = f" (mean rows per forward {col.server.rows / max(1, col.server.forwards):.1f})"
        print(f"{name:<10} {samples[name][-1]:9.0f} frames/s{extra}", flush=True)
        col.shutdown()
    fps = {k: statistics.median(v) for k, v in samples.items()}
    spread = ", ".join(f"{k} {min(v):,.0f}-{max(v):,.0f}" for k, v in samples.items() if len(v) > 1)
    print(f"medians over {args.rounds} rounds: " + ", ".join(f"{k} {v:,.0f}" for k, v in fps.items())
          + f" (rounds' range: {spread})", flush=True)
    best = max(fps["process"], fps["thread"])
    print(f"server (best transport) / own copies = {best / fps['local']:.2f}x (target >= 1.5x); "
          f"/ MultiSync = {best / fps['multisync']:.2f}x (target >= 1.0x)", flush=True)
    if args.record:
        from benchmarks.records import cpu_model, write_record

        load = os.getloadavg()[0]
        c = args.cells
        title = f"Inference server, {args.workers} env workers, MLP 3-{c}-{c}-1, Pendulum-v1"
        if args.server_device != "cpu":
            title += f", served on {args.server_device}"
        rounds = (f"Per round and contender the median of {args.repeats} batches after a warm-up; "
                  f"the figure is the median of {args.rounds} rounds (range over rounds: {spread}). ")
        note = (rounds + "The harness of the 3-64-64-1 "
                "row with a wider policy (the forward a larger share of a step: what batching "
                f"saves); the server's copy on {args.server_device}, the own copies on the CPU. "
                "On the 2-core box the server overtakes the own copies between 512 and 1024 "
                "cells (medians of 3 rounds, 2026-12-06: 0.95x at 256, 0.90x at 512, 1.23x at 1024).")
        if c == 64 and args.server_device == "cpu":
            note = (rounds + "Every worker runs a Collector "
                    "(the dict loop): with the server its policy is its rows of shared slabs and a "
                    "step costs two small copies and two one-byte pipe writes (inference_slab.py); "
                    "the process transport polls 1 ms before blocking (spin_s; 0 gave 14.2k f/s, "
                    "1 ms 18.7-22k in one sweep), threads do not (one GIL). Process workers are "
                    "forked (start_method): spawned ones ran the same code at twice the CPU (per "
                    "frame, psutil over 5 batches: a spawned server worker 118 us user + 28 us "
                    "system, a forked one 52 + 22, the server thread 30 -> 15 us; 12-13k f/s "
                    "spawned) - 9 private copies of the interpreter's heap do not share the "
                    "caches. Why 1.5x own copies is out of reach on "
                    f"{os.cpu_count()} cores (CPU split measured 2026-12-04 on an AMD EPYC box): an "
                    "own-copy worker spends ~71 us CPU a frame, its forward ~20 us of it; a server "
                    "saves that forward but each worker then blocks and is woken once a step "
                    "(~22 us of system time a frame), so even a free server would give at most "
                    "~1.4x. Futex doorbells in shared memory instead of the pipes (one system call "
                    "a side, none when the answer is already there) were tried on 2026-12-06 and "
                    "were not faster (10-13k vs 11-13k f/s, 2 rounds each): the cost is the "
                    "block and wake-up of 8 workers on 2 cores, not the system calls. A server "
                    "wins where the forward dominates: the 3-1024-1024-1 row "
                    "(own copies each read their own weights; the server reads one copy per 8 "
                    "rows). The 16-core device run is in benchmarks/gpu_check.sh.")
        write_record(
            "Collectors", title,
            f"{args.frames} frames/batch",
            {"server process f/s": round(fps["process"]), "server thread f/s": round(fps["thread"]),
             "own policy copy f/s": round(fps["local"]), "MultiSync f/s": round(fps["multisync"]),
             **({"server ray f/s": round(fps["ray"])} if "ray" in fps else {})},
            peer="the same workers with their own policy copy; MultiSyncCollector",
            ratio=f"x{best / fps['local']:.2f} own copies (target 1.5x); "
                  f"x{best / fps['multisync']:.2f} MultiSync (target 1.0x)",
            machine=f"{os.cpu_count()}-core CPU box ({cpu_model()}), load {load:.1f}, one torch thread "
                    "per process",
            note=note,
        )


if __name__ == "__main__":
    main()
