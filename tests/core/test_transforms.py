"""Transforms: each one's data and spec rewrite, on a probe env with hand-computed values."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdrl.core.envs import EnvBase, GymEnv, PendulumEnv, SerialEnv, check_env_specs
from tdrl.core.specs import Bounded, Composite, Unbounded
from tdrl.core.transforms import (
    ActionScaling,
    CatFrames,
    CatTensors,
    Compose,
    DoubleToFloat,
    InitTracker,
    RewardScaling,
    RewardSum,
    StepCounter,
    TransformedEnv,
)


class ProbeEnv(EnvBase):
    """obs = steps since reset, float64 (*batch, 2) = (t, 10 t); reward = the action;
    terminates when t reaches ``horizon``; the action spec is [0, 10] float64. The state
    ``"t"`` travels in the data (observation and state spec), as in PendulumEnv."""

    def __init__(self, batch_size=(), horizon=4):
        super().__init__(batch_size=batch_size)
        b = self.batch_size
        self.horizon = horizon
        self.observation_spec = Composite(
            observation=Unbounded((*b, 2), dtype=torch.float64),
            extra=Unbounded((*b, 1), dtype=torch.float64),
            t=Unbounded((*b, 1), dtype=torch.float64), shape=b)
        self.full_state_spec = Composite(t=Unbounded((*b, 1), dtype=torch.float64), shape=b)
        self.action_spec = Bounded(0.0, 10.0, (*b, 1), dtype=torch.float64)
        self.last_action = None

    def _obs(self, t):
        return {"observation": torch.cat([t, 10 * t], -1), "extra": -t, "t": t}

    def _reset(self, td, **kwargs):
        return TensorDict(self._obs(torch.zeros(*self.batch_size, 1, dtype=torch.float64)),
                          self.batch_size)

    def _step(self, td):
        self.last_action = td["action"].clone()
        t = td["t"] + 1
        term = t >= self.horizon
        return TensorDict(
            {**self._obs(t), "reward": td["action"].float(), "done": term.clone(),
             "terminated": term, "truncated": torch.zeros_like(term)},
            self.batch_size,
        )

    def _set_seed(self, seed):
        return seed + 1


def _const_policy(value):
    def policy(td):
        td["action"] = torch.full((*td.batch_size, 1), float(value), dtype=torch.float64)
        return td

    return policy


def test_step_counter_truncates_without_terminating():
    env = TransformedEnv(ProbeEnv((2,), horizon=100), StepCounter(max_steps=3))
    assert env.observation_spec["step_count"].dtype == torch.int64
    r = env.rollout(7, policy=_const_policy(1), break_when_any_done=False)
    assert r["step_count"][0, :, 0].tolist() == [0, 1, 2, 0, 1, 2, 0]
    assert r["next", "step_count"][0, :, 0].tolist() == [1, 2, 3, 1, 2, 3, 1]
    assert r["next", "truncated"][0, :, 0].tolist() == [False, False, True] * 2 + [False]
    assert torch.equal(r["next", "done"], r["next", "truncated"])
    assert not r["next", "terminated"].any()
    check_env_specs(env)
    with pytest.raises(ValueError, match="max_steps"):
        StepCounter(0)


def test_step_counter_partial_reset_keeps_other_counts():
    env = TransformedEnv(ProbeEnv((2,), horizon=2), StepCounter())
    td = env.reset()
    td["t"][0] = 1.0  # env 0 ends on the next step, env 1 does not
    td["action"] = torch.ones(2, 1, dtype=torch.float64)
    td, nxt = env.step_and_maybe_reset(td)
    assert td["next", "done"][:, 0].tolist() == [True, False]
    assert nxt["step_count"][:, 0].tolist() == [0, 1]


def test_reward_sum_is_the_episode_return():
    env = TransformedEnv(ProbeEnv((), horizon=3), RewardSum())
    seq = iter([1.0, 2.0, 3.0, 4.0, 5.0])

    def policy(td):
        td["action"] = torch.tensor([next(seq)], dtype=torch.float64)
        return td

    r = env.rollout(5, policy=policy, break_when_any_done=False)
    assert r["episode_reward"][:, 0].tolist() == [0.0, 1.0, 3.0, 0.0, 4.0]
    assert r["next", "episode_reward"][:, 0].tolist() == [1.0, 3.0, 6.0, 4.0, 9.0]
    assert env.observation_spec["episode_reward"].shape == (1,)
    check_env_specs(env)


def test_reward_scaling_golden():
    env = TransformedEnv(ProbeEnv(), RewardScaling(loc=1.0, scale=0.5))
    r = env.rollout(2, policy=_const_policy(4))
    assert r["next", "reward"][:, 0].tolist() == [3.0, 3.0]  # 4 * 0.5 + 1
    env = TransformedEnv(ProbeEnv(), RewardScaling(loc=1.0, scale=0.5, standard_normal=True))
    assert env.rollout(1, policy=_const_policy(4))["next", "reward"].item() == 6.0  # (4-1)/0.5


def test_init_tracker_flags_episode_starts():
    env = TransformedEnv(ProbeEnv((2,), horizon=2), InitTracker())
    r = env.rollout(5, policy=_const_policy(1), break_when_any_done=False)
    assert r["is_init"][0, :, 0].tolist() == [True, False, True, False, True]
    assert not r["next", "is_init"].any()
    check_env_specs(env)


def test_double_to_float_casts_data_specs_and_actions_back():
    env = TransformedEnv(ProbeEnv(), DoubleToFloat())
    assert env.observation_spec["observation"].dtype == torch.float32
    assert env.action_spec.dtype == torch.float32
    td = env.reset().set("action", torch.tensor([2.5]))
    env.step(td)
    assert td["next", "observation"].dtype == torch.float32
    assert env.base_env.last_action.dtype == torch.float64  # cast back on the way in
    assert td["action"].dtype == torch.float32  # the caller's action is untouched
    check_env_specs(env)
    cheetah = TransformedEnv(GymEnv("HalfCheetah-v5"), DoubleToFloat())
    r = cheetah.rollout(3)
    assert r["observation"].dtype == torch.float32 and r["action"].dtype == torch.float32
    check_env_specs(cheetah)


def test_cat_tensors():
    env = TransformedEnv(ProbeEnv(), CatTensors(["observation", "extra"], "obs_vec"))
    assert env.observation_spec["obs_vec"].shape == (3,)
    assert "observation" not in env.observation_spec and "extra" not in env.observation_spec
    r = env.rollout(2, policy=_const_policy(1))
    assert r["next", "obs_vec"].tolist() == [[1.0, 10.0, -1.0], [2.0, 20.0, -2.0]]
    assert "observation" not in r.keys()
    check_env_specs(env)


def test_cat_frames_stacks_the_last_n_frames():
    env = TransformedEnv(ProbeEnv((2,), horizon=3), CatFrames(3, dim=-1))
    assert env.observation_spec["observation"].shape == (2, 6)
    r = env.rollout(4, policy=_const_policy(1), break_when_any_done=False)
    t_only = r["next", "observation"][0, :, ::2]  # the t entry of each stacked frame
    assert t_only.tolist() == [[0, 0, 1], [0, 1, 2], [1, 2, 3], [0, 0, 1]]
    assert r["observation"][0, 0, ::2].tolist() == [0, 0, 0]  # reset repeats the frame
    check_env_specs(env)
    pad = TransformedEnv(ProbeEnv(), CatFrames(2, padding="constant"))
    r = pad.rollout(1, policy=_const_policy(1))
    assert r["next", "observation"][0].tolist() == [0, 0, 1, 10]


def test_action_scaling_maps_unit_box_to_env_bounds():
    env = TransformedEnv(ProbeEnv(), ActionScaling())
    spec = env.action_spec
    assert isinstance(spec, Bounded) and spec.low.item() == -1 and spec.high.item() == 1
    for a, expected in [(-1.0, 0.0), (0.0, 5.0), (1.0, 10.0), (3.0, 10.0)]:
        td = env.reset().set("action", torch.tensor([a], dtype=torch.float64))
        env.step(td)
        assert env.base_env.last_action.item() == pytest.approx(expected)
        assert td["action"].item() == a  # the policy's action stays as it was written
    pend = TransformedEnv(PendulumEnv(), ActionScaling())
    td = pend.reset().set("action", torch.tensor([0.5]))
    assert pend.step(td)["next", "reward"].shape == (1,)
    with pytest.raises(TypeError, match="Bounded action spec"):
        TransformedEnv(GymEnv("CartPole-v1"), ActionScaling())


def test_compose_on_mujoco_passes_check_env_specs():
    from tdrl.core.transforms import VecNorm

    env = TransformedEnv(
        GymEnv("HalfCheetah-v5"),
        Compose(DoubleToFloat(), StepCounter(5), RewardSum(), InitTracker(), CatFrames(2),
                VecNorm(), ActionScaling()),
    )
    check_env_specs(env, max_steps=8)
    r = env.rollout(8, break_when_any_done=False)
    assert r["observation"].shape == (8, 34) and r["observation"].dtype == torch.float32
    assert r["next", "truncated"][:, 0].tolist() == [False] * 4 + [True] + [False] * 3
    env.close()


def test_transforms_over_a_batched_env_and_append():
    env = TransformedEnv(SerialEnv(2, lambda: ProbeEnv(horizon=3)), StepCounter())
    env.append_transform(RewardSum())
    assert "episode_reward" in env.observation_spec
    r = env.rollout(4, policy=_const_policy(2), break_when_any_done=False)
    assert r["next", "episode_reward"][0, :, 0].tolist() == [2.0, 4.0, 6.0, 2.0]
    assert r["step_count"][1, :, 0].tolist() == [0, 1, 2, 0]
    assert len(env.envs) == 2  # attributes of the base env are forwarded


def test_forward_applies_to_offline_data():
    t = RewardScaling(scale=2.0)
    td = TensorDict({"reward": torch.ones(3, 1), "next": {"reward": torch.ones(3, 1)}}, [3])
    out = t(td)
    assert out["reward"].sum() == 6 and out["next", "reward"].sum() == 6
