"""benchmarks/gpu_check.sh, gpu_marl.sh (the prepared device-machine checks) and make_devwheels.sh:
valid bash, and without CUDA gpu_marl.sh skips cleanly (exit 0, says so, installs nothing)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

_ROOT = Path(__file__).resolve().parents[2]
_SCRIPTS = ["gpu_check.sh", "gpu_marl.sh", "gpu_steps.sh", "make_devwheels.sh"]


@pytest.mark.parametrize("name", _SCRIPTS)
def test_scripts_parse(name):
    out = subprocess.run(["bash", "-n", str(_ROOT / "benchmarks" / name)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the script would run the GPU steps")
def test_gpu_marl_skips_without_cuda(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable}  # this torch: no CUDA
    out = subprocess.run(["bash", str(_ROOT / "benchmarks" / "gpu_marl.sh")], capture_output=True, text=True,
                         env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    summary = (tmp_path / "summary.txt").read_text()
    assert "no CUDA device" in summary and "SKIPPED" in summary
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.txt"]  # no install, no step logs
