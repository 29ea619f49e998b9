"""Data contract: a tdrl rollout has the same keys, shapes and dtypes as a TorchRL rollout of
the same env (runs where TorchRL is installed, e.g. .venv-bench; skipped elsewhere)."""

from __future__ import annotations

import pytest
import torch

torchrl_envs = pytest.importorskip("torchrl.envs")

from tdrl.core.envs import GymEnv  # noqa: E402


# TorchRL reads a vector env's ``info`` dict into extra keys; tdrl does not read infos.
_INFO = {"x_position", "x_velocity", "reward_forward", "reward_ctrl"}


def _signature(td) -> dict:
    return {k: (tuple(td.get(k).shape), td.get(k).dtype)
            for k in td.keys(include_nested=True, leaves_only=True)
            if (k if isinstance(k, str) else k[-1]) not in _INFO}


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1", "HalfCheetah-v5"])
@pytest.mark.parametrize("num_envs", [None, 2])
def test_rollout_signature_matches_torchrl(env_id, num_envs):
    if num_envs is None:
        ours, theirs = GymEnv(env_id), torchrl_envs.GymEnv(env_id)
    else:
        ours = GymEnv(env_id, num_envs=num_envs)
        theirs = torchrl_envs.GymEnv(env_id, num_envs=num_envs)
    a = ours.rollout(5, break_when_any_done=False)
    b = theirs.rollout(5, break_when_any_done=False)
    assert _signature(a) == _signature(b)
    assert a.batch_size == b.batch_size
    # TorchRL's Bounded is a factory of BoundedContinuous / BoundedDiscrete
    assert type(theirs.action_spec).__name__.startswith(type(ours.action_spec).__name__)
    assert ours.action_spec.dtype == theirs.action_spec.dtype
    ours.close()
    theirs.close()


def test_pendulum_torch_env_keys_cover_torchrl_contract():
    from tdrl.core.envs import PendulumEnv

    r = PendulumEnv((3,)).rollout(4)
    for key in ["observation", "action", "done", "terminated", "truncated",
                ("next", "reward"), ("next", "done")]:
        assert key in r.keys(include_nested=True)
    assert r["next", "reward"].shape == (3, 4, 1) and r["next", "done"].dtype == torch.bool
