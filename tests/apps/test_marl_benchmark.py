"""benchmarks/marl.py --device: the CPU path of both sides at a tiny budget, and clear errors
for devices this machine does not have (the CUDA path itself needs a GPU)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

_BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "marl.py"
TINY = ["--envs", "4", "--frames", "40", "--epochs", "1", "--minibatch", "20", "--iters", "1"]


def _load():
    spec = importlib.util.spec_from_file_location("marl_benchmark", _BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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
