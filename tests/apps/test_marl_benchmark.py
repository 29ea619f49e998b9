"""benchmarks/marl.py --device: the CPU path of both sides at a tiny budget, and clear errors
for devices this machine does not have (the CUDA path itself needs a GPU)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

_BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "marl.py"
TINY = ["--envs", "4", "--frames", "40", "--epochs", "1", "--minibatch", "20", "--iters", "1"]


def _load():
    """The module read afresh (it reads TDRL_BENCHMARL_PYTHON at import)."""
    return importlib.reload(importlib.import_module("benchmarks.marl"))


def test_tdrl_side_runs_on_the_cpu_device(capsys):
    bench = _load()
    bench.main(["--side", "tdrl", "--device", "cpu", *TINY])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["frames"] == 40 and out["wall_s"] > 0 and out["cpu_s"] > 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_a_gpu_and_unknown_devices_are_refused():
    bench = _load()
    with pytest.raises(SystemExit, match="CUDA is not available.*--device cpu"):
        bench.main(["--side", "tdrl", "--device", "cuda", *TINY])
    with pytest.raises(SystemExit, match="must be cpu or cuda"):
        bench.main(["--side", "tdrl", "--device", "tpu", *TINY])


@pytest.mark.skipif(not _load().BENCHMARL_PY.exists(), reason="no .venv-benchmarl (benchmarks/setup_benchmarl.sh)")
def test_benchmarl_side_receives_the_device():
    bench = _load()
    args = bench.argparse.Namespace(envs=4, frames=40, epochs=1, minibatch=20, iters=1, profile=False, device="cpu",
                                    task="navigation")
    out = bench._benchmarl_subprocess(args, seed=0)
    assert out["frames"] == 40 and out["wall_s"] > 0


def test_benchmarl_python_override(monkeypatch):
    """TDRL_BENCHMARL_PYTHON (a command on PATH or a path) replaces .venv-benchmarl's python;
    a missing one is refused with a message that names the variable."""
    monkeypatch.delenv("TDRL_BENCHMARL_PYTHON", raising=False)
    assert _load().BENCHMARL_PY.parts[-3:] == (".venv-benchmarl", "bin", "python")
    monkeypatch.setenv("TDRL_BENCHMARL_PYTHON", "sh")
    assert str(_load().BENCHMARL_PY) == shutil.which("sh")
    monkeypatch.setenv("TDRL_BENCHMARL_PYTHON", "/nonexistent/python")
    bench = _load()
    assert str(bench.BENCHMARL_PY) == "/nonexistent/python"
    with pytest.raises(SystemExit, match="/nonexistent/python is missing.*TDRL_BENCHMARL_PYTHON"):
        bench.main(["--device", "cpu", *TINY])


def test_benchmarl_side_gets_only_its_own_pythonpath(tmp_path, monkeypatch):
    """The BenchMARL subprocess never inherits this process's PYTHONPATH (this tree's tdrl /
    tensordict): its PYTHONPATH is the repository root (for ``-m benchmarks.<name>``; no tdrl
    package is under it) and TDRL_BENCHMARL_PYTHONPATH, when set, which is used."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "probe_site_module.py").write_text("WHERE = 'override site'\n")
    probe = tmp_path / "probe.py"
    probe.write_text("import json, os, sys\n"
                     "try:\n    import probe_site_module as m; where = m.WHERE\n"
                     "except ImportError:\n    where = None\n"
                     "print(json.dumps({'PYTHONPATH': os.environ.get('PYTHONPATH'), 'where': where,"
                     " 'threads': os.environ['OMP_NUM_THREADS']}))\n")
    bench = _load()
    monkeypatch.setenv("PYTHONPATH", "/parent/tree/src")
    monkeypatch.delenv("TDRL_BENCHMARL_PYTHONPATH", raising=False)

    def probe_run():
        out = subprocess.run([sys.executable, str(probe)], capture_output=True, text=True, env=bench.benchmarl_env(),
                             check=True)
        return json.loads(out.stdout)

    root = str(_BENCH.parents[1])
    assert probe_run() == {"PYTHONPATH": root, "where": None, "threads": "1"}
    monkeypatch.setenv("TDRL_BENCHMARL_PYTHONPATH", str(site))
    assert probe_run() == {"PYTHONPATH": os.pathsep.join([root, str(site)]), "where": "override site", "threads": "1"}
