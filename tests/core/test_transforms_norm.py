"""Normalisation transforms: ObservationNorm (fixed stats, init_stats) and VecNorm (running
stats equal to a naive mean/variance over everything seen, state_dict round trip, freeze)."""

from __future__ import annotations

import torch

from tdrl.core.envs import PendulumEnv, check_env_specs
from tdrl.core.specs import Bounded, Unbounded
from tdrl.core.transforms import Compose, ObservationNorm, StepCounter, TransformedEnv, VecNorm


def _zero_policy(td):
    td["action"] = torch.zeros(*td.batch_size, 1)
    return td


def test_observation_norm_golden_and_spec_bounds():
    loc, scale = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([2.0, 2.0, 0.5])
    env = TransformedEnv(PendulumEnv(), ObservationNorm(loc, scale))
    raw_env = PendulumEnv()
    env.set_seed(1)
    raw_env.set_seed(1)
    r = env.rollout(3, policy=_zero_policy)
    raw = raw_env.rollout(3, policy=_zero_policy)
    assert torch.allclose(r["observation"], raw["observation"] * scale + loc)
    assert torch.allclose(r["next", "observation"], raw["next", "observation"] * scale + loc)
    spec = env.observation_spec["observation"]
    assert isinstance(spec, Bounded)
    assert torch.allclose(spec.low, torch.tensor([-1.0, 0.0, -1.0]))  # -1*2+1, -1*2+2, -8*.5+3
    assert torch.allclose(spec.high, torch.tensor([3.0, 4.0, 7.0]))
    check_env_specs(env)
    std = TransformedEnv(PendulumEnv(), ObservationNorm(loc, scale, standard_normal=True))
    std.set_seed(1)
    r = std.rollout(2, policy=_zero_policy)
    assert torch.allclose(r["observation"], (raw["observation"][:2] - loc) / scale, atol=1e-5)
    assert set(std.state_dict()) == {"transforms.0.loc", "transforms.0.scale"}


def test_observation_norm_init_stats_standardises():
    torch.manual_seed(0)
    env = TransformedEnv(PendulumEnv((64,)), ObservationNorm(standard_normal=True))
    env.set_seed(0)
    norm = env.transform[0]
    assert not norm.initialized
    norm.init_stats(num_iter=30)
    assert norm.initialized and norm.loc.shape == (3,)
    r = env.rollout(30, break_when_any_done=False)
    x = r["observation"].reshape(-1, 3)
    assert torch.allclose(x.mean(0), torch.zeros(3), atol=0.15)
    assert torch.allclose(x.std(0), torch.ones(3), atol=0.15)
    assert isinstance(env.observation_spec["observation"], Bounded)  # specs were refreshed
    fresh = TransformedEnv(PendulumEnv((64,)), ObservationNorm(standard_normal=True))
    fresh.load_state_dict(env.state_dict())  # buffers of unknown shape load too
    assert torch.equal(fresh.transform[0].loc, norm.loc)


def test_vec_norm_matches_naive_running_statistics():
    env = TransformedEnv(PendulumEnv((4,), max_episode_steps=3), VecNorm(eps=0.0))
    raw_env = PendulumEnv((4,), max_episode_steps=3)
    env.set_seed(3)
    raw_env.set_seed(3)
    r = env.rollout(5, policy=_zero_policy, break_when_any_done=False)
    raw = raw_env.rollout(5, policy=_zero_policy, break_when_any_done=False)
    # everything VecNorm has seen: the first reset, every step output, and the resets after
    # the truncation at step 3 (which are the root observations of step 3)
    seen = torch.cat([raw["observation"][:, 0], raw["next", "observation"].reshape(-1, 3),
                      raw["observation"][:, 3]]).double()
    vn = env.transform[0]
    assert vn.count_0.item() == seen.shape[0] == 28
    assert torch.allclose(vn.mean_0, seen.mean(0), atol=1e-6)
    assert torch.allclose(vn.var_0, seen.var(0, unbiased=False), atol=1e-6)
    # the last output was normalised with the statistics of everything seen up to then
    last = raw["next", "observation"][:, -1].double()
    expected = (last - vn.mean_0) / vn.var_0.sqrt()
    assert torch.allclose(r["next", "observation"][:, -1].double(), expected, atol=1e-5)
    assert isinstance(env.observation_spec["observation"], Unbounded)


def test_vec_norm_state_dict_round_trip_and_freeze():
    env = TransformedEnv(PendulumEnv((8,)), Compose(StepCounter(), VecNorm(clip=5.0)))
    env.rollout(10)
    state = env.state_dict()
    assert {"transforms.1.mean_0", "transforms.1.var_0", "transforms.1.count_0"} <= set(state)
    other = TransformedEnv(PendulumEnv((8,)), Compose(StepCounter(), VecNorm(clip=5.0)))
    other.load_state_dict(state)
    other.transform[1].freeze()
    before = other.transform[1].count_0.clone()
    other.set_seed(0)
    env.transform[1].freeze()
    env.set_seed(0)
    a, b = env.rollout(4, policy=_zero_policy), other.rollout(4, policy=_zero_policy)
    assert torch.equal(other.transform[1].count_0, before)  # frozen: no update
    torch.testing.assert_close(a["observation"], b["observation"])
    assert a["observation"].abs().max() <= 5.0
    check_env_specs(other)


def test_vec_norm_partial_reset_counts_only_reset_rows():
    env = TransformedEnv(PendulumEnv((3,)), VecNorm())
    td = env.reset()
    assert env.transform[0].count_0.item() == 3
    td = env.rand_action(td)
    td = env.step(td)
    nxt = td["next"].exclude("reward")
    nxt["_reset"] = torch.tensor([[True], [False], [False]])
    env.reset(nxt)
    assert env.transform[0].count_0.item() == 3 + 3 + 1
