"""Impossible app configs are refused before any work or folder, naming what was wrong and
what to do: an algorithm that cannot act in the env, a device torch cannot use, and any job of
a ``-m`` sweep (checked before the first job trains)."""

from __future__ import annotations

import re

import pytest
import torch

from _load import load_app


@pytest.mark.parametrize("app, overrides, message", [
    ("dqn", ["env_id=Pendulum-v1"], r"'Pendulum-v1' has continuous actions; .*discrete actions only.*sac or ppo"),
    ("sac", ["env_id=CartPole-v1"], r"'CartPole-v1' has discrete actions; .*continuous actions only.*dqn or ppo"),
    ("dqn", ["env_id=NoSuchEnv-v0"], r"env_id='NoSuchEnv-v0' does not make an environment.*doesn't exist"),
    ("ppo", ["device=cudaa"], r"device='cudaa' is not a torch device"),
])
def test_impossible_env_or_device_is_refused_before_the_folder(app, overrides, message, tmp_path, capsys):
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as info:
        load_app(app).main([*overrides, f"out={out}"])
    assert info.value.code == 2
    assert not out.exists() and not list(tmp_path.iterdir())
    assert re.search(message, capsys.readouterr().err)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is visible: device=cuda is allowed")
@pytest.mark.parametrize("app", ["ppo", "grpo"])
def test_cuda_without_a_gpu_is_refused(app, tmp_path, capsys):
    with pytest.raises(SystemExit):
        load_app(app).main(["device=cuda", f"out={tmp_path / 'run'}"])
    assert "device='cuda', but this torch is a CPU build; use device=cpu" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_a_bad_value_in_a_sweep_is_refused_before_the_first_job(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # Hydra's sweep folder would be multirun/ here
    with pytest.raises(SystemExit) as info:
        load_app("dqn").main(["-m", "lr=1e-3,-1", "total_frames=2000", f"out={tmp_path / 'run'}"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "sweep job lr=-1" in err and "lr=-1.0 is not allowed" in err and "no job of the 2 was run" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no multirun/ folder, no run folder
