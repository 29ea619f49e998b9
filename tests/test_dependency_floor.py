"""The packages work at the lower bound of the tensordict range they declare (``>=0.14.3``,
what TorchRL 0.14 pins).

* Fast: every ``from tensordict... import name`` in ``packages/*/src`` names something that
  tensordict 0.14.3 has, per ``tensordict_0_14_3_names.json`` (the ``dir()`` of each module
  tdrl imports, recorded from a real 0.14.3 install). Regenerate it inside a venv holding
  tensordict 0.14.3 (and pytest): ``python tests/test_dependency_floor.py write``.
* Slow: a throwaway venv (no system site-packages) with ``tensordict==0.14.3`` and this
  machine's torch runs the core README's quick start against the checkout's sources. Skipped
  when ``uv`` is missing or the packages cannot be fetched.

The torch floor is the torch this suite runs on (``torch>=2.13``, the CPU wheel the README
installs first): the packages declare no older torch than a test has run (an older CPU
wheel is not on these machines; ``test_the_declared_torch_floor_is_the_tested_torch`` checks it).
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = Path(__file__).with_name("tensordict_0_14_3_names.json")
FLOOR = "0.14.3"


def tensordict_imports(root: Path = ROOT) -> list[tuple[str, str, str]]:
    """``(module, name, "file:line")`` of every ``from tensordict[.sub] import name`` (and
    ``(module, "", where)`` of every ``import tensordict.sub``) in ``packages/*/src``."""
    found = []
    for path in sorted(root.glob("packages/*/src/**/*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            where = f"{path.relative_to(root)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                    and node.module.split(".")[0] == "tensordict":
                found += [(node.module, alias.name, where) for alias in node.names]
            elif isinstance(node, ast.Import):
                found += [(a.name, "", where) for a in node.names if a.name.split(".")[0] == "tensordict"]
    return found


def test_every_tensordict_import_exists_in_the_declared_floor():
    names = json.loads(MANIFEST.read_text(encoding="utf-8"))
    assert names["version"] == FLOOR
    imports = tensordict_imports()
    assert imports, "no tensordict imports found: the scan is broken"
    missing = []
    for module, name, where in imports:
        if module not in names["modules"]:
            missing.append(f"{where}: module {module} is not in the manifest (regenerate it in a "
                           f"tensordict {FLOOR} venv: python tests/test_dependency_floor.py write)")
        elif name and name not in names["modules"][module]:
            found_in = [m for m, members in names["modules"].items() if name in members]
            hint = f"; {FLOOR} has it in {', '.join(found_in)}" if found_in else ""
            missing.append(f"{where}: from {module} import {name}: not in tensordict {FLOOR}{hint}")
    assert not missing, "\n".join(missing)


def test_the_scan_catches_the_import_that_broke_0_14_3(tmp_path):
    src = tmp_path / "packages" / "x" / "src" / "m.py"
    src.parent.mkdir(parents=True)
    src.write_text("from tensordict.nn import (\n    TensorDictModule,\n    interaction_type,\n)\n")
    found = tensordict_imports(tmp_path)
    assert ("tensordict.nn", "interaction_type", "packages/x/src/m.py:1") in found
    names = json.loads(MANIFEST.read_text(encoding="utf-8"))["modules"]
    assert "interaction_type" not in names["tensordict.nn"]
    assert "interaction_type" in names["tensordict.nn.probabilistic"]


def _quick_start() -> str:
    text = (ROOT / "packages" / "core" / "README.md").read_text(encoding="utf-8")
    return re.search(r"```python\n(.*?)```", text, re.S).group(1)


@pytest.mark.slow
def test_the_core_quick_start_runs_with_tensordict_0_14_3(tmp_path):
    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("needs uv to build a throwaway venv")
    import torch

    venv = tmp_path / "venv"
    subprocess.run([uv, "venv", "-q", str(venv), "-p", sys.executable], check=True, timeout=120)
    env = {**os.environ, "VIRTUAL_ENV": str(venv)}
    env.pop("PYTHONPATH", None)
    torch_version = torch.__version__.split("+")[0]  # the machine's torch, never another
    install = subprocess.run(
        [uv, "pip", "install", "-q", f"torch=={torch_version}", f"tensordict=={FLOOR}", "numpy",
         "gymnasium[classic-control]"], env=env, capture_output=True, text=True, timeout=600)
    if install.returncode:
        pytest.skip(f"could not install tensordict {FLOOR} with torch {torch_version}: {install.stderr[-500:]}")
    script = tmp_path / "quick_start.py"
    script.write_text(
        "import tensordict\n"
        f"assert tensordict.__version__ == {FLOOR!r}, tensordict.__version__\n"
        f"assert tensordict.__file__.startswith({str(venv)!r}), tensordict.__file__\n"
        "import tdrl.core.objectives, tdrl.core.modules, tdrl.core.collectors, tdrl.core.train\n"
        + _quick_start())
    paths = [str(ROOT / "packages" / p / "src") for p in ("kernels", "core")]
    run_env = {**env, "PYTHONPATH": os.pathsep.join(paths), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([str(venv / "bin" / "python"), str(script)], env=run_env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "loss_objective" in proc.stdout


def _write_manifest() -> None:
    """Record ``dir()`` of the tensordict modules the packages import (run it in a venv that
    holds tensordict at the floor)."""
    import importlib

    import tensordict

    if tensordict.__version__ != FLOOR:
        raise SystemExit(f"run this in a venv with tensordict {FLOOR}, not {tensordict.__version__}")
    modules = sorted({m for m, _, _ in tensordict_imports()} | {"tensordict.nn.probabilistic"})
    out = {"version": FLOOR, "modules": {m: sorted(dir(importlib.import_module(m))) for m in modules}}
    MANIFEST.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__" and sys.argv[1:] == ["write"]:
    _write_manifest()


def test_the_declared_torch_floor_is_the_tested_torch():
    """Every package's ``torch>=X`` is at most the torch running this suite and no lower than
    the release the suite is run on (2.13): a claimed floor is a tested floor."""
    import tomllib

    import torch

    running = tuple(int(x) for x in re.match(r"(\d+)\.(\d+)", torch.__version__).groups())
    for pyproject in sorted(ROOT.glob("packages/*/pyproject.toml")):
        deps = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["dependencies"]
        floors = [re.match(r"torch>=(\d+)\.(\d+)", d) for d in deps if d.startswith("torch")]
        assert floors and all(floors), f"{pyproject}: torch needs a >= floor, got {deps}"
        floor = tuple(int(x) for x in floors[0].groups())
        assert floor == (2, 13) and floor <= running, f"{pyproject}: torch>={floor} but the suite runs torch {running}"
