"""apps/ppo: the --tiny run CI does (CSV, PNG, summary, checkpoint), config overrides,
reward scaling, and the command line itself."""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from _load import REPO, load_app, read_rows  # noqa: E402
from tdrl.core.train import read_sweep  # noqa: E402


@pytest.fixture(scope="module")
def ppo():
    return load_app("ppo")


def test_config_overrides_recipes_and_bad_values(ppo):
    cfg = ppo.main.load([
        "env_id=Pendulum-v1", "total_frames=4096", "hidden=[32,16]", "anneal_lr=false", "norm_obs=true",
        "lr=1e-4",
    ])
    assert cfg.env_id == "Pendulum-v1" and cfg.total_frames == 4096
    assert cfg.hidden == (32, 16) and cfg.anneal_lr is False and cfg.norm_obs is True
    assert cfg.lr == pytest.approx(1e-4) and cfg.norm_reward is None  # untouched default
    tiny = ppo.main.load(["seed=3"], recipe="tiny")
    assert (tiny.total_frames, tiny.num_steps, tiny.seed) == (256, 16, 3)
    half = ppo.main.load(["lr=1e-3"], recipe="halfcheetah")  # the flag wins over the recipe
    assert half.env_id == "HalfCheetah-v5" and half.num_steps == 256 and half.lr == pytest.approx(1e-3)
    with pytest.raises(ValueError, match="less than one batch"):
        ppo.Config(total_frames=10, num_envs=8, num_steps=128)
    for bad, key in (("lr=-1", "lr"), ("epochs=0", "epochs"), ("minibatch_size=100", "minibatch_size"),
                     ("gamma=1.5", "gamma")):
        with pytest.raises(ValueError, match=key):
            ppo.main.load([bad])


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
    cfg = ppo.main.load([f"env_id={env_id}", f"out={tmp_path}", "gae_backend=torch"], recipe="tiny")
    summary = ppo.train(cfg)
    rows = read_rows(tmp_path / "metrics.csv")
    train_rows = [r for r in rows if r["loss_objective"]]
    assert len(train_rows) == 2 and int(float(rows[-1]["frames"])) == summary["frames"] == 256
    assert "env_id: " + env_id in (tmp_path / "config.yaml").read_text()
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
        [sys.executable, str(REPO / "apps" / "ppo" / "train.py"), "--config-name", "tiny", f"out={tmp_path}",
         "gae_backend=torch", "seed=3"],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "eval return" in proc.stderr  # the run's log records
    assert (tmp_path / "metrics.csv").exists() and (tmp_path / "learning_curve.png").exists()


def test_resume_continues_from_the_last_checkpoint(ppo, tmp_path):
    """A run interrupted after its first checkpoint resumes there: the checkpoint holds the
    model, optimiser, collector, normalisers, history and RNG; the CSV keeps each step once;
    TensorBoard events are written when asked. On the torch Pendulum (its state travels in
    the TensorDict) the resumed run ends with the same weights as the uninterrupted one."""
    from tdrl.core.train import load_checkpoint

    kw = ["env_id=tdrl/Pendulum", "gae_backend=torch", "tensorboard=true"]
    full = tmp_path / "full"
    ppo.train(ppo.main.load([*kw, f"out={full}"], recipe="tiny"))
    ckpt = load_checkpoint(full / "checkpoints" / "step_128.pt")
    assert set(ckpt["objects"]) == {"actor", "critic", "optim", "collector", "obs_norm",
                                    "scaler", "env_rng", "history"}
    assert ckpt["extra"]["step"] == ckpt["objects"]["collector"]["frames"] == 128
    assert ckpt["extra"]["iteration"] == 1 and "torch" in ckpt["rng"]
    assert list((full / "tensorboard").glob("events.out.tfevents.*"))
    part = tmp_path / "part"  # "interrupted" after step 128: its checkpoint and the CSV so far
    (part / "checkpoints").mkdir(parents=True)
    shutil.copy(full / "checkpoints" / "step_128.pt", part / "checkpoints")
    shutil.copy(full / "metrics.csv", part / "metrics.csv")
    summary = ppo.train(ppo.main.load([*kw, f"out={part}", "resume=true"], recipe="tiny"))
    assert summary["frames"] == 256 and summary["iterations"] == 2 and summary["out"] == str(part)
    rows = read_rows(part / "metrics.csv")
    assert [r["step"] for r in rows] == ["128", "256", "256"]  # 2 iterations + final eval
    assert [float(r["iteration"]) for r in rows[:2]] == [1.0, 2.0]
    assert rows[:2] == [{**r, "time_s": rows[i]["time_s"], "fps": rows[i]["fps"]}
                        for i, r in enumerate(read_rows(full / "metrics.csv")[:2])]
    wa = torch.load(full / "model.pt", weights_only=True)
    wb = torch.load(part / "model.pt", weights_only=True)
    for key in ("actor", "critic"):
        assert all(torch.equal(wa[key][k], wb[key][k]) for k in wa[key]), key
    assert summary["eval_return"] == json.loads((full / "summary.json").read_text())["eval_return"]


def test_rerun_without_resume_never_deletes(ppo, tmp_path):
    """A second run into a folder that holds a run goes to a new numbered folder beside it;
    the first run's files are untouched."""
    out = tmp_path / "run"
    ppo.train(ppo.main.load([f"out={out}", "gae_backend=torch"], recipe="tiny"))
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    again = ppo.train(ppo.main.load([f"out={out}", "gae_backend=torch", "seed=1"], recipe="tiny"))
    assert again["out"] == str(tmp_path / "run-1") and (tmp_path / "run-1" / "summary.json").exists()
    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before


def test_two_seed_sweep(ppo, tmp_path):
    """``-m seed=0,1`` runs two jobs, each in its own folder, and lists them in sweep.jsonl
    (the app's ``main`` with the command line's arguments, in this process)."""
    results = ppo.main(["-cn", "tiny", f"out={tmp_path}", "gae_backend=torch", "-m", "seed=0,1"])
    assert len(results) == 2
    sweep = read_sweep(tmp_path)
    assert [job["overrides"][-1] for job in sweep] == ["seed=0", "seed=1"]
    for k in (0, 1):
        cfg = (tmp_path / f"seed={k}" / "config.yaml").read_text()
        assert f"seed: {k}" in cfg and (tmp_path / f"seed={k}" / "summary.json").exists()
    assert sweep[0]["result"]["eval_return"] != sweep[1]["result"]["eval_return"] or \
        (tmp_path / "seed=0" / "metrics.csv").read_text() != (tmp_path / "seed=1" / "metrics.csv").read_text()


def test_bad_values_fail_before_any_work(ppo, tmp_path, capsys):
    """An impossible value, an unknown key or a wrong type ends the program with a message
    naming the key, and nothing is written (the app's ``main`` with the command line's
    arguments, in this process; ``test_command_line_tiny`` runs the script itself)."""
    for bad, expect in (("minibatch_size=100", "minibatch_size"), ("foo=1", "foo"), ("lr=abc", "lr")):
        with pytest.raises(SystemExit) as info:
            ppo.main([f"out={tmp_path / 'x'}", bad])
        err = capsys.readouterr().err
        assert info.value.code not in (0, None) and expect in err, (bad, err[-1000:])
        assert not (tmp_path / "x" / "config.yaml").exists()
