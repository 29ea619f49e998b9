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


def test_action_discretizer_maps_indices_onto_the_box():
    from tdrl.core import Categorical, MultiCategorical, MultiOneHot
    from tdrl.core.transforms import ActionDiscretizer

    env = TransformedEnv(GymEnv("Pendulum-v1"), ActionDiscretizer(5))  # torque in [-2, 2]
    assert isinstance(env.action_spec, Categorical) and env.action_spec.n == 5
    env.set_seed(0)
    td = env.reset()
    td["action"] = torch.tensor(4)
    out = env.step(td)
    assert torch.equal(out["action"], torch.tensor(4))  # the caller's data keeps the index
    raw = GymEnv("Pendulum-v1")
    raw.set_seed(0)
    ref = raw.reset()
    ref["action"] = torch.tensor([1.6])  # the centre of interval 4 of 5 in [-2, 2] (TorchRL's MEDIAN)
    torch.testing.assert_close(out["next", "observation"], raw.step(ref)["next", "observation"])
    rollout = env.rollout(5)  # random actions drawn from the discrete spec
    assert rollout["action"].dtype == torch.int64 and rollout["action"].max() < 5
    env2 = TransformedEnv(GymEnv("HalfCheetah-v5"), ActionDiscretizer(3))
    assert isinstance(env2.action_spec, MultiCategorical) and env2.action_spec.shape == (6,)
    env3 = TransformedEnv(GymEnv("HalfCheetah-v5"), ActionDiscretizer(3, categorical=False))
    assert isinstance(env3.action_spec, MultiOneHot) and env3.action_spec.shape == (18,)
    assert env3.rollout(3)["next", "reward"].shape == (3, 1)
    with pytest.raises(TypeError, match="Bounded action spec"):
        TransformedEnv(GymEnv("CartPole-v1"), ActionDiscretizer(3))


def test_linearise_rewards_weights_a_reward_vector():
    from tensordict import TensorDict

    from tdrl.core.transforms import LineariseRewards

    t = LineariseRewards(weights=[1.0, -2.0, 0.5])
    td = TensorDict({"reward": torch.tensor([[1.0, 1.0, 2.0], [0.0, 3.0, 4.0]])}, [2])
    assert t(td)["reward"].tolist() == [[0.0], [-4.0]]
    with pytest.raises(ValueError, match="2 weights for a reward of 3"):
        LineariseRewards(weights=[1.0, 2.0])(TensorDict({"reward": torch.ones(3)}, []))



def _grid_arm_env():
    import gymnasium as gym
    import numpy as np

    class GridArm(gym.Env):
        observation_space = gym.spaces.Box(-1.0, 1.0, (6,), np.float32)
        action_space = gym.spaces.Box(-1.0, 1.0, (2, 3), np.float32)

        def reset(self, seed=None, options=None):
            super().reset(seed=seed)
            return np.zeros(6, np.float32), {}

        def step(self, action):
            assert action.shape == (2, 3), action.shape
            return action.reshape(6).astype(np.float32), 0.0, False, False, {}

    from tdrl.core.envs import GymWrapper

    return GymWrapper(GridArm())


def test_flatten_action_restores_the_base_shape_before_the_env_reads_it():
    from tdrl.core.transforms import FlattenAction

    env = TransformedEnv(_grid_arm_env(), FlattenAction(-2, -1))
    assert env.action_spec.shape == (6,) and float(env.action_spec.high.min()) == 1.0
    td = env.reset()
    td["action"] = torch.arange(6, dtype=torch.float32) / 10
    out = env.step(td)
    torch.testing.assert_close(out["next", "observation"], torch.arange(6, dtype=torch.float32) / 10)
    assert out["action"].shape == (6,)  # the policy's data keeps its flat action
    assert env.rollout(4)["action"].shape == (4, 6)
    with pytest.raises(ValueError, match="negative first_dim"):
        FlattenAction(0, -1)


def test_time_max_pool_is_the_max_over_the_last_t_observations():
    from tdrl.core.transforms import TimeMaxPool

    env = TransformedEnv(GymEnv("Pendulum-v1"), TimeMaxPool(T=3, out_keys=["pooled"]))
    env.set_seed(0)
    r = env.rollout(6, break_when_any_done=False)
    obs = torch.cat([r["observation"][:1], r["next", "observation"]])  # o_0 .. o_6
    for t in range(6):  # after step t the window is o_{t-1}, o_t, o_{t+1} (o_0 repeated at the start)
        window = obs[max(0, t - 1): t + 2]
        torch.testing.assert_close(r["next", "pooled"][t], window.max(0).values)
    torch.testing.assert_close(r["pooled"][0], obs[0])  # a reset's output is its own value
    vec = TransformedEnv(GymEnv("Pendulum-v1", num_envs=2), TimeMaxPool(T=2))
    batch = next(iter(Collector(vec, None, frames_per_batch=8, total_frames=8)))  # on the fast path
    assert batch["next", "observation"].shape == (2, 4, 3)
    with pytest.raises(ValueError, match="T >= 1"):
        TimeMaxPool(T=0)
