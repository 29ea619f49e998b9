"""Record a finished ``apps/dreamer`` learning run in RESULTS.md (section "Single-agent results").

Reads the run folder's ``summary.json`` and ``metrics.csv``, copies its learning curve to
``benchmarks/results/dreamer_<task>.png`` and writes one record with the final evaluation,
the best evaluation during training, and the random policy's return measured in the same run.

    python -m benchmarks.record_dreamer RUN_FOLDER --command "the training command(s)"
    python -m benchmarks.make_results
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
from pathlib import Path
from benchmarks.records import RESULTS_DIR, write_record


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--command", required=True, help="the exact training command(s)")
    ap.add_argument("--note", default=None)
    args = ap.parse_args()
    summary = json.loads((args.run / "summary.json").read_text())
    with open(args.run / "metrics.csv", newline="") as fh:
        evals = [(float(r["step"]), float(r["eval_return"])) for r in csv.DictReader(fh) if r.get("eval_return")]
    task = summary["env_id"].split("/", 1)[-1]
    png = RESULTS_DIR / f"dreamer_{task.replace('-', '_')}.png"
    shutil.copy(args.run / "learning_curve.png", png)
    best_step, best = max(evals, key=lambda e: e[1])
    write_record(
        "Single-agent results", "DreamerV3 on DeepMind Control (states, CPU)", f"DreamerV3 {task} seed 0",
        {"agent steps": summary["frames"], "updates": summary["updates"],
         f"eval ({summary['eval_episodes']} episodes)": round(summary["eval_return"], 1),
         "best eval during training": f"{best:.1f} at {int(best_step)}",
         "random policy": round(summary["random_return"], 1),
         "wall time": f"{summary['time_s'] / 60:.0f} min"},
        command=args.command, machine="shared 2-core CPU box (one torch thread)",
        note=args.note or f"curve: benchmarks/results/{png.name}; eval = deterministic policy, fresh "
                          "episodes; random policy = uniform actions, measured at the start of the same run.")


if __name__ == "__main__":
    main()
