"""Generate ``benchmarks/RESULTS.md`` from the records in ``benchmarks/results/*.jsonl``.

    python -m benchmarks.make_results           # rewrite RESULTS.md
    python -m benchmarks.make_results --check   # exit 1 if RESULTS.md differs from the records

Sections come in the order of ``benchmarks/results/sections.json`` (each with a short intro:
what is measured and how fairly); inside a section, tables and rows keep the order of their
records. Every row shows its date and a numbered reference to its command (listed under the
table with the machine it ran on). A benchmark adds or refreshes its rows with
``benchmarks/records.py``'s ``write_record``; this script only formats them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from benchmarks.records import RESULTS_DIR, read_records  # a script beside records.py

RESULTS_MD = Path(__file__).resolve().parent / "RESULTS.md"

_HEADER = """\
# Benchmark results

Today's figures, one row per measurement, each with its date and the exact command that
produced it. This file is generated: `python -m benchmarks.make_results` writes it from the
records in `benchmarks/results/*.jsonl` (one JSON object per row, written by the benchmarks
through `benchmarks/records.py`); do not edit it by hand. Earlier figures, and the sessions'
notes on what changed, live in the git history of this file and of the records.
"""


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _table(records: list[dict[str, Any]]) -> list[str]:
    columns: list[str] = []
    for r in records:
        columns += [c for c in r["figures"] if c not in columns]
    has_peer = any(r.get("peer") for r in records)
    has_ratio = any(r.get("ratio") for r in records)
    commands: list[tuple[str, str]] = []
    for r in records:
        key = (r["command"], r.get("machine") or "")
        if key not in commands:
            commands.append(key)
    head = ["", *columns] + (["peer"] if has_peer else []) + (["ratio"] if has_ratio else []) + ["date", "cmd"]
    numeric = [all(_is_number(r["figures"].get(c)) or r["figures"].get(c) is None for r in records)
               for c in columns]
    align = ["---"] + ["---:" if n else "---" for n in numeric] + ["---"] * (len(head) - 1 - len(columns))
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join(align) + " |"]
    for r in records:
        cells = [_cell(r["row"]), *(_cell(r["figures"].get(c)) for c in columns)]
        if has_peer:
            cells.append(_cell(r.get("peer")))
        if has_ratio:
            cells.append(_cell(r.get("ratio")))
        n = commands.index((r["command"], r.get("machine") or "")) + 1
        cells += [_cell(r["date"]), f"[{n}]"]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    notes = []
    for r in records:
        if r.get("note") and r["note"] not in notes:
            notes.append(r["note"])
    lines += [*notes, ""] if notes else []
    for n, (command, machine) in enumerate(commands, 1):
        where = f" ({machine})" if machine else ""
        lines.append(f"- [{n}]{where}: `{command}`")
    lines.append("")
    return lines


def render(results_dir: Path = RESULTS_DIR) -> str:
    """RESULTS.md's text from the records and ``sections.json`` in ``results_dir``."""
    sections = json.loads((results_dir / "sections.json").read_text(encoding="utf-8"))
    records = [r for path in sorted(results_dir.glob("*.jsonl")) for r in read_records(path)]
    known = {s["section"] for s in sections}
    unknown = sorted({r["section"] for r in records} - known)
    if unknown:
        raise ValueError(f"records name sections missing from sections.json: {unknown}; add them there")
    out = [_HEADER]
    for section in sections:
        mine = [r for r in records if r["section"] == section["section"]]
        out += [f"## {section['section']}", "", section["intro"].strip(), ""]
        tables: list[str] = []
        for r in mine:
            if r["table"] not in tables:
                tables.append(r["table"])
        for table in tables:
            out += [f"### {table}", ""]
            out += _table([r for r in mine if r["table"] == table])
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if RESULTS.md is not up to date")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR, help="where the records are")
    parser.add_argument("--out", type=Path, default=RESULTS_MD, help="the Markdown file to write or check")
    args = parser.parse_args(argv)
    text = render(args.results_dir)
    if args.check:
        current = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
        if current != text:
            print(f"{args.out} is out of date with {args.results_dir}/*.jsonl: "
                  f"run python -m benchmarks.make_results", file=sys.stderr)
            return 1
        print(f"{args.out} is up to date")
        return 0
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
