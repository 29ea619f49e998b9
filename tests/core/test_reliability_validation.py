"""Invalid settings are refused before any work, with a message naming the value;
checkpoints survive interrupted saves and truncated files."""

from __future__ import annotations

import math
import os

import pytest
import torch

from tdrl.core.envs import GymEnv, PendulumEnv
from tdrl.core.train.checkpoint import Checkpointer, save_checkpoint
from tdrl.core.values.functional import gae


def _inputs(T: int, batch=(3,)):
    g = torch.Generator().manual_seed(0)
    shape = (*batch, T, 1)
    r, v, nv = (torch.randn(shape, generator=g) for _ in range(3))
    done = torch.rand(shape, generator=g) < 0.2
    return r, v, nv, done, done & (torch.rand(shape, generator=g) < 0.5)


@pytest.mark.parametrize("backend", ["auto", "torch", "kernels"])
@pytest.mark.parametrize("gamma,lmbda,bad", [(1.5, 0.9, "gamma"), (0.9, -1.0, "lmbda"),
                                             (math.nan, 0.9, "gamma"), (0.9, 1.0001, "lmbda")])
def test_gae_refuses_discounts_outside_unit_interval(backend, gamma, lmbda, bad):
    with pytest.raises(ValueError, match=f"{bad} must lie in \\[0, 1\\]"):
        gae(*_inputs(4), gamma, lmbda, backend=backend)


def test_gae_kernels_entry_point_refuses_too():
    from tdrl.kernels import gae as kernels_gae

    with pytest.raises(ValueError, match="gamma must lie in"):
        kernels_gae(*_inputs(4), 1.5, 0.9)
    with pytest.raises(ValueError, match="lmbda must lie in"):
        kernels_gae(*_inputs(4), 0.9, torch.tensor([-1.0]))
    adv, target = kernels_gae(*_inputs(4), 1.0, 0.0)  # the bounds themselves are fine
    assert adv.shape == (3, 4, 1)


@pytest.mark.parametrize("backend", ["auto", "torch", "kernels"])
def test_gae_with_no_time_steps_gives_empty_tensors(backend):
    adv, target = gae(*_inputs(0, batch=(2, 5)), 0.99, 0.95, backend=backend)
    assert adv.shape == target.shape == (2, 5, 0, 1)
    from tdrl.kernels import gae as kernels_gae

    adv, target = kernels_gae(*_inputs(0), 0.99, 0.95)
    assert adv.shape == target.shape == (3, 0, 1)


def test_pendulum_refuses_an_action_of_another_shape():
    env = PendulumEnv(batch_size=(4,))
    td = env.reset()
    td["action"] = torch.zeros(4, 3)
    with pytest.raises(ValueError, match=r"expects an action of shape \(4, 1\).*got \(4, 3\)"):
        env.step(td)
    single = PendulumEnv()
    td = single.reset()
    td["action"] = torch.zeros(4, 3)
    with pytest.raises(ValueError, match=r"shape \(1,\).*got \(4, 3\)"):
        single.step(td)
    td["action"] = torch.zeros(1)
    assert single.step(td)["next", "observation"].shape == (3,)


@pytest.mark.parametrize("n", [0, -2])
def test_gym_env_refuses_num_envs_below_one(n):
    with pytest.raises(ValueError, match=f"num_envs must be an int >= 1.*got {n}"):
        GymEnv("CartPole-v1", num_envs=n)


def test_interrupted_save_tmp_files_are_removed_by_the_next_save(tmp_path):
    ckpt = Checkpointer(tmp_path, keep=3)
    stale = tmp_path / ".step_2.pt.abc123.tmp"  # what a save killed mid-write leaves
    stale.write_bytes(b"half a checkpoint")
    other = tmp_path / ".notes.txt.tmp"  # not ours: kept
    other.write_text("x")
    ckpt.save(2, extra={"a": 1})
    assert not stale.exists() and other.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".notes.txt.tmp", "step_2.pt", "step_2.pt.sha256"]
    stale2 = tmp_path / ".model.pt.q9.tmp"
    stale2.write_bytes(b"")
    save_checkpoint(tmp_path / "model.pt", {"w": torch.ones(2)})
    assert not stale2.exists()


def test_truncated_latest_checkpoint_falls_back_to_the_previous(tmp_path):
    model = torch.nn.Linear(2, 2)
    ckpt = Checkpointer(tmp_path, keep=3)
    with torch.no_grad():
        model.weight.fill_(1.0)
    ckpt.save(1, model=model, extra={"tag": "one"})
    with torch.no_grad():
        model.weight.fill_(2.0)
    ckpt.save(2, model=model, extra={"tag": "two"})
    latest = tmp_path / "step_2.pt"
    os.truncate(latest, latest.stat().st_size // 2)
    fresh = torch.nn.Linear(2, 2)
    with pytest.warns(RuntimeWarning, match="step_2.pt does not load"):
        out = ckpt.load(model=fresh)
    assert out == {"step": 1, "extra": {"tag": "one"}}
    assert (fresh.weight == 1.0).all()
    # an explicit path does not fall back; nothing loadable at all raises naming the files
    with pytest.raises(Exception):
        ckpt.load(latest, model=fresh)
    os.truncate(tmp_path / "step_1.pt", 10)
    with pytest.warns(RuntimeWarning), pytest.raises(RuntimeError, match="step_2.pt.*step_1.pt"):
        ckpt.load(model=fresh)
