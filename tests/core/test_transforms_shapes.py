"""SqueezeTransform, PermuteTransform, BinarizeReward and Crop (TorchRL's names), hand-checked
on a real env and on the collector's fast path."""

from __future__ import annotations

import pytest
import torch

from tdrl.core.collectors import Collector
from tdrl.core.envs import GymEnv
from tdrl.core.transforms import (
    BinarizeReward,
    Compose,
    Crop,
    PermuteTransform,
    SqueezeTransform,
    ToTensorImage,
    TransformedEnv,
    UnsqueezeTransform,
)


def test_squeeze_undoes_unsqueeze_and_refuses_a_dim_of_another_size():
    env = TransformedEnv(GymEnv("Pendulum-v1"), Compose(UnsqueezeTransform(-2), SqueezeTransform(-2)))
    env.set_seed(0)
    plain = GymEnv("Pendulum-v1")
    plain.set_seed(0)
    torch.testing.assert_close(env.reset()["observation"], plain.reset()["observation"])
    assert env.observation_spec["observation"].shape == (3,)
    with pytest.raises(ValueError, match="size 3, not 1"):
        TransformedEnv(GymEnv("Pendulum-v1"), SqueezeTransform(-1)).reset()
    with pytest.raises(ValueError, match="negative dim"):
        SqueezeTransform(0)


def test_permute_moves_channels_first_on_a_render():
    env = TransformedEnv(GymEnv("CartPole-v1", from_pixels=True), PermuteTransform((-1, -3, -2), in_keys=["pixels"]))
    raw = GymEnv("CartPole-v1", from_pixels=True)
    env.set_seed(1)
    raw.set_seed(1)
    out, ref = env.reset()["pixels"], raw.reset()["pixels"]
    assert out.shape == (3, 400, 600) and env.observation_spec["pixels"].shape == (3, 400, 600)
    assert torch.equal(out[2, 10, 20], ref[10, 20, 2])  # channel c, row y, column x
    with pytest.raises(ValueError, match="permutation"):
        PermuteTransform((-1, -1, -2))


def test_binarize_reward_on_the_fast_path():
    env = TransformedEnv(GymEnv("Pendulum-v1"), BinarizeReward())  # rewards are <= 0: all 0
    batch = next(iter(Collector(env, None, frames_per_batch=20, total_frames=20)))
    assert batch["next", "reward"].eq(0).all()
    env = TransformedEnv(GymEnv("CartPole-v1"), BinarizeReward())  # +1 per step: all 1
    batch = next(iter(Collector(env, None, frames_per_batch=20, total_frames=20)))
    assert batch["next", "reward"].eq(1).all() and env.full_reward_spec["reward"].high.max() == 1


def test_crop_keeps_the_window_it_names():
    env = TransformedEnv(GymEnv("CartPole-v1", from_pixels=True), Compose(ToTensorImage(), Crop(100, 200, top=50, left=10)))
    raw = GymEnv("CartPole-v1", from_pixels=True)
    env.set_seed(2)
    raw.set_seed(2)
    out, ref = env.reset()["pixels"], raw.reset()["pixels"]
    assert out.shape == (3, 100, 200) == env.observation_spec["pixels"].shape
    torch.testing.assert_close(out, ref[50:150, 10:210].permute(2, 0, 1).float() / 255)
    with pytest.raises(ValueError, match="leaves the image"):
        TransformedEnv(GymEnv("CartPole-v1", from_pixels=True), Compose(ToTensorImage(), Crop(500))).reset()
