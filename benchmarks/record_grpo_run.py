"""Record a finished ``apps/grpo`` run in RESULTS.md (section "LLM (GRPO)").

Reads the run folder's ``summary.json`` and writes one record: held-out accuracy at the start,
after SFT and after GRPO, the train reward (first round / mean of the last 10), and for a
multi-turn tool run the held-out and train tool-call rates and the tool errors counted.

    python -m benchmarks.record_grpo_run RUN_FOLDER --table "..." --row "..." --command "the run's command"
    python -m benchmarks.make_results
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from benchmarks.records import write_record


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--table", required=True)
    ap.add_argument("--row", required=True)
    ap.add_argument("--command", required=True, help="the exact command of the run")
    ap.add_argument("--note", default=None)
    args = ap.parse_args()
    s = json.loads((args.run / "summary.json").read_text())
    figures = {"params": s["params"], "held-out acc. start": s["accuracy_start"],
               "after SFT": s["accuracy_after_sft"], "after GRPO": round(s["accuracy_after_grpo"], 3),
               "train reward first / last 10": f"{s['train_reward_first']:.3f} / {s['train_reward_last10']:.3f}"}
    if "tool_call_rate_after_grpo" in s:
        figures["held-out tool-call rate after SFT / GRPO"] = (
            f"{s['tool_call_rate_after_sft']:.3f} / {s['tool_call_rate_after_grpo']:.3f}")
        figures["train tool-call rate first / last 10"] = (
            f"{s['train_tool_call_rate_first']:.3f} / {s['train_tool_call_rate_last10']:.3f}")
        figures["tool errors"] = ", ".join(f"{k} {int(v)}" for k, v in s["tool_errors"].items() if v)
    figures["wall s"] = round(s["time_s"])
    write_record("LLM (GRPO)", args.table, args.row, figures, command=args.command,
                 machine="shared 2-core CPU box (one torch thread)", note=args.note)


if __name__ == "__main__":
    main()
