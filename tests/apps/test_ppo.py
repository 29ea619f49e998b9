"""apps/ppo: the --tiny run CI does (CSV, PNG, summary, checkpoint), config overrides,
reward scaling, and the command line itself."""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]


def load_app(name: str):
    """Import ``apps/<name>/train.py`` as a module (apps are scripts, not packages)."""
    spec = importlib.util.spec_from_file_location(f"_tdrl_app_{name}", REPO / "apps" / name / "train.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def read_rows(path: Path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.fixture(scope="module")
def ppo():
    return load_app("ppo")


def test_parse_config_overrides(ppo):
    cfg = ppo.parse_config(ppo.Config, [
        "--env_id", "Pendulum-v1", "--total_frames", "4096", "--hidden", "32", "16",
        "--no-anneal_lr", "--norm_obs", "--lr", "1e-4",
    ])
    assert cfg.env_id == "Pendulum-v1" and cfg.total_frames == 4096
    assert cfg.hidden == (32, 16) and cfg.anneal_lr is False and cfg.norm_obs is True
    assert cfg.lr == pytest.approx(1e-4) and cfg.norm_reward is None  # untouched default
    with pytest.raises(ValueError, match="less than one batch"):
        ppo.Config(total_frames=10, num_envs=8, num_steps=128)


def test_return_scaler_matches_running_std(ppo):
    """Rewards are divided by the running std of the discounted return (CleanRL)."""
    torch.manual_seed(0)
    scaler = ppo.ReturnScaler(num_envs=3, gamma=0.9)
    rewards = torch.randn(50, 3, 1)
    done = torch.zeros(50, 3, 1, dtype=torch.bool)
    done[20, 1] = True
    returns, ret = [], torch.zeros(3, 1, dtype=torch.float64)
    for t in range(50):
        out = scaler(rewards[t], done[t])
        ret = ret * 0.9 + rewards[t].double()
        returns.append(ret.clone())
        ret = ret.masked_fill(done[t], 0.0)
        allret = torch.cat(returns).flatten()
        # the first update blends with the prior (mean 0, var 1, count 1e-4): negligible
        assert torch.allclose(out, (rewards[t] / allret.var(unbiased=False).sqrt()).float(),
                              rtol=1e-3)


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_tiny_run_writes_outputs(ppo, tmp_path, env_id):
    cfg = ppo.Config(env_id=env_id, tiny=True, out=str(tmp_path), gae_backend="torch")
    summary = ppo.train(cfg)
    rows = read_rows(tmp_path / "metrics.csv")
    train_rows = [r for r in rows if r["loss_objective"]]
    assert len(train_rows) == 2 and int(float(rows[-1]["frames"])) == summary["frames"] == 256
    for key in ("loss_objective", "loss_critic", "kl_approx", "clip_fraction", "explained_variance"):
        assert all(math.isfinite(float(r[key])) for r in train_rows), key
    assert math.isfinite(float(rows[-1]["eval_return"]))
    assert (tmp_path / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((tmp_path / "summary.json").read_text())["eval_return"] == summary["eval_return"]
    state = torch.load(tmp_path / "model.pt", weights_only=True)
    assert state["config"]["env_id"] == env_id
    assert (state["obs_norm"] is not None) == (env_id == "Pendulum-v1")  # continuous: normalised
    # --eval_only re-evaluates the last checkpoint (actor + observation statistics)
    again = ppo.evaluate_checkpoint(cfg)
    assert again["frames"] == 256 and again["eval_return"] == summary["eval_return"]


def test_command_line_tiny(tmp_path):
    env = {**os.environ, "MUJOCO_GL": "egl"}
    proc = subprocess.run(
        [sys.executable, str(REPO / "apps" / "ppo" / "train.py"), "--tiny", "--out", str(tmp_path),
         "--gae_backend", "torch", "--seed", "3"],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "eval return" in proc.stdout
    assert (tmp_path / "metrics.csv").exists() and (tmp_path / "learning_curve.png").exists()


def test_resume_continues_from_the_last_checkpoint(ppo, tmp_path):
    """A run interrupted after its first checkpoint resumes there: the checkpoint holds the
    model, optimiser, collector, normalisers, history and RNG; the CSV keeps each step once;
    TensorBoard events are written when asked."""
    from tdrl.core.train import load_checkpoint

    kw = dict(env_id="Pendulum-v1", tiny=True, gae_backend="torch", progress=False,
              tensorboard=True, out=str(tmp_path))
    ppo.train(ppo.Config(**kw))
    ckpt = load_checkpoint(tmp_path / "checkpoints" / "step_128.pt")
    assert set(ckpt["objects"]) == {"actor", "critic", "optim", "collector", "obs_norm",
                                    "scaler", "history"}
    assert ckpt["extra"]["frames"] == ckpt["objects"]["collector"]["frames"] == 128
    assert ckpt["extra"]["iteration"] == 1 and "torch" in ckpt["rng"]
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    (tmp_path / "checkpoints" / "step_256.pt").unlink()  # "interrupted" after step 128
    summary = ppo.train(ppo.Config(resume=True, **kw))
    assert summary["frames"] == 256 and summary["iterations"] == 2
    rows = read_rows(tmp_path / "metrics.csv")
    assert [r["step"] for r in rows] == ["128", "256", "256"]  # 2 iterations + final eval
    assert [float(r["iteration"]) for r in rows[:2]] == [1.0, 2.0]
    # a fresh run (no --resume) starts over and clears the old checkpoints
    ppo.train(ppo.Config(**{**kw, "total_frames": 128}))
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_128.pt"]
