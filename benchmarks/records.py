"""Machine-readable benchmark records: one JSON object per measured row.

A benchmark calls :func:`write_record` for each row it measures; the record lands in
``benchmarks/results/<section>.jsonl`` (one line per row), replacing the earlier record of the
same ``(section, table, row)``: the files hold today's figures, git holds their history.
``benchmarks/make_results.py`` turns the files into the tables of ``benchmarks/RESULTS.md``.

Fields of a record:

- ``section``: the RESULTS.md section (``"Replay buffers"``); ``table``: the table inside it;
  ``row``: what was measured (``"sample 256 from the full 1M storage"``);
- ``figures``: ``{column: value}`` in display order (numbers or short strings);
- ``peer``: what the row is compared with, if anything; ``ratio``: the comparison, as text;
- ``command``: the exact command that produced the figures; ``date``: when (UTC, ISO);
  ``machine``: where (``"shared 2-core CPU box"``); ``note``: one optional sentence.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["BENCHMARKS", "ROOT", "RESULTS_DIR", "module_command", "subprocess_env", "FIELDS", "read_records", "record_path", "remove_records", "write_record", "this_command"]

BENCHMARKS = Path(__file__).resolve().parent
"""This folder (the ``benchmarks`` package)."""
ROOT = BENCHMARKS.parent
"""The repository root: the benchmarks run from it as ``python -m benchmarks.<name>``."""
RESULTS_DIR = BENCHMARKS / "results"
FIELDS = ("section", "table", "row", "figures", "peer", "ratio", "command", "date", "machine", "note")


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def record_path(section: str, results_dir: Path | None = None) -> Path:
    """The ``.jsonl`` file that holds a section's records."""
    return Path(results_dir or RESULTS_DIR) / f"{_slug(section)}.jsonl"


def this_command() -> str:
    """The command line that runs this process, as it runs from a checkout's root: a benchmark
    is written as its module (``python -m benchmarks.x``, however it was started), another
    script by its path from the root."""
    exe = os.path.relpath(sys.executable) if ".venv" in sys.executable else "python"
    argv = list(sys.argv)
    if argv and argv[0].endswith(".py"):
        script = Path(argv[0]).resolve()
        if script.parent == BENCHMARKS:
            argv[0:1] = ["-m", f"benchmarks.{script.stem}"]
        elif script.is_relative_to(ROOT):
            argv[0] = script.relative_to(ROOT).as_posix()
    return shlex.join([exe, *argv])


def module_command(python: str, module: str, *args: str) -> list[str]:
    """``python -m <module> args``: how a benchmark starts a side of itself in a subprocess
    (``module`` is the caller's ``__spec__.name``); run it with :func:`subprocess_env`."""
    return [str(python), "-m", module, *map(str, args)]


def subprocess_env(env: dict | None = None) -> dict:
    """``env`` (this process's by default) with the repository root first on ``PYTHONPATH``,
    so ``python -m benchmarks.<name>`` imports from any working folder."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def this_machine() -> str:
    """A short description of this machine: CPU count and processor (or the GPU name)."""
    return f"{os.cpu_count()}-core {platform.machine()} {platform.system()}"


def cpu_model() -> str:
    """The processor's name (``/proc/cpuinfo``'s model name; the architecture elsewhere): the
    2-core boxes have been AMD EPYC and Intel Xeon, whose figures differ."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def _numbered_lines(path: Path):
    """``(line number, line)`` of every non-blank line of ``path`` (none when it does not exist)."""
    if path.exists():
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                yield n, line


def read_records(path: Path) -> list[dict[str, Any]]:
    """The records of one ``.jsonl`` file (empty when it does not exist)."""
    out = []
    for n, line in _numbered_lines(path):
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{n}: not a JSON record ({exc})") from exc
    return out


def read_keyed(path: Path, key: Callable[[dict], str], what: str) -> dict[str, dict]:
    """The JSON lines of ``path`` (none if it does not exist) as ``{key(row): row}``, later lines
    winning; a line that is not a ``what`` record (not JSON, or ``key`` raises ``KeyError`` /
    ``TypeError`` / ``ValueError``) stops the run naming its line."""
    rows: dict[str, dict] = {}
    for n, line in _numbered_lines(path):
        try:
            row = json.loads(line)
            rows[key(row)] = row
        except (ValueError, KeyError, TypeError) as err:
            raise SystemExit(f"{path}:{n}: not a {what} record ({err}); fix or remove the line.")
    return rows


def write_record(
    section: str,
    table: str,
    row: str,
    figures: Mapping[str, Any],
    *,
    peer: str | None = None,
    ratio: str | None = None,
    command: str | None = None,
    date: str | None = None,
    machine: str | None = None,
    note: str | None = None,
    results_dir: Path | None = None,
) -> dict[str, Any]:
    """Store one measured row, replacing an earlier record of the same (section, table, row).

    Args:
        section, table, row: where the row goes in RESULTS.md.
        figures: the measured values, ``{column: value}``, in the order they are shown.
        peer, ratio: what it is compared with and the comparison (text, e.g. ``"x4.04"``).
        command: the exact command (default: this process's command line).
        date: UTC time of the measurement (default: now).
        machine: where it ran (default: CPU count and architecture of this machine).
        note: one optional sentence shown under the table.
        results_dir: where the ``.jsonl`` files live (default ``benchmarks/results``).

    Returns:
        The record written.
    """
    if not figures:
        raise ValueError(f"record {section!r} / {table!r} / {row!r} has no figures")
    record = {
        "section": section,
        "table": table,
        "row": row,
        "figures": dict(figures),
        "peer": peer,
        "ratio": ratio,
        "command": command or this_command(),
        "date": date or _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine or this_machine(),
        "note": note,
    }
    path = record_path(section, results_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    records = read_records(path)
    key = (section, table, row)
    for i, old in enumerate(records):
        if (old["section"], old["table"], old["row"]) == key:
            records[i] = record  # same place in its table: the row order stays stable
            break
    else:
        records.append(record)
    _write(path, records)
    return record


def remove_records(
    section: str,
    table: str,
    rows: Sequence[str] | None = None,
    *,
    results_dir: Path | None = None,
) -> int:
    """Delete the records of one table (all of them, or only the named ``rows``): the supported
    way to retire a superseded table or row (git keeps its history).

    Returns:
        How many records were removed.
    """
    path = record_path(section, results_dir)
    records = read_records(path)
    keep = [r for r in records if not (r["section"] == section and r["table"] == table
                                       and (rows is None or r["row"] in rows))]
    if len(keep) != len(records):
        _write(path, keep)
    return len(records) - len(keep)


def _write(path: Path, records: list[dict]) -> None:
    """The records file: one JSON object per line."""
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
