"""Collector hot path: the plain-dict policy call, GymEnv's "any done" hint (and its absence
behind transforms), no aliasing between batches, same data as a hand-written loop."""

from __future__ import annotations

import gc

import gymnasium as gym
import numpy as np
import torch
from tensordict.nn import TensorDictModule

from tdrl.core.collectors import Collector
from tdrl.core.envs import GymEnv
from tdrl.core.transforms import StepCounter, TransformedEnv


def _policy(seed: int = 0) -> TensorDictModule:
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(3, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    return TensorDictModule(net, ["observation"], ["action"])


def test_batches_equal_a_hand_written_gymnasium_loop():
    """Same seed, same policy: observations, actions, rewards and flags are the raw loop's."""
    policy = _policy()
    col = Collector(GymEnv("Pendulum-v1"), policy, frames_per_batch=150, seed=7)
    batches = [next(iter(col)) for _ in range(2)]  # 300 steps: one truncation at 200
    raw = gym.make("Pendulum-v1")
    obs, _ = raw.reset(seed=7)
    rows = []
    with torch.no_grad():
        for _ in range(300):
            act = policy.module(torch.as_tensor(obs)).numpy()
            nobs, rew, term, trunc, _ = raw.step(act)
            rows.append((obs, act, nobs, rew, term, trunc))
            obs = raw.reset()[0] if term or trunc else nobs
    got = torch.cat(batches, 0)
    np.testing.assert_allclose(got["observation"].numpy(), np.stack([r[0] for r in rows]), rtol=1e-6)
    np.testing.assert_allclose(got["action"].numpy(), np.stack([r[1] for r in rows]), rtol=1e-6)
    np.testing.assert_allclose(got["next", "observation"].numpy(), np.stack([r[2] for r in rows]),
                               rtol=1e-6)
    np.testing.assert_allclose(got["next", "reward"].numpy()[:, 0], [r[3] for r in rows], rtol=1e-6)
    assert got["next", "truncated"][:, 0].tolist() == [bool(r[5]) for r in rows]
    ids = got["collector", "traj_ids"]
    assert ids[:200].unique().tolist() == [0] and ids[200:].unique().tolist() == [1]


def test_a_batch_does_not_change_when_the_next_one_is_collected():
    col = Collector(GymEnv("Pendulum-v1", num_envs=2), _policy(), frames_per_batch=64, seed=0)
    it = iter(col)
    first = next(it)
    snapshot = first.clone()
    second = next(it)
    assert (first == snapshot).all()
    assert not torch.equal(first["next", "observation"], second["next", "observation"])
    # the next batch starts where the previous one stopped
    assert torch.equal(second["observation"][:, 0], first["next", "observation"][:, -1])


def test_done_hint_is_not_used_behind_transforms():
    """StepCounter truncates without the Gymnasium env knowing: the collector must see it."""
    env = TransformedEnv(GymEnv("Pendulum-v1"), StepCounter(max_steps=5))
    col = Collector(env, _policy(), frames_per_batch=12)
    batch = next(iter(col))
    assert batch["next", "truncated"][:, 0].nonzero().flatten().tolist() == [4, 9]
    assert batch["collector", "traj_ids"].tolist() == [0] * 5 + [1] * 5 + [2] * 2
    assert batch["step_count"][:, 0].tolist() == [0, 1, 2, 3, 4] * 2 + [0, 1]


def test_policy_fast_path_falls_back_and_reports_missing_keys():
    col = Collector(GymEnv("Pendulum-v1"),
                    TensorDictModule(torch.nn.Linear(3, 1), ["not_there"], ["action"]),
                    frames_per_batch=4)
    try:
        next(iter(col))
    except KeyError as err:
        assert "not_there" in str(err)
    else:  # pragma: no cover
        raise AssertionError("a missing policy input key must raise")


def test_gc_state_is_restored_after_a_batch():
    col = Collector(GymEnv("Pendulum-v1"), _policy(), frames_per_batch=8)
    assert gc.isenabled()
    next(iter(col))
    assert gc.isenabled()
    gc.disable()
    try:
        next(iter(col))
        assert not gc.isenabled()  # a user's choice is kept
    finally:
        gc.enable()
