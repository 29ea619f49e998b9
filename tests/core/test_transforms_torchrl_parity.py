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
    if kind == "crop":  # TorchRL's Crop calls torchvision, which cannot sit beside the CPU torch here
        pytest.importorskip("torchvision")
    mine, theirs, td, keys = same_input(kind)
    a, b = mine(td.clone()), theirs(td.clone())
    for key in keys:
        assert a[key].shape == b[key].shape, (kind, a[key].shape, b[key].shape)
        torch.testing.assert_close(a[key], b[key].to(a[key].dtype), msg=kind)


def echo_env(k=3, bound=1.0, shape=None):
    """A deterministic Gymnasium env (the observation is the action just taken; the reset one is
    fixed and negative), so both libraries' wrappers see the same trajectory: their env seeding
    differs (TorchRL's ``set_seed(0)`` does not reset with seed 0)."""
    import gymnasium as gym
    import numpy as np

    class Echo(gym.Env):
        observation_space = gym.spaces.Box(-10.0, 10.0, (k,), np.float32)
        action_space = gym.spaces.Box(-bound, bound, shape or (k,), np.float32)

        def reset(self, seed=None, options=None):
            super().reset(seed=seed)
            return np.linspace(-0.9, -0.1, k).astype(np.float32), {}

        def step(self, action):
            a = np.asarray(action, np.float32).reshape(k)
            return a.copy(), float(a.sum()), False, False, {}

    return Echo()


def drive(env, actions):
    """The observations ``o_0 .. o_T`` of ``env`` stepped with ``actions``."""
    td = env.reset()
    out = [td["observation"].clone()]
    for a in actions:
        td["action"] = a
        td = env.step(td)
        out.append(td["next", "observation"].clone())
        td = td["next"].clone()
    return torch.stack(out)


def random_actions(n=8, k=3):
    g = torch.Generator().manual_seed(0)
    return [torch.rand(k, generator=g) * 2 - 1 for _ in range(n)]


def test_crop_is_torchvision_s_crop_by_hand():
    """What TorchRL 0.14's Crop computes, ``torchvision.transforms.functional.crop(img, top, left,
    self.w, self.h)`` (torchvision's order is height then width: ``w`` counts rows, although the
    docstring says width): ``img[..., top:top + w, left:left + h]``, checked by hand where
    torchvision is absent."""
    mine, _, td, _ = same_input("crop")
    torch.testing.assert_close(mine(td.clone())["pixels"], td["pixels"][..., 50:250, 10:110])


def test_action_discretizer_sends_torchrl_s_values():
    # TorchRL's spec for one action dim is MultiCategorical of shape (1,), tdrl's Categorical
    # of shape () (DIFFERENCES): the same index, in each one's shape
    a = drive(rl.TransformedEnv(rl_gym.GymWrapper(echo_env(1, 2.0)), rl_t.ActionDiscretizer(5)),
              [torch.tensor([i]) for i in range(5)])
    b = drive(ours.TransformedEnv(GymWrapper(echo_env(1, 2.0)), ours.ActionDiscretizer(5)),
              [torch.tensor(i) for i in range(5)])
    torch.testing.assert_close(b, a)
    assert b[1:].squeeze(-1).tolist() == pytest.approx([-1.6, -0.8, 0.0, 0.8, 1.6], abs=1e-6)
    for name in ("LOW", "HIGH"):
        strategy = getattr(rl_t.ActionDiscretizer.SamplingStrategy, name)
        a = drive(rl.TransformedEnv(rl_gym.GymWrapper(echo_env(2, 2.0)), rl_t.ActionDiscretizer(4, sampling=strategy)),
                  [torch.tensor([i, 3 - i]) for i in range(4)])
        b = drive(ours.TransformedEnv(GymWrapper(echo_env(2, 2.0)), ours.ActionDiscretizer(4, sampling=strategy)),
                  [torch.tensor([i, 3 - i]) for i in range(4)])
        torch.testing.assert_close(b, a, msg=name)


def test_flatten_action_same_trajectory():
    actions = list(torch.linspace(-1, 1, 24).reshape(4, 6))  # the policy's flat actions
    a = drive(rl.TransformedEnv(rl_gym.GymWrapper(echo_env(6, shape=(2, 3))), rl_t.FlattenAction(-2, -1)), actions)
    b = drive(ours.TransformedEnv(GymWrapper(echo_env(6, shape=(2, 3))), ours.FlattenAction(-2, -1)), actions)
    torch.testing.assert_close(b, a)
    torch.testing.assert_close(b[1:], torch.stack(actions))


def test_time_max_pool_equal_once_the_window_is_full():
    actions = random_actions()
    a = drive(rl.TransformedEnv(rl_gym.GymWrapper(echo_env()), rl_t.TimeMaxPool(in_keys=["observation"], T=3)), actions)
    b = drive(ours.TransformedEnv(GymWrapper(echo_env()), ours.TimeMaxPool(in_keys=["observation"], T=3)), actions)
    torch.testing.assert_close(b[2:], a[2:])  # the max over the last 3 observations
    # DIFFERENCES: TorchRL's window starts as zeros, so before it fills a negative observation
    # reads 0; tdrl's is the max over the observations seen so far
    raw = torch.stack([torch.tensor([-0.9, -0.5, -0.1]), *actions])
    torch.testing.assert_close(a[:2], torch.stack([raw[0].clamp_min(0), raw[:2].max(0).values.clamp_min(0)]))
    torch.testing.assert_close(b[:2], torch.stack([raw[0], raw[:2].max(0).values]))


def test_vecnorm_with_decay_same_trajectory():
    import warnings

    actions = random_actions(12)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TorchRL 0.14 announces VecNorm's successor
        a = drive(rl.TransformedEnv(rl_gym.GymWrapper(echo_env()), rl_t.VecNorm(in_keys=["observation"], decay=0.9)), actions)
    b = drive(ours.TransformedEnv(GymWrapper(echo_env()), ours.VecNorm(in_keys=["observation"], decay=0.9)), actions)
    torch.testing.assert_close(b, a)
