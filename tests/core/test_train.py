"""Loggers, progress bar, atomic checkpoints and exact resume."""

from __future__ import annotations

import io
import os
import random

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from tdrl.core.modules import MLP
from tdrl.core.train import (
    Checkpointer,
    CSVLogger,
    ProgressBar,
    TensorboardLogger,
    WandbLogger,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)


def test_csv_logger_widens_and_resumes(tmp_path):
    with CSVLogger(tmp_path, "exp") as log:
        log.log_metrics({"reward": 1.5, "loss": torch.tensor(0.25)}, step=0)
        log.log_scalar("reward", 2.0, step=10)
        log.log_metrics({"entropy": 0.5}, step=20)  # new column: the file is widened
        log.log_hparams({"lr": 3e-4, "env": "CartPole-v1"})
    data = CSVLogger(tmp_path, "exp").read()
    assert data["step"] == [0.0, 10.0, 20.0]
    assert data["reward"][:2] == [1.5, 2.0] and np.isnan(data["reward"][2])
    assert data["loss"][0] == 0.25 and data["entropy"][2] == 0.5
    resumed = CSVLogger(tmp_path, "exp")
    resumed.log_metrics({"reward": 3.0}, step=30)
    resumed.close()
    assert CSVLogger(tmp_path, "exp").read()["reward"][-1] == 3.0
    assert (tmp_path / "exp" / "hparams.json").exists()


def test_csv_logger_logs_a_tensors_mean_and_rejects_empty_ones(tmp_path):
    with CSVLogger(tmp_path, "exp") as log:
        log.log_metrics({"x": torch.tensor([1.0, 2.0, 6.0])}, step=0)  # TorchRL's SAC: episode returns
        with pytest.raises(ValueError, match="Only scalars"):
            log.log_metrics({"x": torch.ones(0)}, step=1)
    assert CSVLogger(tmp_path, "exp").read()["x"] == [3.0]


def test_csv_logger_leaves_out_a_none_value(tmp_path):
    """TorchRL's SAC script logs tqdm's rate, None before tqdm's first interval: nothing to log."""
    with CSVLogger(tmp_path, "exp") as log:
        log.log_metrics({"time/speed": None, "reward": 2.0}, step=0)
        log.log_metrics({"time/speed": 410.0, "reward": 3.0}, step=1)
    data = CSVLogger(tmp_path, "exp").read()
    assert data["reward"] == [2.0, 3.0] and np.isnan(data["time/speed"][0]) and data["time/speed"][1] == 410.0


def test_tensorboard_logger_writes_events(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log = TensorboardLogger(tmp_path, "tb")
    for step in range(3):
        log.log_scalar("train/reward", float(step), step)
    log.close()
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert [e.value for e in acc.Scalars("train/reward")] == [0.0, 1.0, 2.0]


def test_wandb_logger_clear_error_without_wandb():
    import importlib.util

    if importlib.util.find_spec("wandb") is not None:
        pytest.skip("wandb is installed")
    with pytest.raises(ImportError, match="pip install wandb"):
        WandbLogger(project="x")


def test_progress_bar_shows_live_metrics():
    out = io.StringIO()
    with ProgressBar(total=100, desc="train", file=out, mininterval=0) as bar:
        bar.update(50, reward=torch.tensor(12.3456), loss=0.5)
        bar.update(50)
    text = out.getvalue()
    assert "reward=12.35" in text and "loss=0.5" in text and "100/100" in text


def test_save_is_atomic_and_loads_weights_only(tmp_path):
    path = tmp_path / "ckpt.pt"
    state = {"td": TensorDict(a=torch.ones(2, 3), batch_size=[2]), "np": np.arange(4),
             "size": torch.Size([2, 3]), "n": 3, "s": "x", "none": None, "t": (1, 2.0)}
    save_checkpoint(path, state)
    loaded = load_checkpoint(path)
    assert isinstance(loaded["td"], TensorDict) and loaded["td"].batch_size == (2,)
    np.testing.assert_array_equal(loaded["np"], np.arange(4))
    assert loaded["size"] == torch.Size([2, 3]) and loaded["t"] == (1, 2.0)
    # a failing save leaves the previous checkpoint untouched and no temporary file
    with pytest.raises(TypeError, match="Cannot checkpoint"):
        save_checkpoint(path, {"bad": object()})
    assert load_checkpoint(path)["n"] == 3
    assert sorted(os.listdir(tmp_path)) == ["ckpt.pt", "ckpt.pt.sha256"]  # the file and its checksum
    # the file itself is loadable by torch with weights_only=True
    torch.load(path, weights_only=True)


def test_rng_state_round_trip():
    state = rng_state()
    a = (random.random(), np.random.rand(), torch.rand(1).item(), np.random.randn())
    set_rng_state(state)
    b = (random.random(), np.random.rand(), torch.rand(1).item(), np.random.randn())
    assert a == b


def _make_run(seed):
    from tdrl.core.replay import LazyTensorStorage, ReplayBuffer

    torch.manual_seed(seed)
    model = MLP(3, 1, num_cells=(16,))
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    buffer = ReplayBuffer(storage=LazyTensorStorage(64), batch_size=16)
    return model, optim, buffer


def _train(model, optim, buffer, steps):
    losses = []
    for _ in range(steps):
        # data from torch, numpy and python RNGs, so all three must be restored
        x = torch.randn(8, 3) + float(np.random.rand()) + random.random()
        buffer.extend(TensorDict(x=x, y=x.sum(-1, keepdim=True), batch_size=[8]))
        batch = buffer.sample()
        loss = (model(batch["x"]) - batch["y"]).pow(2).mean()
        optim.zero_grad()
        loss.backward()
        optim.step()
        losses.append(loss.item())
    return losses


def test_resumed_run_is_bit_identical(tmp_path):
    def seed_all(s):
        torch.manual_seed(s)
        np.random.seed(s)
        random.seed(s)

    seed_all(0)
    run = _make_run(0)
    full = _train(*run, steps=20)

    seed_all(0)
    model, optim, buffer = _make_run(0)
    first = _train(model, optim, buffer, steps=10)
    ckpt = Checkpointer(tmp_path, keep=2)
    ckpt.save(10, model=model, optim=optim, buffer=buffer, extra={"losses": first})

    seed_all(123)  # a fresh process: other weights, other RNG streams
    model2, optim2, buffer2 = _make_run(123)
    info = ckpt.load(model=model2, optim=optim2, buffer=buffer2)
    assert info["step"] == 10 and info["extra"]["losses"] == first
    rest = _train(model2, optim2, buffer2, steps=10)
    assert first + rest == full  # bit for bit


def test_checkpointer_keeps_the_last_k_and_reports_missing(tmp_path):
    model = MLP(2, 1, num_cells=(4,))
    ckpt = Checkpointer(tmp_path, keep=2)
    for step in (1, 2, 3):
        ckpt.save(step, model=model)
    assert [p.name for p in ckpt.checkpoints()] == ["step_2.pt", "step_3.pt"]
    with pytest.raises(KeyError, match="no state for"):
        ckpt.load(optim=torch.optim.SGD(model.parameters(), lr=1.0))
    with pytest.raises(FileNotFoundError):
        Checkpointer(tmp_path / "empty").load(model=model)
