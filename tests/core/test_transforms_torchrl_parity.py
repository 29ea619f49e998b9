"""The transforms added for issue 40's second batch, equal to TorchRL 0.14's on the same data: each
one applied by both libraries to the same recorded rollout or the same input TensorDict, or
(transforms that need an env: ActionDiscretizer, FlattenAction, TimeMaxPool, VecNorm) wrapped
around the same Gymnasium env driven by the same actions. Runs where TorchRL is installed
(``/work/venvs/bench``: ``python -m pytest tests/core/test_transforms_torchrl_parity.py``)."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

rl = pytest.importorskip("torchrl.envs")
rl_t = pytest.importorskip("torchrl.envs.transforms")
rl_gym = pytest.importorskip("torchrl.envs.libs.gym")

import tdrl.core.transforms as ours  # noqa: E402
from tdrl.core.envs import GymEnv, GymWrapper  # noqa: E402


def pendulum_rollout(T=12):
    env = GymEnv("Pendulum-v1")
    env.set_seed(0)
    torch.manual_seed(0)
    return env.rollout(T)


def cartpole_pixels():
    env = GymEnv("CartPole-v1", from_pixels=True, pixels_only=True)
    env.set_seed(0)
    return env.reset()["pixels"]  # uint8 [400, 600, 3]


def same_input(kind):
    """(tdrl transform, TorchRL transform, input TensorDict, keys compared)."""
    r = pendulum_rollout()
    if kind == "squeeze":
        td = TensorDict(observation=r["observation"].unsqueeze(-1), batch_size=r.batch_size)
        return ours.SqueezeTransform(-1, in_keys=["observation"]), rl_t.SqueezeTransform(-1, in_keys=["observation"]), td, ["observation"]
    if kind == "permute":
        td = TensorDict(pixels=cartpole_pixels().float(), batch_size=[])
        return (ours.PermuteTransform((-1, -3, -2), in_keys=["pixels"]),
                rl_t.PermuteTransform((-1, -3, -2), in_keys=["pixels"]), td, ["pixels"])
    if kind == "binarize":
        reward = r["next", "reward"] + 8.0  # Pendulum's rewards moved across 0: both signs
        td = TensorDict(reward=reward, batch_size=r.batch_size)
        assert bool((reward > 0).any()) and bool((reward <= 0).any())
        return ours.BinarizeReward(), rl_t.BinarizeReward(), td, ["reward"]
    if kind == "linearise":
        reward = torch.cat([r["next", "reward"], r["observation"]], -1)  # a 4-vector per step
        td = TensorDict(reward=reward, batch_size=r.batch_size)
        w = [1.0, -2.0, 0.5, 3.0]
        return (ours.LineariseRewards(in_keys=["reward"], weights=w),
                rl_t.LineariseRewards(in_keys=["reward"], weights=w), td, ["reward"])
    if kind == "crop":
        td = TensorDict(pixels=cartpole_pixels().permute(2, 0, 1).float() / 255, batch_size=[])
        return (ours.Crop(200, 100, top=50, left=10, in_keys=["pixels"]),
                rl_t.Crop(200, 100, top=50, left=10, in_keys=["pixels"]), td, ["pixels"])
    raise KeyError(kind)


@pytest.mark.parametrize("kind", ["squeeze", "permute", "binarize", "linearise", "crop"])
def test_same_output_on_the_same_tensordict(kind):
    mine, theirs, td, keys = same_input(kind)
    a, b = mine(td.clone()), theirs(td.clone())
    for key in keys:
        assert a[key].shape == b[key].shape, (kind, a[key].shape, b[key].shape)
        torch.testing.assert_close(a[key], b[key].to(a[key].dtype), msg=kind)


class Replay:
    """A policy writing a fixed sequence of actions (the same for both libraries)."""

    def __init__(self, actions):
        self.actions, self.i = actions, 0

    def __call__(self, td):
        td.set("action", self.actions[self.i].clone())
        self.i += 1
        return td


def both_rollouts(make_ours, make_theirs, actions, seed=0):
    env_a, env_b = make_ours(), make_theirs()
    env_a.set_seed(seed)
    env_b.set_seed(seed)
    a = env_a.rollout(len(actions), Replay(actions), break_when_any_done=False)
    b = env_b.rollout(len(actions), Replay(actions), break_when_any_done=False)
    torch.testing.assert_close(a["observation"][0], b["observation"][0].to(a["observation"].dtype))  # same start
    return a, b


def assert_same(a, b, *keys):
    for key in keys:
        torch.testing.assert_close(a[key], b[key].to(a[key].dtype), msg=str(key))


def test_action_discretizer_same_trajectory():
    actions = torch.tensor([0, 4, 2, 1, 3, 4, 4, 0])
    a, b = both_rollouts(lambda: ours.TransformedEnv(GymEnv("Pendulum-v1"), ours.ActionDiscretizer(5)),
                         lambda: rl.TransformedEnv(rl_gym.GymEnv("Pendulum-v1"), rl_t.ActionDiscretizer(5)),
                         actions)
    assert_same(a, b, ("next", "observation"), ("next", "reward"))


def grid_arm():
    import gymnasium as gym
    import numpy as np

    class GridArm(gym.Env):
        observation_space = gym.spaces.Box(-1.0, 1.0, (6,), np.float32)
        action_space = gym.spaces.Box(-1.0, 1.0, (2, 3), np.float32)

        def reset(self, seed=None, options=None):
            super().reset(seed=seed)
            return np.zeros(6, np.float32), {}

        def step(self, action):
            return action.reshape(6).astype(np.float32), float(action[0, 0]), False, False, {}

    return GridArm()


def test_flatten_action_same_trajectory():
    actions = torch.linspace(-1, 1, 24).reshape(4, 6)
    a, b = both_rollouts(lambda: ours.TransformedEnv(GymWrapper(grid_arm()), ours.FlattenAction(-2, -1)),
                         lambda: rl.TransformedEnv(rl_gym.GymWrapper(grid_arm()), rl_t.FlattenAction(-2, -1)),
                         actions)
    assert_same(a, b, ("next", "observation"), ("next", "reward"))


def test_time_max_pool_same_trajectory():
    actions = torch.linspace(-2, 2, 10).unsqueeze(-1)
    a, b = both_rollouts(lambda: ours.TransformedEnv(GymEnv("Pendulum-v1"), ours.TimeMaxPool(in_keys=["observation"], T=3)),
                         lambda: rl.TransformedEnv(rl_gym.GymEnv("Pendulum-v1"), rl_t.TimeMaxPool(in_keys=["observation"], T=3)),
                         actions)
    assert_same(a, b, "observation", ("next", "observation"))


def test_vecnorm_with_decay_same_trajectory():
    import warnings

    actions = torch.linspace(-2, 2, 16).unsqueeze(-1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TorchRL 0.14 announces VecNorm's successor
        a, b = both_rollouts(
            lambda: ours.TransformedEnv(GymEnv("Pendulum-v1"), ours.VecNorm(in_keys=["observation"], decay=0.9)),
            lambda: rl.TransformedEnv(rl_gym.GymEnv("Pendulum-v1"), rl_t.VecNorm(in_keys=["observation"], decay=0.9)),
            actions)
    assert_same(a, b, ("next", "observation"))
