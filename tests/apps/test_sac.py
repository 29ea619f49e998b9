"""apps/sac: the --tiny run CI does (MuJoCo default and Pendulum), config, outputs."""

from __future__ import annotations

import csv
import json
import importlib.util
import math
import shutil
import sys
from pathlib import Path

import pytest
import torch

from _load import REPO, load_app, read_rows  # noqa: E402


@pytest.fixture(scope="module")
def sac():
    return load_app("sac")


def test_config_overrides(sac):
    cfg = sac.main.load(["env_id=Pendulum-v1", "utd_ratio=0.5", "hidden=[64,64]"], recipe="tiny")
    assert cfg.env_id == "Pendulum-v1" and cfg.utd_ratio == 0.5
    assert cfg.hidden == (64, 64) and cfg.total_frames == 200  # the flag wins over the recipe
    with pytest.raises(ValueError, match="batch_size"):
        sac.Config(batch_size=10, buffer_size=5)


def test_actor_respects_action_bounds(sac):
    cfg = sac.Config(env_id="Pendulum-v1", hidden=(16,))
    env = sac.env_for(cfg, 2)
    actor, _ = sac.make_actor_critic(env, cfg)
    td = env.reset()
    for p in actor.parameters():  # push the pre-tanh mean far out
        torch.nn.init.constant_(p, 5.0)
    action = actor(td)["action"]
    env.close()
    assert action.shape == (2, 1) and bool((action.abs() <= 2.0).all())


@pytest.mark.parametrize("env_id", ["HalfCheetah-v5", "Pendulum-v1"])
def test_tiny_run_writes_outputs(sac, tmp_path, env_id):
    cfg = sac.main.load([f"env_id={env_id}", f"out={tmp_path}"], recipe="tiny")
    summary = sac.train(cfg)
    with open(tmp_path / "metrics.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    train_rows = [r for r in rows if r.get("loss_qvalue")]
    assert train_rows
    for key in ("loss_actor", "loss_qvalue", "loss_alpha", "alpha", "entropy"):
        assert all(math.isfinite(float(r[key])) for r in train_rows), key
    assert float(train_rows[-1]["alpha"]) < 1.0  # the temperature is being tuned
    assert summary["frames"] == 200 and summary["updates"] == 101
    assert math.isfinite(summary["eval_return"])
    assert (tmp_path / "learning_curve.png").read_bytes()[:4] == b"\x89PNG"
    state = torch.load(tmp_path / "model.pt", weights_only=True)
    assert state["config"]["env_id"] == env_id


def _losses(path: Path) -> dict[float, tuple]:
    """``step -> (loss_actor, loss_qvalue, alpha)`` of the training rows of a metrics CSV."""
    with open(path, newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r.get("loss_qvalue")]
    return {float(r["step"]): (r["loss_actor"], r["loss_qvalue"], r["alpha"]) for r in rows}


def test_resumed_run_is_bit_identical(sac, tmp_path):
    """Interrupt a run after its step-200 checkpoint and resume it: the losses after the
    checkpoint, the CSV and the final weights match the uninterrupted run exactly (the torch
    Pendulum keeps its whole state in the TensorDict; the buffer, collector, optimiser,
    temperature and RNG states come from the checkpoint)."""
    kw = dict(env_id="tdrl/Pendulum", total_frames=300, learning_starts=100, hidden=(16, 16),
              batch_size=64, eval_episodes=2, log_every=20, checkpoint_every=100,
              progress=False, seed=5)
    full = tmp_path / "full"
    sac.train(sac.Config(out=str(full), **kw))
    ckpts = sorted(p.name for p in (full / "checkpoints").glob("*.pt"))
    assert ckpts == ["step_200.pt", "step_300.pt"]  # the last two are kept
    # "interrupted" after step 200: its checkpoint and a CSV with rows past it
    part = tmp_path / "part"
    (part / "checkpoints").mkdir(parents=True)
    shutil.copy(full / "checkpoints" / "step_200.pt", part / "checkpoints")
    shutil.copy(full / "metrics.csv", part / "metrics.csv")
    summary = sac.train(sac.Config(out=str(part), resume=True, **kw))
    assert summary["frames"] == 300 and summary["updates"] == 201
    a, b = _losses(full / "metrics.csv"), _losses(part / "metrics.csv")
    assert a == b and max(a) == 300 and any(step > 200 for step in a)
    with open(part / "metrics.csv", newline="") as fh:
        steps = [float(r["step"]) for r in csv.DictReader(fh)]
    assert len(steps) == len(set(steps)) + 1  # each step once (+ the final evaluation row)
    wa = torch.load(full / "model.pt", weights_only=True)
    wb = torch.load(part / "model.pt", weights_only=True)
    for key in ("actor", "qvalue"):
        assert all(torch.equal(wa[key][k], wb[key][k]) for k in wa[key]), key
    assert summary["eval_return"] == json.loads((full / "summary.json").read_text())["eval_return"]


def test_tiny_redq_run(sac, tmp_path):
    """``algorithm=redq``: an ensemble of 4 critics (stacked), subsets of 2, two updates per
    frame, the actor and temperature stepped on every 4th update (Adam's step counts)."""
    cfg = sac.main.load(["env_id=Pendulum-v1", f"out={tmp_path}", "algorithm=redq",
                         "num_critics=4", "critic_subset=2", "utd_ratio=2", "policy_delay=4"], recipe="tiny")
    summary = sac.train(cfg)
    assert summary["frames"] == 200 and summary["updates"] == 202
    state = torch.load(tmp_path / "model.pt", weights_only=True)
    assert {v.shape[0] for v in state["qvalue"].values()} == {4}  # [num_critics, *shape] stacked
    optim = torch.load(tmp_path / "checkpoints" / "step_200.pt", weights_only=False)["objects"]["optim"]
    groups = [[int(optim["state"][i]["step"]) for i in g["params"]] for g in optim["param_groups"]]
    assert groups == [[202 // 4] * 6, [202] * 6, [202 // 4]]  # actor, critics, temperature
    with open(tmp_path / "metrics.csv", newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r.get("q_std")]
    assert rows and all(math.isfinite(float(r["q_std"])) for r in rows)
    redq = sac.main.load([], recipe="redq")
    assert (redq.algorithm, redq.num_critics, redq.critic_subset, redq.utd_ratio, redq.policy_delay) == (
        "redq", 10, 2, 20, 20)
    for bad in (["algorithm=td4"], ["algorithm=redq", "critic_subset=3", "num_critics=2"], ["policy_delay=0"]):
        with pytest.raises(ValueError, match=bad[-1].split("=")[0]):
            sac.main.load(bad, recipe="tiny")
