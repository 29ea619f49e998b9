"""Import an app's script as a module (apps are scripts, not packages)."""

from __future__ import annotations

import csv
import importlib.util
import sys
from pathlib import Path

from tdrl.core.cli import load_app  # noqa: F401 - the one home; tests import it from here

REPO = Path(__file__).resolve().parents[2]


def read_rows(path: Path) -> list[dict]:
    """The rows of a CSV file as dicts."""
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def load_example(name: str):
    """``apps/examples/<name>.py`` imported as a module (the peers' ported quick starts)."""
    path = REPO / "apps" / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_tdrl_example_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
