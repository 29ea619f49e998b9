"""The key, value, return and step transforms: hand-computed values on a probe env, spec
checks, and a Pendulum / CartPole rollout where the transform applies to a real env."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdrl.core.envs import EnvBase, GymEnv, PendulumEnv, check_env_specs, make_env
from tdrl.core.specs import Bounded, Categorical, Composite, Unbounded
from tdrl.core.transforms import (
    ActionMask,
    ClipTransform,
    Compose,
    ExcludeTransform,
    FlattenObservation,
    FrameSkipTransform,
    NoopResetEnv,
    RenameTransform,
    Reward2GoTransform,
    RewardClipping,
    SelectTransform,
    SignTransform,
    TargetReturn,
    TensorDictPrimer,
    TrajCounter,
    TransformedEnv,
    UnsqueezeTransform,
)


class ProbeEnv(EnvBase):
    """obs = (t, 10 t) float64 after t steps, ``extra`` = -t; reward = the action; ends at
    ``horizon``; the state ``t`` travels in the data."""

    def __init__(self, batch_size=(), horizon=4):
        super().__init__(batch_size=batch_size)
        b = self.batch_size
        self.horizon, self.steps = horizon, 0
        self.observation_spec = Composite(
            observation=Unbounded((*b, 2), dtype=torch.float64),
            extra=Unbounded((*b, 1), dtype=torch.float64),
            t=Unbounded((*b, 1), dtype=torch.float64), shape=b)
        self.full_state_spec = Composite(t=Unbounded((*b, 1), dtype=torch.float64), shape=b)
        self.action_spec = Bounded(-10.0, 10.0, (*b, 1), dtype=torch.float64)

    def _obs(self, t):
        return {"observation": torch.cat([t, 10 * t], -1), "extra": -t, "t": t}

    def _reset(self, td, **kwargs):
        return TensorDict(self._obs(torch.zeros(*self.batch_size, 1, dtype=torch.float64)),
                          self.batch_size)

    def _step(self, td):
        self.steps += 1
        t = td["t"] + 1
        term = t >= self.horizon
        return TensorDict({**self._obs(t), "reward": td["action"].float(), "done": term.clone(),
                           "terminated": term, "truncated": torch.zeros_like(term)}, self.batch_size)

    def _set_seed(self, seed):
        return seed + 1


def _policy(*values):
    it = iter(values)

    def policy(td):
        td["action"] = torch.full((*td.batch_size, 1), float(next(it)), dtype=torch.float64)
        return td

    return policy


def test_rename_moves_data_and_specs_and_actions():
    env = TransformedEnv(ProbeEnv(), RenameTransform(["observation", "reward"], ["obs", "rew"],
                                                     ["action"], ["act"]))
    assert "obs" in env.observation_spec and "observation" not in env.observation_spec
    assert "rew" in env.full_reward_spec and "act" in env.full_action_spec
    td = env.reset()
    assert td["obs"].tolist() == [0.0, 0.0] and "observation" not in td.keys()
    td["act"] = torch.tensor([3.0], dtype=torch.float64)
    out = env.step(td)
    assert out["next", "rew"].tolist() == [3.0] and out["next", "obs"].tolist() == [1.0, 10.0]
    assert "act" in out.keys()  # the caller's entry is untouched
    copy = TransformedEnv(ProbeEnv(), RenameTransform(["extra"], ["e"], create_copy=True))
    assert {"extra", "e"} <= set(copy.reset().keys())
    check_env_specs(copy)


def test_exclude_and_select():
    env = TransformedEnv(ProbeEnv(), ExcludeTransform("extra"))
    r = env.rollout(2, policy=_policy(1, 1))
    assert "extra" not in r.keys() and "extra" not in r["next"].keys()
    assert "extra" not in env.observation_spec
    check_env_specs(env)
    sel = TransformedEnv(ProbeEnv(), SelectTransform("observation"))
    r = sel.rollout(2, policy=_policy(2, 2))
    assert set(r["next"].keys()) == {"observation", "t", "reward", "done", "terminated", "truncated"}
    assert r["next", "reward"][:, 0].tolist() == [2.0, 2.0]  # rewards / dones kept; t is state
    check_env_specs(sel)
    pend = TransformedEnv(GymEnv("Pendulum-v1"), ExcludeTransform("observation"))
    assert "observation" not in pend.rollout(2).keys()


def test_primer_resets_carries_and_is_in_the_specs():
    env = TransformedEnv(ProbeEnv((2,), horizon=2),
                         TensorDictPrimer(hidden=Unbounded((3,)), default_value=0.5))
    assert env.observation_spec["hidden"].shape == (2, 3) and "hidden" in env.full_state_spec
    td = env.reset()
    assert torch.equal(td["hidden"], torch.full((2, 3), 0.5))
    td["hidden"] = torch.ones(2, 3)  # a policy writes its state: the step carries it
    td["action"] = torch.zeros(2, 1, dtype=torch.float64)
    assert torch.equal(env.step(td)["next", "hidden"], torch.ones(2, 3))
    check_env_specs(env)
    rnd = TransformedEnv(PendulumEnv(), TensorDictPrimer(Composite(h=Bounded(-1.0, 1.0, (4,))), random=True))
    h = rnd.reset()["h"]
    assert h.shape == (4,) and bool((h.abs() <= 1).all()) and h.abs().sum() > 0
    with pytest.raises(ValueError, match="at least one spec"):
        TensorDictPrimer()


def test_clip_reward_clipping_and_sign():
    env = TransformedEnv(ProbeEnv(horizon=10), Compose(
        ClipTransform(["observation"], low=0.0, high=15.0), RewardClipping(-1.0, 2.0)))
    r = env.rollout(3, policy=_policy(-5, 1.5, 7))
    assert r["next", "observation"].tolist() == [[1, 10], [2, 15], [3, 15]]
    assert r["next", "reward"][:, 0].tolist() == [-1.0, 1.5, 2.0]
    assert isinstance(env.full_reward_spec["reward"], Bounded)
    check_env_specs(env)
    act = TransformedEnv(ProbeEnv(), ClipTransform(in_keys_inv=["action"], low=-1.0, high=1.0))
    assert act.step(act.reset().set("action", torch.tensor([5.0], dtype=torch.float64)))[
        "next", "reward"].item() == 1.0
    sign = TransformedEnv(ProbeEnv(horizon=10), SignTransform())
    assert sign.rollout(3, policy=_policy(-5, 0, 0.2))["next", "reward"][:, 0].tolist() == [-1, 0, 1]
    check_env_specs(sign)


def test_unsqueeze_and_flatten():
    env = TransformedEnv(ProbeEnv(), Compose(UnsqueezeTransform(-2), UnsqueezeTransform(-1, ["extra"])))
    assert env.observation_spec["observation"].shape == (1, 2)
    r = env.rollout(1, policy=_policy(1))
    assert r["next", "observation"].tolist() == [[[1.0, 10.0]]] and r["extra"].shape == (1, 1, 1)
    check_env_specs(env)
    flat = TransformedEnv(ProbeEnv((3,)), Compose(UnsqueezeTransform(-1), FlattenObservation(-2, -1)))
    assert flat.observation_spec["observation"].shape == (3, 2)
    check_env_specs(flat)
    pend = TransformedEnv(GymEnv("Pendulum-v1"), UnsqueezeTransform(-1))
    assert pend.rollout(2)["observation"].shape == (2, 3, 1)
    check_env_specs(pend)
    with pytest.raises(ValueError, match="negative dim"):
        UnsqueezeTransform(0)


def test_target_return_reduce_and_constant():
    env = TransformedEnv(ProbeEnv(horizon=3), TargetReturn(10.0))
    r = env.rollout(4, policy=_policy(1, 2, 3, 4), break_when_any_done=False)
    assert r["target_return"][:, 0].tolist() == [10.0, 9.0, 7.0, 10.0]  # reset after 3 steps
    assert r["next", "target_return"][:, 0].tolist() == [9.0, 7.0, 4.0, 6.0]
    check_env_specs(env)
    const = TransformedEnv(ProbeEnv(), TargetReturn(5.0, mode="constant"))
    assert const.rollout(2, policy=_policy(1, 1))["next", "target_return"][:, 0].tolist() == [5.0, 5.0]


def test_reward2go_on_a_trajectory():
    td = TensorDict({"next": {"reward": torch.tensor([[1.0], [2.0], [3.0], [4.0]]),
                              "done": torch.tensor([[False], [True], [False], [False]])}}, [4])
    Reward2GoTransform(gamma=0.5)(td)
    # episode 1: 1 + 0.5 * 2 = 2, 2; episode 2: 3 + 0.5 * 4 = 5, 4
    assert td["reward_to_go"][:, 0].tolist() == [2.0, 2.0, 5.0, 4.0]
    env = TransformedEnv(ProbeEnv(), Reward2GoTransform())
    with pytest.raises(RuntimeError, match="trajectories"):
        env.rollout(1, policy=_policy(1))


class MaskedEnv(EnvBase):
    """Categorical(3) actions; the mask allows only the action ``t % 3``; reward = action."""

    def __init__(self):
        super().__init__()
        self.observation_spec = Composite(
            action_mask=Categorical(2, (3,), dtype=torch.bool), t=Unbounded((1,), dtype=torch.int64))
        self.action_spec = Categorical(3, ())

    def _mask(self, t):
        return torch.arange(3) == t % 3

    def _reset(self, td, **kwargs):
        t = torch.zeros(1, dtype=torch.int64)
        return TensorDict({"action_mask": self._mask(t), "t": t}, [])

    def _step(self, td):
        t = td["t"] + 1
        return TensorDict({"action_mask": self._mask(t), "t": t, "reward": td["action"].float().reshape(1),
                           "done": torch.zeros(1, dtype=torch.bool), "terminated": torch.zeros(1, dtype=torch.bool),
                           "truncated": torch.zeros(1, dtype=torch.bool)}, [])

    def _set_seed(self, seed):
        return seed


def test_action_mask_samples_allowed_actions_and_refuses_others():
    env = TransformedEnv(MaskedEnv(), ActionMask())
    r = env.rollout(6)  # random actions follow the mask: action t % 3
    assert r["action"].tolist() == [0, 1, 2, 0, 1, 2]
    td = env.reset().set("action", torch.tensor(2))
    with pytest.raises(RuntimeError, match="forbids"):
        env.step(td)


def test_frame_skip_repeats_sums_and_stops_at_done():
    base = ProbeEnv(horizon=5)
    env = TransformedEnv(base, FrameSkipTransform(2))
    r = env.rollout(3, policy=_policy(1, 2, 3), break_when_any_done=False)
    assert r["next", "reward"][:, 0].tolist() == [2.0, 4.0, 3.0]  # the 3rd step ends at t=5
    assert r["next", "observation"][:, 0].tolist() == [2.0, 4.0, 5.0]
    assert r["next", "done"][:, 0].tolist() == [False, False, True] and base.steps == 5
    check_env_specs(env)
    pend = TransformedEnv(GymEnv("Pendulum-v1"), FrameSkipTransform(4))
    assert pend.rollout(50, break_when_any_done=False)["next", "truncated"][-1].all()  # 200 steps


def test_noop_reset_steps_the_base_env():
    base = ProbeEnv(horizon=100)
    env = TransformedEnv(base, NoopResetEnv(3, random=False))
    assert env.reset()["observation"].tolist() == [3.0, 30.0] and base.steps == 3
    rnd = TransformedEnv(ProbeEnv(horizon=100), NoopResetEnv(5))
    counts = {rnd.reset()["t"].item() for _ in range(30)}
    assert counts <= {1.0, 2.0, 3.0, 4.0, 5.0} and len(counts) > 2
    short = TransformedEnv(ProbeEnv(horizon=2), NoopResetEnv(3, random=False))
    assert short.reset()["t"].item() == 1.0  # t=2 ended an episode: reset, one more no-op
    check_env_specs(TransformedEnv(make_env("Pendulum-v1"), NoopResetEnv(4)))


def test_traj_counter_numbers_episodes_over_sub_envs():
    env = TransformedEnv(ProbeEnv((2,), horizon=2), TrajCounter())
    td = env.reset()
    assert td["traj_count"][:, 0].tolist() == [0, 1]
    td["t"][0] = 1.0  # env 0 ends first
    r = env.rollout(4, policy=lambda x: x.set("action", torch.ones(2, 1, dtype=torch.float64)),
                    auto_reset=False, tensordict=td, break_when_any_done=False)
    assert r["traj_count"][0, :, 0].tolist() == [0, 2, 2, 4]
    assert r["traj_count"][1, :, 0].tolist() == [1, 1, 3, 3]
    assert r["next", "traj_count"][1, :, 0].tolist() == [1, 1, 3, 3]
    assert int(env.transform[0]._next_id) == 6  # env 1 ended at the last step: id 5 given
    check_env_specs(env)
