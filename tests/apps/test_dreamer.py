"""apps/dreamer: the tiny recipe CI runs (DMC cartpole-balance), config checks, and resume
(interrupted + resumed == uninterrupted, on the torch Pendulum whose state is checkpointable)."""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from _load import load_app  # noqa: E402

pytest.importorskip("dm_control")


@pytest.fixture(scope="module")
def dreamer():
    return load_app("dreamer")


def test_config_checks(dreamer):
    cfg = dreamer.main.load(["deter=32", "hidden=[8,8]"], recipe="tiny")
    assert cfg.deter == 32 and cfg.hidden == (8, 8) and cfg.total_frames == 120
    if not torch.cuda.is_available():  # the GPU recipe is refused before any work on a CPU machine
        with pytest.raises(ValueError, match="device='cuda', but"):
            dreamer.main.load([], recipe="gpu")
    gpu = dreamer.main.load([] if torch.cuda.is_available() else ["device=cpu"], recipe="gpu")  # model size S
    assert (gpu.deter, gpu.stoch, gpu.classes, gpu.hidden, gpu.batch_size, gpu.seq_len) == (
        512, 32, 32, (512, 512), 16, 64) and gpu.utd_ratio * 16 * 64 == 512
    cpu = dreamer.main.load([], recipe="cartpole_swingup")
    assert cpu.env_id == "dmc/cartpole-swingup" and cpu.total_frames == 16_000
    with pytest.raises(ValueError, match="num_envs"):
        dreamer.Config(num_envs=2)
    with pytest.raises(ValueError, match="seq_len"):
        dreamer.Config(learning_starts=10, seq_len=64)


def test_tiny_run_writes_outputs(dreamer, tmp_path):
    cfg = dreamer.main.load([f"out={tmp_path}"], recipe="tiny")
    summary = dreamer.train(cfg)
    with open(tmp_path / "metrics.csv", newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r.get("loss_decoder")]
    assert rows
    for key in ("loss_decoder", "loss_reward", "loss_cont", "loss_kl", "loss_actor", "loss_critic",
                "return_scale", "entropy"):
        assert all(math.isfinite(float(r[key])) for r in rows), key
    assert float(rows[-1]["loss_kl"]) >= 0.6 - 1e-5  # free bits: at least 0.5 + 0.1 nats
    assert summary["frames"] == 120 and summary["updates"] == 8  # 0.1 per step after 40
    assert math.isfinite(summary["eval_return"]) and summary["random_return"] > 0
    assert (tmp_path / "learning_curve.png").read_bytes()[:4] == b"\x89PNG"
    state = torch.load(tmp_path / "model.pt", weights_only=True)
    assert state["config"]["env_id"] == "dmc/cartpole-balance"


def _losses(path: Path) -> dict[float, tuple]:
    with open(path, newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r.get("loss_decoder")]
    return {float(r["step"]): (r["loss_decoder"], r["loss_actor"], r["loss_critic"]) for r in rows}


def test_resumed_run_is_bit_identical(dreamer, tmp_path):
    """Interrupt after the step-200 checkpoint and resume: losses after it, the CSV and the final
    weights match the uninterrupted run (buffer, optimisers, normaliser, slow critic, the env's
    TensorDict state and the agent's latent, RNG states all come from the checkpoint)."""
    kw = dict(env_id="tdrl/Pendulum", total_frames=300, learning_starts=100, utd_ratio=0.05,
              batch_size=2, seq_len=8, hidden=(16,), deter=16, stoch=4, classes=4, horizon=3,
              log_every=20, checkpoint_every=100, eval_episodes=1, progress=False, seed=3)
    full = tmp_path / "full"
    dreamer.train(dreamer.Config(out=str(full), **kw))
    assert sorted(p.name for p in (full / "checkpoints").glob("*.pt")) == ["step_200.pt", "step_300.pt"]
    part = tmp_path / "part"
    (part / "checkpoints").mkdir(parents=True)
    shutil.copy(full / "checkpoints" / "step_200.pt", part / "checkpoints")
    shutil.copy(full / "metrics.csv", part / "metrics.csv")
    summary = dreamer.train(dreamer.Config(out=str(part), resume=True, **kw))
    assert summary["frames"] == 300 and summary["updates"] == 10
    a, b = _losses(full / "metrics.csv"), _losses(part / "metrics.csv")
    assert a == b and any(step > 200 for step in a)
    wa = torch.load(full / "model.pt", weights_only=True)["agent"]
    wb = torch.load(part / "model.pt", weights_only=True)["agent"]
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    full_summary = json.loads((full / "summary.json").read_text())
    assert summary["eval_return"] == full_summary["eval_return"]
    assert summary["random_return"] == full_summary["random_return"]
