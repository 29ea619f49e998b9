"""apps/dqn: the --tiny run CI does (plain and dueling), config overrides, outputs."""

from __future__ import annotations

import csv
import importlib.util
import math
import sys
from pathlib import Path

import pytest
import torch

from _load import REPO, load_app, read_rows  # noqa: E402


@pytest.fixture(scope="module")
def dqn():
    return load_app("dqn")


def test_config_overrides(dqn):
    cfg = dqn.main.load(["dueling=true", "double_dqn=false", "hidden=[32,32]", "eps_end=0.1",
                         "total_frames=1000"])
    assert cfg.dueling and not cfg.double_dqn and cfg.hidden == (32, 32)
    assert cfg.eps_end == pytest.approx(0.1) and cfg.total_frames == 1000
    with pytest.raises(ValueError, match="exploration_fraction"):
        dqn.Config(exploration_fraction=0.0)
    for bad in ("num_envs=0", "batch_size=0", "utd_ratio=-1", "lr=0", "checkpoint_every=-5"):
        with pytest.raises(ValueError, match=bad.split("=")[0]):
            dqn.main.load([bad])


@pytest.mark.parametrize("dueling", [False, True])
def test_tiny_run_writes_outputs(dqn, tmp_path, dueling):
    torch.manual_seed(0)
    cfg = dqn.main.load([f"dueling={dueling}", f"out={tmp_path}"], recipe="tiny")
    env = dqn.env_for(cfg, 1)
    init = {k: v.clone() for k, v in dqn.make_qnet(env, cfg).state_dict().items()}
    env.close()
    summary = dqn.train(cfg)
    with open(tmp_path / "metrics.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    train_rows = [r for r in rows if r.get("loss_qvalue")]
    assert train_rows and all(math.isfinite(float(r["loss_qvalue"])) for r in train_rows)
    assert float(rows[0]["epsilon"]) > float(rows[-2]["epsilon"])  # annealed
    steps_learning = (400 - 100) // cfg.num_envs + 1  # vector steps from learning_starts on
    assert summary["frames"] == 400
    assert summary["updates"] == int(cfg.utd_ratio * cfg.num_envs) * steps_learning
    assert (tmp_path / "learning_curve.png").read_bytes()[:4] == b"\x89PNG"
    state = torch.load(tmp_path / "model.pt", weights_only=True)["qnet"]
    assert state.keys() == init.keys()
    assert any(not torch.equal(state[k], init[k]) for k in init)  # it trained


def test_resume_restores_buffer_and_schedules(dqn, tmp_path):
    """Resuming from the step-200 checkpoint restores the replay buffer, the epsilon
    schedule, the target-update counter and the loop counters, and ends where an
    uninterrupted run ends."""
    from tdrl.core.train import load_checkpoint

    cfg = dqn.main.load([f"out={tmp_path}"], recipe="tiny")
    full = dqn.train(cfg)
    state = load_checkpoint(tmp_path / "checkpoints" / "step_200.pt")
    assert {"loss", "optim", "buffer", "collector", "explore", "budget", "history"} <= set(state["objects"])
    assert int(state["objects"]["explore"]["frames"]) == 200
    assert state["objects"]["budget"]["updates"] == int(0.5 * 4) * ((200 - 100) // 4 + 1)
    (tmp_path / "checkpoints" / "step_400.pt").unlink()
    resumed = dqn.train(dqn.main.load([f"out={tmp_path}", "resume=true"], recipe="tiny"))
    assert resumed["frames"] == full["frames"] == 400
    assert resumed["updates"] == full["updates"]
    with open(tmp_path / "metrics.csv", newline="") as fh:
        steps = [float(r["step"]) for r in csv.DictReader(fh)]
    assert steps == sorted(steps) and len(steps) == len(set(steps)) + 1  # + final evaluation
