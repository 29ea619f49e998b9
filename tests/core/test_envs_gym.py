"""Gymnasium wrapper: TorchRL-compatible keys/specs, terminated vs truncated, vector envs in
every autoreset mode (no lost or made-up transition), MuJoCo tasks, Dict spaces."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from tdrl.core.envs import GymEnv, GymWrapper, check_env_specs
from tdrl.core.specs import Bounded, Categorical, Composite, OneHot, Unbounded


def test_cartpole_keys_shapes_dtypes_match_torchrl():
    env = GymEnv("CartPole-v1")
    assert isinstance(env.action_spec, OneHot) and env.action_spec.dtype == torch.int64
    assert env.action_spec.shape == (2,)
    obs = env.observation_spec["observation"]
    assert isinstance(obs, Bounded) and obs.shape == (4,) and obs.dtype == torch.float32
    r = env.rollout(5, break_when_any_done=False)
    expected = {
        "action": ((5, 2), torch.int64),
        "observation": ((5, 4), torch.float32),
        "done": ((5, 1), torch.bool),
        "terminated": ((5, 1), torch.bool),
        "truncated": ((5, 1), torch.bool),
        ("next", "observation"): ((5, 4), torch.float32),
        ("next", "reward"): ((5, 1), torch.float32),
        ("next", "done"): ((5, 1), torch.bool),
        ("next", "terminated"): ((5, 1), torch.bool),
        ("next", "truncated"): ((5, 1), torch.bool),
    }
    got = {k: (tuple(r[k].shape), r[k].dtype) for k in r.keys(True, True)}
    assert got == expected
    assert torch.equal(r["next", "reward"], torch.ones(5, 1))
    cat = GymEnv("CartPole-v1", categorical_action_encoding=True)
    assert isinstance(cat.action_spec, Categorical) and cat.action_spec.shape == ()


def test_terminated_and_truncated_are_kept_apart():
    env = GymEnv("CartPole-v1", max_episode_steps=3)
    env.set_seed(0)
    r = env.rollout(10, policy=lambda td: td.set("action", torch.tensor([1, 0])))
    assert r.batch_size == (3,)
    assert r["next", "truncated"].flatten().tolist() == [False, False, True]
    assert not r["next", "terminated"].any()
    assert torch.equal(r["next", "done"], r["next", "truncated"])
    env = GymEnv("CartPole-v1")  # always pushing right falls over: terminated, not truncated
    env.set_seed(0)
    r = env.rollout(100, policy=lambda td: td.set("action", torch.tensor([0, 1])))
    assert r["next", "terminated"][-1].item() and not r["next", "truncated"].any()
    assert r.batch_size[0] < 100


def test_same_actions_same_transitions_as_raw_gymnasium():
    env = GymEnv("Pendulum-v1")
    env.set_seed(3)
    torch.manual_seed(0)
    r = env.rollout(20)
    raw = gym.make("Pendulum-v1")
    obs, _ = raw.reset(seed=3)
    for t in range(20):
        np.testing.assert_allclose(r["observation"][t].numpy(), obs, rtol=1e-6)
        obs, rew, *_ = raw.step(r["action"][t].numpy())
        np.testing.assert_allclose(r["next", "observation"][t].numpy(), obs, rtol=1e-6)
        assert r["next", "reward"][t].item() == pytest.approx(rew, rel=1e-6)


def _replay_sub_env(r, env_id, seed, **kwargs):
    """Check sub-env rollout ``r`` (T,) step by step against a fresh single gymnasium env."""
    raw = gym.make(env_id, **kwargs)
    obs, _ = raw.reset(seed=seed)
    for t in range(r.batch_size[0]):
        np.testing.assert_allclose(r["observation"][t].numpy(), obs, rtol=1e-6)
        obs, rew, term, trunc, _ = raw.step(int(r["action"][t]))
        np.testing.assert_allclose(r["next", "observation"][t].numpy(), obs, rtol=1e-6)
        assert r["next", "reward"][t].item() == rew
        assert r["next", "terminated"][t].item() == term
        assert r["next", "truncated"][t].item() == trunc
        if term or trunc:
            obs, _ = raw.reset()


@pytest.mark.parametrize("mode", ["SameStep", "NextStep", "Disabled"])
def test_vector_env_autoreset_loses_and_fakes_nothing(mode):
    torch.manual_seed(0)
    env = GymEnv("CartPole-v1", num_envs=3, autoreset_mode=mode,
                 categorical_action_encoding=True, max_episode_steps=15)
    assert env.batch_size == (3,)
    env.set_seed(10)
    r = env.rollout(60, break_when_any_done=False)
    assert r.batch_size == (3, 60)
    assert r["next", "done"].sum() >= 4  # several resets happened in the window
    for i in range(3):
        _replay_sub_env(r[i], "CartPole-v1", 10 + i, max_episode_steps=15)
    # every transition is real: the reward of CartPole is 1 on every step
    assert torch.equal(r["next", "reward"], torch.ones(3, 60, 1))
    env.close()


def test_vector_env_all_done_at_once_is_not_reset_twice():
    """SAME_STEP: when every sub-env ends on the same step, the wrapper must reuse the
    observations Gymnasium already reset to (a second reset would shift the RNG streams)."""
    torch.manual_seed(0)
    env = GymEnv("CartPole-v1", num_envs=2, categorical_action_encoding=True,
                 max_episode_steps=5)
    env.set_seed(3)
    r = env.rollout(12, policy=lambda td: td.set("action", torch.tensor([0, 1])),
                    break_when_any_done=False)
    assert r["next", "truncated"][:, 4].all()
    for i in range(2):
        _replay_sub_env(r[i], "CartPole-v1", 3 + i, max_episode_steps=5)


def test_async_vector_env_and_gymwrapper():
    venv = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="async",
                        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP})
    env = GymWrapper(venv, categorical_action_encoding=True)
    env.set_seed(0)
    torch.manual_seed(0)
    r = env.rollout(40, break_when_any_done=False)
    _replay_sub_env(r[1], "CartPole-v1", 1)
    env.close()


@pytest.mark.parametrize("env_id, obs_dim, act_dim", [("HalfCheetah-v5", 17, 6), ("Hopper-v5", 11, 3)])
def test_mujoco_rollout(env_id, obs_dim, act_dim):
    env = GymEnv(env_id)
    assert env.observation_spec["observation"].dtype == torch.float64  # as TorchRL
    assert isinstance(env.observation_spec["observation"], Unbounded)
    assert isinstance(env.action_spec, Bounded) and env.action_spec.shape == (act_dim,)
    env.set_seed(0)
    r = env.rollout(30, break_when_any_done=False)
    assert r["observation"].shape == (30, obs_dim)
    assert r["action"].shape == (30, act_dim) and r["next", "reward"].dtype == torch.float32
    assert torch.isfinite(r["next", "observation"]).all()
    check_env_specs(env)
    env.close()


def test_hopper_terminates_when_it_falls():
    env = GymEnv("Hopper-v5")
    env.set_seed(0)
    r = env.rollout(500, policy=lambda td: td.set("action", torch.ones(3, dtype=torch.float32)))
    assert r["next", "terminated"][-1].item() and r.batch_size[0] < 500


def test_vector_mujoco_rollout():
    env = GymEnv("HalfCheetah-v5", num_envs=2, max_episode_steps=10)
    r = env.rollout(25, break_when_any_done=False)
    assert r.batch_size == (2, 25) and r["next", "truncated"].sum() == 4
    check_env_specs(env)
    env.close()


class _DictObsEnv(gym.Env):
    observation_space = gym.spaces.Dict(
        {"pos": gym.spaces.Box(-1, 1, (2,), np.float32), "tile": gym.spaces.Discrete(5)}
    )
    action_space = gym.spaces.Box(-1, 1, (), np.float32)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return {"pos": np.zeros(2, np.float32), "tile": 0}, {}

    def step(self, action):
        self.t += 1
        obs = {"pos": np.full(2, float(action), np.float32), "tile": self.t % 5}
        return obs, float(action), False, self.t >= 4, {}


def test_dict_observation_and_scalar_box_action():
    env = GymWrapper(_DictObsEnv())
    assert set(env.observation_spec.keys()) == {"pos", "tile"}
    assert env.action_spec.shape == (1,)  # a 0-d Box becomes (1,), as in TorchRL
    r = env.rollout(4)
    assert r["next", "pos"].shape == (4, 2)
    assert r["next", "tile"].shape == (4, 5) and r["next", "tile"].long().argmax(-1).tolist() == [1, 2, 3, 4]
    assert torch.allclose(r["next", "pos"][:, 0], r["action"][:, 0])
    check_env_specs(env)


def test_gym_bad_action_is_reported():
    env = GymEnv("Pendulum-v1", check_actions=True)
    td = env.reset().set("action", torch.zeros(2))
    with pytest.raises(ValueError, match=r"'action' has shape \(2,\).*expects shape \(1,\)"):
        env.step(td)


def test_vector_spec_shapes():
    env = GymEnv("Pendulum-v1", num_envs=4)
    assert env.observation_spec["observation"].shape == (4, 3)
    assert env.action_spec.shape == (4, 1) and env.reward_spec.shape == (4, 1)
    assert isinstance(env.full_done_spec, Composite) and env.full_done_spec["done"].shape == (4, 1)
    assert env.set_seed(5) == 9
    env.close()
