"""Hindsight experience replay on a sparse-reward goal task, recorded in RESULTS.md.

The same SAC agent (``apps/her``: goal-conditioned actor and critics, same seed, same frame
budget, same gradient steps) trained twice on a Gymnasium Robotics point maze: with
:class:`~tdrl.core.replay.HERTransform` (future strategy, k = 4, rewards from the env's own
``compute_reward``) and without it. Each arm's final success rate (deterministic policy, the goal
reached and held at the episode's last step) is printed side by side.

    flock /tmp/tdrl-cpu.lock python -m benchmarks.her_goals --env-id PointMaze_Open-v3 --frames 12000 --record
    # apps/her's open recipe (gamma 0.98 for the 100-step episodes, tau 0.05), 100 evaluation episodes:
    flock /tmp/tdrl-cpu.lock python -m benchmarks.her_goals --frames 12000 --eval-episodes 100 --tau 0.05 --gamma 0.98 --seed 0 --record
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from tdrl.core.cli import load_app

SECTION = "Goal-conditioned RL"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--env-id", default="PointMaze_Open-v3")
    ap.add_argument("--frames", type=int, default=12_000)
    ap.add_argument("--max-episode-steps", type=int, default=100)
    ap.add_argument("--hidden", default="128,128")
    ap.add_argument("--eval-episodes", type=int, default=50)
    ap.add_argument("--tau", type=float, default=0.005, help="Polyak factor of the target critics")
    ap.add_argument("--gamma", type=float, default=0.95)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--utd", type=float, default=1.0, help="gradient steps per frame")
    ap.add_argument("--k", type=int, default=4, help="HER: hindsight goals per real goal")
    ap.add_argument("--arms", default="her,no_her")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="runs/her_goals")
    ap.add_argument("--record", action="store_true", help="write benchmarks/results/goal_conditioned_rl.jsonl")
    args = ap.parse_args()
    torch.set_num_threads(1)
    from benchmarks.records import write_record

    her = load_app("her")
    hidden = tuple(int(h) for h in args.hidden.split(","))
    results = {}
    for arm in args.arms.split(","):
        if arm not in ("her", "no_her"):
            raise SystemExit(f"--arms: unknown arm {arm!r} (expected her, no_her)")
        cfg = her.Config(env_id=args.env_id, total_frames=args.frames, max_episode_steps=args.max_episode_steps,
                         hidden=hidden, her=arm == "her", eval_every=max(1, args.frames // 6),
                         tau=args.tau, gamma=args.gamma, batch_size=args.batch_size, utd_ratio=args.utd, k=args.k,
                         eval_episodes=args.eval_episodes, checkpoint_every=0, progress=False,
                         seed=args.seed, out=str(Path(args.out) / arm))
        t0 = time.time()
        s = her.train(cfg)
        results[arm] = (s, time.time() - t0)
        print(f"[her_goals] {arm}: success {s['eval_success']:.2f}, return {s['eval_return']:.1f}, "
              f"{s['updates']} updates, {results[arm][1]:.0f} s", flush=True)
    if len(results) == 2:
        a, b = results["her"][0]["eval_success"], results["no_her"][0]["eval_success"]
        print(f"[her_goals] {args.env_id}, {args.frames} frames: success with HER {a:.2f} | without {b:.2f}")
    if not args.record:
        return
    table = (f"{args.env_id} (sparse reward, {args.max_episode_steps}-step episodes), SAC "
             f"{args.hidden.replace(',', 'x')}, {args.frames} frames, seed {args.seed}")
    changed = [f"{name} {getattr(args, attr)}" for name, attr, default in
               (("gamma", "gamma", 0.95), ("tau", "tau", 0.005), ("batch", "batch_size", 256), ("UTD", "utd", 1.0)) if getattr(args, attr) != default]
    table += "".join(f", {c}" for c in changed)  # the default settings keep the earlier tables' names
    other = {"her": "no_her", "no_her": "her"}
    for arm, (s, secs) in results.items():
        peer = results.get(other[arm])
        ratio = None
        if arm == "her" and peer is not None:
            ratio = f"success {s['eval_success']:.2f} vs {peer[0]['eval_success']:.2f} without HER"
        write_record(SECTION, table, f"SAC + HER (future, k={args.k})" if arm == "her" else "SAC without HER",
                     {f"success ({args.eval_episodes} episodes)": round(s["eval_success"], 2),
                      "eval return": round(s["eval_return"], 1), "gradient steps": s["updates"],
                      "CPU s": round(secs)},
                     peer="the same agent without HER" if arm == "her" else None, ratio=ratio,
                     note="Success: the deterministic policy is within the goal threshold at the episode's "
                          "last step; goals relabelled with the env's own compute_reward.")


if __name__ == "__main__":
    main()
