"""The Collector's dict loop behind the apps' transform stacks gives the very batches of the
generic loop: every key, key order, dtype and value, across episode ends (done / terminated /
truncated, the true final observation under "next", episode_reward reset), the carried root,
the trajectory ids and VecNorm's statistics. Policies are built as the apps build them
(ProbabilisticActor over MaskedCategorical / IndependentNormal)."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn

from tdrl.core.collectors import Collector
from tdrl.core.envs import make_env
from tdrl.core.modules import MLP, IndependentNormal, MaskedCategorical, ProbabilisticActor
from tdrl.core.transforms import (
    CatFrames,
    Transform,
    DoubleToFloat,
    InitTracker,
    RewardSum,
    StepCounter,
    VecNorm,
)


class _Gaussian(nn.Module):
    def __init__(self, obs_dim: int, act_dim: int) -> None:
        super().__init__()
        self.mean = MLP(obs_dim, act_dim, (32,), nn.Tanh)
        self.log_std = nn.Parameter(torch.zeros(act_dim))

    def forward(self, obs):
        loc = self.mean(obs)
        return loc, self.log_std.exp().expand_as(loc)


def _actor(env, seed: int = 0):
    torch.manual_seed(seed)
    obs_dim = env.observation_spec["observation"].shape[-1]
    spec = env.action_spec
    if spec.dtype == torch.int64:  # categorical (CartPole)
        params = TensorDictModule(MLP(obs_dim, spec.n, (32,), nn.Tanh), ["observation"], ["logits"])
        return ProbabilisticActor(params, MaskedCategorical, in_keys=["logits"])
    params = TensorDictModule(_Gaussian(obs_dim, spec.shape[-1]), ["observation"], ["loc", "scale"])
    return ProbabilisticActor(params, IndependentNormal, in_keys=["loc", "scale"])


def _collect(dict_loop: bool, env_id: str, num_envs: int, transforms, fpb: int, n_batches: int,
             **gym_kwargs):
    env = make_env(env_id, num_envs, transforms(), **gym_kwargs)
    col = Collector(env, _actor(env), frames_per_batch=fpb, seed=5)
    col._dict_loop = dict_loop
    torch.manual_seed(1)  # the policy's samples
    it = iter(col)
    batches = [next(it) for _ in range(n_batches)]
    plan = col._dict_plan(col._td)
    return batches, col, plan


def _assert_same(a: TensorDict, b: TensorDict) -> None:
    assert list(a.keys(True, True)) == list(b.keys(True, True))
    assert a.batch_size == b.batch_size
    for key in a.keys(True, True):
        x, y = a.get(key), b.get(key)
        assert x.dtype == y.dtype and x.shape == y.shape, key
        assert torch.equal(x, y), key


def _check_parity(env_id, num_envs, transforms, fpb, n_batches, dict_resets=True, **gym_kwargs):
    fast, fast_col, plan = _collect(True, env_id, num_envs, transforms, fpb, n_batches, **gym_kwargs)
    slow, slow_col, _ = _collect(False, env_id, num_envs, transforms, fpb, n_batches, **gym_kwargs)
    assert plan is not None  # the dict loop did run
    assert (plan[1] is not None) == dict_resets  # episode ends were reset on dicts (or not)
    for a, b in zip(fast, slow):
        _assert_same(a, b)
    _assert_same(fast_col._td, slow_col._td)
    assert fast_col._next_traj_id == slow_col._next_traj_id
    state_fast, state_slow = fast_col.env.state_dict(), slow_col.env.state_dict()
    assert list(state_fast) == list(state_slow)
    for k in state_fast:
        assert torch.equal(state_fast[k], state_slow[k]), k
    batch = torch.cat(fast, -1)
    done = batch["next", "done"][..., 0]
    assert done.any()  # episode ends were crossed
    # after an episode end the return restarts at the step's reward
    env_i, t = done[:, :-1].nonzero()[0].tolist()
    assert torch.equal(batch["episode_reward"][env_i, t + 1], torch.zeros(1))
    assert torch.equal(batch["next", "episode_reward"][env_i, t + 1], batch["next", "reward"][env_i, t + 1])
    # the true final observation is kept under "next"; the next root is a reset observation
    assert not torch.equal(batch["next", "observation"][env_i, t], batch["observation"][env_i, t + 1])
    return batch, fast_col


def test_cartpole_with_reward_sum():
    batch, _ = _check_parity("CartPole-v1", 4, lambda: (RewardSum(),), 128, 3,
                             categorical_action_encoding=True)
    assert batch["next", "terminated"].any()


def test_pendulum_with_double_to_float_vecnorm_reward_sum():
    batch, col = _check_parity("Pendulum-v1", 3, lambda: (DoubleToFloat(), VecNorm(clip=10.0), RewardSum()),
                               450, 2)
    assert batch["next", "truncated"][:, 199].all() and not batch["next", "terminated"].any()
    assert float(col.env.transform[1].count_0) > 900  # the statistics did move


def test_pendulum_with_step_counter_and_init_tracker():
    """A time limit set by a transform (the env's own done hint no longer holds)."""
    batch, _ = _check_parity(
        "Pendulum-v1", 2, lambda: (StepCounter(max_steps=30), InitTracker(), RewardSum()), 100, 2)
    assert batch["next", "truncated"][:, 29].all()
    assert batch["is_init"][:, 30].all() and not batch["next", "is_init"].any()
    assert batch["step_count"][0, :32, 0].tolist() == list(range(30)) + [0, 1]


def test_halfcheetah_with_double_to_float_reward_sum():
    pytest.importorskip("mujoco")
    batch, _ = _check_parity("HalfCheetah-v5", 2, lambda: (DoubleToFloat(), RewardSum()), 1100, 2,
                             wrappers=[gym.wrappers.ClipAction])
    assert batch["next", "truncated"][:, 999].all()
    assert batch["observation"].dtype == torch.float32


def test_partial_resets_on_dicts_through_every_hooked_transform():
    """CartPole's sub-envs end at different steps: the dict reset merges reset rows into the
    carried root (VecNorm updating on the reset rows only, the counters and flags restarting)."""
    batch, col = _check_parity(
        "CartPole-v1", 5, lambda: (DoubleToFloat(), VecNorm(clip=5.0), StepCounter(max_steps=25),
                                   InitTracker(), RewardSum()), 150, 3,
        categorical_action_encoding=True)
    done = batch["next", "done"][..., 0]
    assert (done.sum(0) < 5).any() and (done.sum(0) > 0).any()  # partial resets happened
    assert batch["next", "terminated"].any() and batch["next", "truncated"].any()
    assert float(col.env.transform[1].count_0) > 450


class _CountedReset(RewardSum):
    """A transform with its own ``_reset``, which its parent's dict hook does not know."""

    calls = 0

    def _reset(self, td, td_reset):
        type(self).calls += 1
        return super()._reset(td, td_reset)


def test_a_transform_with_its_own_reset_keeps_its_body_on_the_dict_path():
    """A subclass that overrides ``_reset`` (which its parent's dict hook does not know) gets its
    own ``_reset`` adapted to dicts: the dict loop still runs it, and the batches equal the
    generic loop's."""
    _CountedReset.calls = 0
    batch, col = _check_parity("CartPole-v1", 4, lambda: (_CountedReset(),), 128, 2,
                               categorical_action_encoding=True)
    assert col.env.dict_resetter() is not None and col.env.dict_stepper() is not None
    # both collectors reset through the transform's own _reset at every step that ended an episode
    steps_with_ends = int(batch["next", "done"][..., 0].any(0).sum())
    assert _CountedReset.calls >= 2 * steps_with_ends > 0


class _Shift(Transform):
    """A transform written the ordinary way: only ``_apply_transform``, no dict hook of its own."""

    def _apply_transform(self, x):
        return x + 1.5


def test_a_transform_written_the_ordinary_way_is_on_the_fast_path():
    batch, col = _check_parity("CartPole-v1", 3, lambda: (DoubleToFloat(), _Shift(in_keys=["observation"]),
                                                          RewardSum()), 120, 2, categorical_action_encoding=True)
    assert col.env.dict_stepper() is not None and col.env.dict_resetter() is not None
    raw = make_env("CartPole-v1", 3, (DoubleToFloat(), RewardSum()), categorical_action_encoding=True)
    raw.set_seed(5)
    shifted = col.env
    shifted.set_seed(5)
    assert torch.equal(shifted.reset()["observation"], raw.reset()["observation"] + 1.5)
    # CatFrames (no dict hook of its own, state in the root): the dict loop runs it, same batches
    _check_parity("Pendulum-v1", 2, lambda: (RewardSum(), CatFrames(2, dim=-1)), 200, 3)
    checked = make_env("Pendulum-v1", 2, (RewardSum(),))
    checked.check_actions = True
    assert checked.dict_stepper() is None  # checked actions: the generic path, by design


def test_a_frozen_vecnorm_stays_frozen_on_the_dict_path():
    fast, fast_col, plan = _collect(True, "Pendulum-v1", 2, lambda: (VecNorm(),), 100, 1)
    norm = fast_col.env.transform[0]
    norm.freeze()
    before = norm.mean_0.clone(), norm.count_0.clone()
    next(iter(fast_col))
    assert plan is not None and torch.equal(norm.mean_0, before[0]) and torch.equal(norm.count_0, before[1])


def test_pendulum_with_issue40_step_transforms():
    """TorchRL's everyday step transforms, written the ordinary way, on the dict loop."""
    from tdrl.core.transforms import RewardClipping, TargetReturn, TrajCounter

    batch, _ = _check_parity(
        "Pendulum-v1", 2, lambda: (DoubleToFloat(), RewardClipping(-5.0, -0.5), TargetReturn(-100.0),
                                   TrajCounter(), RewardSum()),
        450, 2)
    assert batch["next", "reward"].max() <= -0.5
    assert batch["traj_count"][:, 0, 0].tolist() == [0, 1]
    assert batch["traj_count"][:, 200, 0].tolist() == [2, 3]


def test_cartpole_with_primer_clip_sign_select():
    from tdrl.core.specs import Unbounded
    from tdrl.core.transforms import ClipTransform, SelectTransform, SignTransform, TensorDictPrimer

    batch, _ = _check_parity(
        "CartPole-v1", 3, lambda: (ClipTransform(["observation"], low=-1.0, high=1.0), SignTransform(),
                                   TensorDictPrimer(hidden=Unbounded((2,)), default_value=1.5),
                                   SelectTransform("observation", "hidden"), RewardSum()),
        128, 2, categorical_action_encoding=True)
    assert batch["observation"].abs().max() <= 1.0
    assert bool((batch["hidden"] == 1.5).all())


def test_next_observation_delta_on_the_fast_path():
    """NextObservationDelta (its ``_step`` on dicts): the dict loop runs it and gives the generic
    loop's batches: float16 deltas under ("next", "delta"), no full ("next", "observation"), and
    no delta carried into the next root, across CartPole's episode ends."""
    from tdrl.core.transforms import NextObservationDelta

    def stack():
        return (DoubleToFloat(), NextObservationDelta(), RewardSum())

    fast, fast_col, plan = _collect(True, "CartPole-v1", 3, stack, 150, 2, categorical_action_encoding=True)
    slow, slow_col, _ = _collect(False, "CartPole-v1", 3, stack, 150, 2, categorical_action_encoding=True)
    assert plan is not None and plan[1] is not None  # dict steps and dict resets
    for a, b in zip(fast, slow):
        _assert_same(a, b)
    _assert_same(fast_col._td, slow_col._td)
    batch = torch.cat(fast, -1)
    keys = set(batch.keys(True, True))
    assert ("next", "observation") not in keys and ("delta", "observation") not in keys
    assert "delta" not in fast_col._td.keys()
    delta = batch["next", "delta", "observation"]
    assert delta.dtype == torch.float16 and batch["next", "done"].any()
    # inside an episode the delta is the step to the next root (float16 round-off)
    inner = ~batch["next", "done"][:, :-1, 0]
    step = batch["observation"][:, 1:] - batch["observation"][:, :-1]
    assert torch.equal(delta[:, :-1][inner], step[inner].half())
