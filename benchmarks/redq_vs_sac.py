"""REDQ against SAC at one small frame budget on a MuJoCo task, recorded in RESULTS.md.

Both arms run ``apps/sac`` with the same seed, frames, random warm-up, networks and
evaluation: SAC (2 critics, ``--sac-utd`` gradient steps per frame) and REDQ (``--critics``
critics, target min over a random ``--subset``, ``--redq-utd`` steps per frame: the paper's
claim is that this learns faster per environment frame). Final deterministic evaluation
returns side by side.

    flock /tmp/tdrl-cpu.lock python benchmarks/redq_vs_sac.py --env-id InvertedPendulum-v5 --frames 3000 --record
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from tdrl.core.cli import load_app

SECTION = "Single-agent results"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--env-id", default="InvertedPendulum-v5")
    ap.add_argument("--frames", type=int, default=3000)
    ap.add_argument("--learning-starts", type=int, default=500)
    ap.add_argument("--hidden", default="256,256")
    ap.add_argument("--sac-utd", type=float, default=1.0)
    ap.add_argument("--redq-utd", type=float, default=5.0)
    ap.add_argument("--critics", type=int, default=10)
    ap.add_argument("--subset", type=int, default=2)
    ap.add_argument("--eval-episodes", type=int, default=10)
    ap.add_argument("--arms", default="sac,redq")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="runs/redq_vs_sac")
    ap.add_argument("--record", action="store_true", help="write benchmarks/results/single_agent_results.jsonl")
    args = ap.parse_args()
    torch.set_num_threads(1)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from records import write_record

    sac = load_app("sac")
    hidden = tuple(int(h) for h in args.hidden.split(","))
    arms = {"sac": dict(algorithm="sac", num_critics=2, utd_ratio=args.sac_utd),
            "redq": dict(algorithm="redq", num_critics=args.critics, critic_subset=args.subset,
                         utd_ratio=args.redq_utd)}
    results = {}
    for arm in args.arms.split(","):
        if arm not in arms:
            raise SystemExit(f"--arms: unknown arm {arm!r} (expected sac, redq)")
        cfg = sac.Config(env_id=args.env_id, total_frames=args.frames, learning_starts=args.learning_starts,
                         hidden=hidden, eval_episodes=args.eval_episodes, checkpoint_every=0,
                         progress=False, seed=args.seed, out=str(Path(args.out) / arm), **arms[arm])
        t0 = time.time()
        s = sac.train(cfg)
        results[arm] = (s, time.time() - t0, cfg)
        print(f"[redq_vs_sac] {arm}: eval return {s['eval_return']:.1f}, {s['updates']} updates, "
              f"{results[arm][1]:.0f} s", flush=True)
    if len(results) == 2:
        a, b = results["redq"][0]["eval_return"], results["sac"][0]["eval_return"]
        print(f"[redq_vs_sac] {args.env_id}, {args.frames} frames: REDQ {a:.1f} | SAC {b:.1f} | ratio {a / b:.2f}")
    if not args.record:
        return
    table = (f"REDQ vs SAC on {args.env_id} at {args.frames} frames ({args.learning_starts} random), "
             f"{args.hidden.replace(',', 'x')} nets, seed {args.seed}")
    for arm, (s, secs, cfg) in results.items():
        name = (f"REDQ N={cfg.num_critics} M={cfg.critic_subset} UTD {cfg.utd_ratio:g}" if arm == "redq"
                else f"SAC UTD {cfg.utd_ratio:g}")
        ratio = None
        if arm == "redq" and "sac" in results:
            ratio = f"x{s['eval_return'] / results['sac'][0]['eval_return']:.2f} SAC's return"
        write_record(SECTION, table, name,
                     {f"eval return ({args.eval_episodes} episodes)": round(s["eval_return"], 1),
                      "train (last 5 episodes)": None if s["train_return_last5"] is None
                      else round(s["train_return_last5"], 1),
                      "gradient steps": s["updates"], "CPU s": round(secs)},
                     peer="SAC at the same frames" if arm == "redq" else None, ratio=ratio,
                     note="One seed; both arms share the seed, the random warm-up, the networks and "
                          "the evaluation episodes.")


if __name__ == "__main__":
    main()
