"""MARL collection through core's Collector: the same steps as a hand-stepped rollout, and the
per-group episode returns read from core's RewardSum equal the returns summed by hand."""

from __future__ import annotations

import pytest
import torch

from tdrl.core.collectors import Collector
from tdrl.core.envs import SerialEnv
from tdrl.marl.algorithms import make_groups
from tdrl.marl.envs import PettingZooEnv, VmasEnv
from tdrl.marl.objectives import MAPPOConfig
from tdrl.marl.loops import EpisodeReturns, GroupPolicies, collect, with_episode_returns


def _by_hand(batch, group: str) -> list[float]:
    """Episode returns (sum over steps of the agents' mean reward), ordered by step then env."""
    r = batch["next", group, "reward"].mean((-2, -1)).reshape(-1, batch.shape[-1])
    done = batch["next", "done"].reshape(r.shape)
    running, out = [0.0] * r.shape[0], []
    for t in range(r.shape[1]):
        for e in range(r.shape[0]):
            running[e] += float(r[e, t])
            if done[e, t]:
                out.append(running[e])
                running[e] = 0.0
    return out


@pytest.mark.parametrize("make", [
    lambda: VmasEnv("navigation", num_envs=3, max_steps=4, seed=0, n_agents=2),
    lambda: SerialEnv(2, lambda: PettingZooEnv("simple_adversary_v3", group_map="prefix", max_cycles=3, seed=0)),
])
def test_collector_batches_and_group_episode_returns(make):
    torch.manual_seed(0)
    env = make()
    parts = make_groups("mappo", env, MAPPOConfig(), num_cells=(8,))
    policy = GroupPolicies({g: p.policy for g, p in parts.items()})
    tracked = with_episode_returns(env, list(parts))
    collector = Collector(tracked, policy, frames_per_batch=5 * env.batch_size.numel())
    torch.manual_seed(1)
    batches = [collector.rollout() for _ in range(2)]  # episodes span the two batches
    env = make()  # a fresh env of the same seed, stepped by hand
    torch.manual_seed(1)
    td, by_step = env.reset(), []
    for _ in range(2):
        b, td = collect(env, policy, td, 5)
        by_step.append(b)
    for got, ref in zip(batches, by_step):  # the collector took the same steps
        for key in ref.keys(True, True):
            assert torch.equal(got[key], ref[key]), key
    for g in parts:
        tracker, finished = EpisodeReturns(g), []
        for batch in batches:
            finished += tracker.update(batch)
        # by hand over the concatenated batches: episodes that started in the first batch
        expected = _by_hand(torch.cat(batches, -1), g)
        assert len(finished) == len(expected) > 0
        assert finished == pytest.approx(expected, abs=1e-5)


def test_episode_returns_name_the_missing_transform():
    env = VmasEnv("navigation", num_envs=2, max_steps=4, seed=0, n_agents=2)
    batch = env.rollout(3, break_when_any_done=False)
    with pytest.raises(KeyError, match="with_episode_returns"):
        EpisodeReturns().update(batch)
    assert with_episode_returns(with_episode_returns(env, ["agents"]), ["agents"]).base_env is env  # wrapped once
