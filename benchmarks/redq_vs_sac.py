"""REDQ against SAC at one small frame budget on a MuJoCo task, recorded in RESULTS.md.

Both arms run ``apps/sac`` with the same seed, frames, random warm-up, networks and
evaluation: SAC (2 critics, ``--sac-utd`` gradient steps per frame) and REDQ (``--critics``
critics, target min over a random ``--subset``, ``--redq-utd`` steps per frame, the actor and
temperature stepping once per ``--policy-delay`` of them: default the UTD, one policy step per
environment step as in the paper's Algorithm 1; the paper's claim is that this learns faster per
environment frame). Final deterministic evaluation returns side by side, one row per arm and
seed; with ``--record`` a mean row per arm over every seed recorded in the table so far (so the
seeds may run in separate invocations, each one short). ``--arms sac_utd`` adds a control: SAC
(2 critics, an actor step per gradient step) at the REDQ arm's UTD, to tell the ensemble's
share of a gain from the extra gradient steps'.

    flock /tmp/tdrl-cpu.lock python -m benchmarks.redq_vs_sac --env-id InvertedPendulum-v5 --frames 2000 --seeds 0 --record
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from tdrl.core.cli import load_app

SECTION = "Single-agent results"


def _arm_name(arm: str, cfg) -> str:
    if arm == "redq":
        return f"REDQ N={cfg.num_critics} M={cfg.critic_subset} UTD {cfg.utd_ratio:g} policy delay {cfg.policy_delay}"
    return f"SAC UTD {cfg.utd_ratio:g}"


def _record_means(table: str, names: dict[str, str], eval_col: str, results_dir: Path | None) -> None:
    """Re-write each arm's mean row over every per-seed row of ``table`` (kept last); the other
    arms' rows compare with SAC's over the seeds both have."""
    from benchmarks.records import read_records, record_path, remove_records, write_record

    mean_rows = {arm: f"{name}, mean" for arm, name in names.items()}
    remove_records(SECTION, table, list(mean_rows.values()), results_dir=results_dir)
    rows = [r for r in read_records(record_path(SECTION, results_dir)) if r["table"] == table]
    per_seed = {arm: {r["figures"]["seed"]: r["figures"][eval_col] for r in rows
                      if r["row"].startswith(f"{name} (seed ")} for arm, name in names.items()}
    for arm, by_seed in per_seed.items():
        if not by_seed:
            continue
        vals = list(by_seed.values())
        mean = statistics.mean(vals)
        sd = statistics.stdev(vals) if len(vals) > 1 else None
        ratio, common = None, sorted(set(by_seed) & set(per_seed["sac"]))
        if arm != "sac" and common:
            ours, sacs = (sum(d[s] for s in common) / len(common) for d in (by_seed, per_seed["sac"]))
            wins = sum(by_seed[s] > per_seed["sac"][s] for s in common)
            ratio = f"x{ours / sacs:.2f} SAC's mean return; ahead in {wins} of {len(common)} seeds"
        write_record(SECTION, table, mean_rows[arm],
                     {"seed": ",".join(str(s) for s in sorted(by_seed)), eval_col: round(mean, 1),
                      "eval return std over seeds": None if sd is None else round(sd, 1)},
                     peer="SAC at the same frames" if ratio else None, ratio=ratio,
                     command="python -m benchmarks.redq_vs_sac (the mean of this table's per-seed rows)",
                     results_dir=results_dir)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--env-id", default="InvertedPendulum-v5")
    ap.add_argument("--frames", type=int, default=2000)
    ap.add_argument("--learning-starts", type=int, default=500)
    ap.add_argument("--hidden", default="128,128")
    ap.add_argument("--sac-utd", type=float, default=1.0)
    ap.add_argument("--redq-utd", type=int, default=20)
    ap.add_argument("--policy-delay", type=int, default=None,
                    help="REDQ arm's gradient steps per actor step (default: --redq-utd, the paper's cadence)")
    ap.add_argument("--critics", type=int, default=10)
    ap.add_argument("--subset", type=int, default=2)
    ap.add_argument("--eval-episodes", type=int, default=10)
    ap.add_argument("--arms", default="sac,redq",
                    help="of sac, redq and sac_utd (a control: SAC at the REDQ arm's UTD, policy delay 1)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0], help="seeds run one after the other")
    ap.add_argument("--out", default="runs/redq_vs_sac")
    ap.add_argument("--record", action="store_true", help="write benchmarks/results/single_agent_results.jsonl")
    ap.add_argument("--results-dir", default=None, help="where --record writes (default benchmarks/results)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    from benchmarks.records import write_record

    sac = load_app("sac")
    hidden = tuple(int(h) for h in args.hidden.split(","))
    delay = args.redq_utd if args.policy_delay is None else args.policy_delay
    arms = {"sac": dict(algorithm="sac", num_critics=2, utd_ratio=args.sac_utd),
            "redq": dict(algorithm="redq", num_critics=args.critics, critic_subset=args.subset,
                         utd_ratio=args.redq_utd, policy_delay=delay),
            "sac_utd": dict(algorithm="sac", num_critics=2, utd_ratio=args.redq_utd)}
    chosen = args.arms.split(",")
    for arm in chosen:
        if arm not in arms:
            raise SystemExit(f"--arms: unknown arm {arm!r} (expected sac, redq, sac_utd)")
    table = (f"REDQ vs SAC on {args.env_id} at {args.frames} frames ({args.learning_starts} random), "
             f"{args.hidden.replace(',', 'x')} nets")
    eval_col = f"eval return ({args.eval_episodes} episodes)"
    results_dir = Path(args.results_dir) if args.results_dir else None

    def config(arm: str, seed: int):
        return sac.Config(env_id=args.env_id, total_frames=args.frames, learning_starts=args.learning_starts,
                          hidden=hidden, eval_episodes=args.eval_episodes, checkpoint_every=0, progress=False,
                          seed=seed, out=str(Path(args.out) / f"{arm}_seed{seed}"), **arms[arm])

    names = {arm: _arm_name(arm, config(arm, 0)) for arm in arms}
    for seed in args.seeds:
        results = {}
        for arm in chosen:
            cfg = config(arm, seed)
            t0 = time.time()
            s = sac.train(cfg)
            results[arm] = (s, time.time() - t0, cfg)
            print(f"[redq_vs_sac] seed {seed} {arm}: eval return {s['eval_return']:.1f}, {s['updates']} updates, "
                  f"{results[arm][1]:.0f} s", flush=True)
        if "redq" in results and "sac" in results:
            a, b = results["redq"][0]["eval_return"], results["sac"][0]["eval_return"]
            print(f"[redq_vs_sac] {args.env_id}, {args.frames} frames, seed {seed}: REDQ {a:.1f} | SAC {b:.1f} | "
                  f"ratio {a / b:.2f}", flush=True)
        if not args.record:
            continue
        for arm, (s, secs, cfg) in results.items():
            ratio = None
            if arm != "sac" and "sac" in results:
                ratio = f"x{s['eval_return'] / results['sac'][0]['eval_return']:.2f} SAC's return"
            write_record(SECTION, table, f"{names[arm]} (seed {seed})",
                         {"seed": seed, eval_col: round(s["eval_return"], 1),
                          "train (last 5 episodes)": None if s["train_return_last5"] is None
                          else round(s["train_return_last5"], 1),
                          "gradient steps": s["updates"], "CPU s": round(secs)},
                         peer="SAC at the same frames, same seed" if ratio else None, ratio=ratio,
                         results_dir=results_dir,
                         note="Both arms of a seed share the seed, the random warm-up, the networks and the "
                              "evaluation episodes; the mean rows average the per-seed rows above them.")
    if args.record:
        _record_means(table, names, eval_col, results_dir)


if __name__ == "__main__":
    main()
