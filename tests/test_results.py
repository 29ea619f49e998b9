"""benchmarks/RESULTS.md is generated from the records in benchmarks/results/*.jsonl.

A record added or changed without rerunning ``benchmarks/make_results.py`` (or a hand edit of
RESULTS.md) fails here; so does a record without its command or date.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def _check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmarks.make_results", "--check", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


def test_results_md_is_up_to_date_with_the_records():
    proc = _check()
    assert proc.returncode == 0, proc.stderr + "\nrun: python -m benchmarks.make_results"


def test_every_record_has_its_figures_command_date_and_machine():
    sections = {s["section"] for s in json.loads((RESULTS / "sections.json").read_text(encoding="utf-8"))}
    paths = sorted(RESULTS.glob("*.jsonl"))
    assert paths, "no records in benchmarks/results"
    for path in paths:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            record = json.loads(line)
            where = f"{path.name}:{n}"
            assert record["section"] in sections, f"{where}: unknown section {record['section']!r}"
            assert record["figures"], f"{where}: no figures"
            for field in ("table", "row", "command", "date", "machine"):
                assert record.get(field), f"{where}: no {field}"
            assert record["date"][:4].isdigit(), f"{where}: date {record['date']!r} is not ISO"


def test_check_fails_when_a_record_changes(tmp_path):
    results = tmp_path / "results"
    shutil.copytree(RESULTS, results)
    out = tmp_path / "RESULTS.md"
    shutil.copy(ROOT / "benchmarks" / "RESULTS.md", out)
    assert _check("--results-dir", str(results), "--out", str(out)).returncode == 0
    from benchmarks.records import write_record
    write_record("Replay buffers", "Replay buffer calls, 1M-slot storages", "a new row", {"tdrl us": 1.0},
                 command="python -m benchmarks.replay", results_dir=results)
    proc = _check("--results-dir", str(results), "--out", str(out))
    assert proc.returncode == 1 and "out of date" in proc.stderr
    subprocess.run([sys.executable, "-m", "benchmarks.make_results", "--results-dir", str(results), "--out", str(out)], check=True,
                   capture_output=True, cwd=ROOT)
    text = out.read_text(encoding="utf-8")
    assert "| a new row | 1.0 |" in text and "`python -m benchmarks.replay`" in text
    assert _check("--results-dir", str(results), "--out", str(out)).returncode == 0


def test_write_record_replaces_the_same_row(tmp_path):
    from benchmarks.records import read_records, record_path, write_record
    write_record("S", "T", "r1", {"ms": 1.0}, command="c", results_dir=tmp_path)
    write_record("S", "T", "r2", {"ms": 2.0}, command="c", results_dir=tmp_path)
    write_record("S", "T", "r1", {"ms": 3.0}, command="c", results_dir=tmp_path)
    records = read_records(record_path("S", tmp_path))
    assert [(r["row"], r["figures"]["ms"]) for r in records] == [("r1", 3.0), ("r2", 2.0)]


def test_remove_records_drops_one_table_or_named_rows(tmp_path):
    from benchmarks.records import read_records, record_path, remove_records, write_record
    for table, row in [("T", "r1"), ("T", "r2"), ("U", "r1"), ("T", "r3")]:
        write_record("S", table, row, {"ms": 1.0}, command="c", results_dir=tmp_path)
    assert remove_records("S", "T", ["r2", "absent"], results_dir=tmp_path) == 1
    assert [(r["table"], r["row"]) for r in read_records(record_path("S", tmp_path))] == [
        ("T", "r1"), ("U", "r1"), ("T", "r3")]
    assert remove_records("S", "T", results_dir=tmp_path) == 2
    assert [(r["table"], r["row"]) for r in read_records(record_path("S", tmp_path))] == [("U", "r1")]
    assert remove_records("S", "nothing", results_dir=tmp_path) == 0
