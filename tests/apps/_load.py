"""Import an app's script as a module (apps are scripts, not packages)."""

from __future__ import annotations

import csv
from pathlib import Path

from tdrl.core.cli import load_app  # noqa: F401 - the one home; tests import it from here

REPO = Path(__file__).resolve().parents[2]


def read_rows(path: Path) -> list[dict]:
    """The rows of a CSV file as dicts."""
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))
