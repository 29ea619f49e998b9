"""Offline learning on a locally built "medium" Minari dataset, recorded in RESULTS.md.

1. train SAC briefly with ``apps/sac`` (a partly trained, "medium" policy);
2. roll that checkpoint out (its stochastic policy) and write the rollouts with minari's own
   writer (``tdrl.core.datasets.write_minari``), so the dataset is in minari's real format;
3. train BC / TD3+BC / IQL / CQL / DT with ``apps/offline`` on that dataset folder and record
   each policy's evaluation return beside the dataset's mean episode return.

    flock /tmp/tdrl-cpu.lock python -m benchmarks.offline_learning --sac-frames 4000 --episodes 50 --steps 5000 --record
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch

from tdrl.core.cli import load_app

SECTION = "Offline learning"


def build_dataset(sac, args, root: Path) -> tuple[Path, float]:
    """SAC checkpoint -> rollouts -> a local Minari dataset; returns its folder and the SAC return."""
    from tdrl.core import DoubleToFloat
    from tdrl.core.collectors import Collector
    from tdrl.core.datasets import write_minari
    from tdrl.core.envs import make_env

    cfg = sac.Config(env_id=args.env_id, total_frames=args.sac_frames, learning_starts=500, eval_episodes=5,
                     checkpoint_every=0, progress=False, seed=args.seed, out=str(root / "sac"))
    summary = sac.train(cfg)
    env = make_env(args.env_id, 1, (DoubleToFloat(),))
    actor, _ = sac.make_actor_critic(env, cfg)
    actor.load_state_dict(torch.load(root / "sac" / "model.pt", weights_only=True)["actor"])
    frames = args.episodes * 200
    collector = Collector(env, actor, frames_per_batch=1000, total_frames=frames, seed=args.seed + 1)
    with torch.no_grad():
        rows = torch.cat([b.reshape(-1) for b in collector])
    collector.shutdown()
    env.close()
    done = rows["next", "done"].squeeze(-1)
    rows["episode"] = torch.cat([torch.zeros(1, dtype=torch.long), done[:-1].long().cumsum(0)])
    os.environ["MINARI_DATASETS_PATH"] = str(root / "minari")
    ds = write_minari(rows.detach(), f"{args.env_id.split('-')[0].lower()}/medium-v0", env=args.env_id,
                      algorithm_name=f"tdrl SAC, {args.sac_frames} frames")
    print(f"[offline_learning] SAC eval return {summary['eval_return']:.1f}; dataset: {ds.total_episodes} "
          f"episodes, {ds.total_steps} steps", flush=True)
    return Path(ds.spec.data_path).parent, summary["eval_return"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--env-id", default="Pendulum-v1")
    ap.add_argument("--sac-frames", type=int, default=4000)
    ap.add_argument("--episodes", type=int, default=50)
    ap.add_argument("--steps", type=int, default=5000)
    ap.add_argument("--dt-steps", type=int, default=3000)
    ap.add_argument("--dt-context", type=int, default=20)
    ap.add_argument("--dt-lr", type=float, default=1e-4)
    ap.add_argument("--algorithms", default="bc,td3_bc,iql,cql,dt")
    ap.add_argument("--dataset", default="", help="reuse a Minari dataset folder this script built before")
    ap.add_argument("--sac-return", type=float, default=float("nan"), help="with --dataset: its SAC checkpoint's return")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="runs/offline_learning")
    ap.add_argument("--record", action="store_true", help="write the rows to benchmarks/results (RESULTS.md)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    from benchmarks.records import write_record

    root = Path(args.out)
    sac, offline = load_app("sac"), load_app("offline")
    t0 = time.time()
    folder, sac_return = (Path(args.dataset), args.sac_return) if args.dataset else build_dataset(sac, args, root)
    for algo in args.algorithms.split(","):
        steps = args.dt_steps if algo == "dt" else args.steps
        extra = dict(batch_size=64, lr=args.dt_lr, context=args.dt_context, embed_dim=64, num_layers=2) if algo == "dt" else {}
        cfg = offline.Config(env_id=args.env_id, algorithm=algo, dataset=str(folder), steps=steps, eval_every=0,
                             eval_episodes=10, checkpoint_every=0, progress=False, seed=args.seed,
                             out=str(root / algo), **extra)
        t1 = time.time()
        s = offline.train(cfg)
        ratio = s["eval_return"] / s["dataset_return"]  # returns are negative on Pendulum: < 1 is better
        print(f"[offline_learning] {algo}: eval {s['eval_return']:.1f}, dataset mean {s['dataset_return']:.1f} "
              f"(ratio {ratio:.2f}), {time.time() - t1:.0f} s", flush=True)
        if not args.record:
            continue
        write_record(SECTION, f"{args.env_id} medium dataset (tdrl SAC after {args.sac_frames} frames, "
                     f"{args.episodes} rollout episodes, minari format)",
                     algo if args.seed == 0 else f"{algo} (seed {args.seed})",  # other seeds: rows beside seed 0's
                     {"eval return (10 episodes)": round(s["eval_return"], 1),
                      "dataset mean return": round(s["dataset_return"], 1),
                      "gradient steps": steps, "CPU s": round(time.time() - t1)},
                     ratio=f"{'above' if s['eval_return'] >= s['dataset_return'] else 'below'} the dataset "
                           f"(return ratio {ratio:.2f})",
                     note=f"Seed 0 unless the row names another; one dataset build, whose SAC checkpoint "
                          f"itself evaluates at {sac_return:.1f}. Pendulum returns are negative: higher "
                          "(closer to 0) is better.")
    print(f"[offline_learning] total {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
