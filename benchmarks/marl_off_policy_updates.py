"""Updates/s of the MARL off-policy algorithms (issue 41: MADDPG, IDDPG, MASAC, ISAC, IQL; QMIX beside).

One update is what ``train_off_policy`` does per optimiser step: the loss on a sampled batch,
backward, gradient clipping per loss part, one Adam step and the soft target updates. Batch
128 and 256x256 MLPs (BenchMARL 1.5's ``off_policy_train_batch_size`` and ``layers/mlp.yaml``),
on transitions of the task's BenchMARL config (10 envs x 60 steps). tdrl only: BenchMARL is not
installed here (``benchmarks/setup_benchmarl.sh`` makes its venv), so no ratio is printed.
Times are CPU seconds of this process (``time.process_time``), one torch thread, the median of
``--repeats`` rounds of ``--updates`` updates.

    flock /tmp/tdrl-cpu.lock python -m benchmarks.marl_off_policy_updates --task vmas/balance
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from tdrl.core.objectives import SoftUpdate
from tdrl.core.replay import LazyTensorStorage, TensorDictReplayBuffer
from tdrl.marl.algorithms import ALGORITHMS, make_groups
from tdrl.marl.loops import TrainConfig, off_policy_optimizer, off_policy_update
from tdrl.marl.tasks import make_task_env


def updates_per_s(algo: str, task: str, updates: int, repeats: int, batch: int) -> float:
    torch.manual_seed(0)
    env = make_task_env(task, 10, ALGORITHMS[algo].continuous, 0)
    groups = make_groups(algo, env, num_cells=(256, 256))
    with torch.no_grad():
        data = env.rollout(60, next(iter(groups.values())).policy).reshape(-1)
    buffer = TensorDictReplayBuffer(storage=LazyTensorStorage(data.numel()))
    buffer.extend(data)
    opt, clip = off_policy_optimizer(groups, TrainConfig())
    targets = [SoftUpdate(p.loss, tau=p.config.tau) for p in groups.values()]
    for _ in range(10):  # warm-up
        off_policy_update(buffer.sample(batch), groups, opt, clip, targets, 5.0)
    rates = []
    for _ in range(repeats):
        t = time.process_time()
        for _ in range(updates):
            off_policy_update(buffer.sample(batch), groups, opt, clip, targets, 5.0)
        rates.append(updates / (time.process_time() - t))
    return statistics.median(rates)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="vmas/balance")
    ap.add_argument("--algorithms", nargs="+", default=["maddpg", "iddpg", "masac", "isac", "iql", "qmix"])
    ap.add_argument("--updates", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch", type=int, default=128)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"| algorithm | task | updates/s (batch {args.batch}, 256x256, 1 thread) |\n|---|---|---|")
    for algo in args.algorithms:
        rate = updates_per_s(algo, args.task, args.updates, args.repeats, args.batch)
        print(f"| {algo} | {args.task} | {rate:.1f} |", flush=True)


if __name__ == "__main__":
    main()
