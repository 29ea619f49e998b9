"""Import an app's script as a module (apps are scripts, not packages)."""

from __future__ import annotations

import csv
import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def load_app(name: str, script: str = "train.py"):
    """``apps/<name>/<script>`` imported as the module ``_tdrl_app_<name>``."""
    spec = importlib.util.spec_from_file_location(f"_tdrl_app_{name}", REPO / "apps" / name / script)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def read_rows(path: Path) -> list[dict]:
    """The rows of a CSV file as dicts."""
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))
