"""PettingZooEnv: parallel (MPE simple_spread) and AEC (tic-tac-toe) rollouts follow the data
contract; grouping by prefix; agents that leave are masked; bad input names what is wrong."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from gymnasium import spaces
from pettingzoo import ParallelEnv

from tdrl.core.envs import check_env_specs
from tdrl.marl.envs import PettingZooEnv


def test_simple_spread_parallel_rollout_contract():
    env = PettingZooEnv("simple_spread_v3", N=3, max_cycles=5, seed=0)
    check_env_specs(env)
    td = env.rollout(8, break_when_any_done=False)
    assert td.batch_size == (8,)
    assert td["agents", "observation"].shape == (8, 3, 18)
    assert td["agents", "action"].shape == (8, 3) and td["agents", "action"].dtype == torch.int64
    assert td["next", "agents", "reward"].shape == (8, 3, 1)
    assert td["next", "agents", "done"].shape == (8, 3, 1)
    done = td["next", "done"][:, 0]
    assert done.tolist() == [False] * 4 + [True] + [False] * 3  # max_cycles=5 truncates
    assert bool(td["next", "truncated"][4]) and not bool(td["next", "terminated"][4])
    assert bool(td["agents", "mask"].all())


def test_group_by_prefix_splits_adversary_and_agents():
    env = PettingZooEnv("simple_adversary_v3", group_map="prefix", max_cycles=3, seed=0)
    assert env.group_map == {"adversary": ["adversary_0"], "agent": ["agent_0", "agent_1"]}
    td = env.rollout(3)
    assert td["adversary", "observation"].shape == (3, 1, 8)
    assert td["agent", "observation"].shape == (3, 2, 10)
    assert td["next", "agent", "reward"].shape == (3, 2, 1)


def test_tictactoe_turns_masks_and_final_reward():
    env = PettingZooEnv("tictactoe_v3", seed=0)
    assert not env.parallel
    check_env_specs(env)
    torch.manual_seed(0)
    td = env.rollout(20)
    turn = td["agents", "mask"]
    assert torch.equal(turn.sum(-1), torch.ones(len(td), dtype=torch.long))  # one player acts
    assert torch.equal(turn[:, 0], torch.arange(len(td)) % 2 == 0)  # and they alternate
    acted = td["agents", "action"][turn]
    legal = td["agents", "action_mask"][turn]
    assert bool(legal.gather(-1, acted.unsqueeze(-1)).all())  # random actions respect masks
    assert len(set(acted.tolist())) == len(acted)  # no cell played twice
    assert bool(td["next", "done"][-1]) and not bool(td["next", "done"][:-1].any())
    final = td["next", "agents", "reward"][-1, :, 0]
    assert final.sum() == 0 and set(final.tolist()) <= {-1.0, 0.0, 1.0}
    rewards_before = td["next", "agents", "reward"][:-1]
    assert bool((rewards_before == 0).all())


class _LeavingEnv(ParallelEnv):
    """Two agents; ``b`` terminates after its 2nd step, ``a`` after its 4th."""

    metadata = {"name": "leaving_v0"}

    def __init__(self):
        self.possible_agents = ["a", "b"]

    @functools.lru_cache(None)
    def observation_space(self, agent):
        return spaces.Box(-10, 10, (2,), np.float32)

    @functools.lru_cache(None)
    def action_space(self, agent):
        return spaces.Discrete(3)

    def reset(self, seed=None, options=None):
        self.agents, self.t = list(self.possible_agents), 0
        return {a: np.full(2, 1.0, np.float32) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        self.t += 1
        obs = {a: np.full(2, self.t + 1.0, np.float32) for a in self.agents}
        rew = {a: float(actions[a]) for a in self.agents}
        term = {a: (a == "b" and self.t >= 2) or self.t >= 4 for a in self.agents}
        trunc = {a: False for a in self.agents}
        self.agents = [a for a in self.agents if not term[a]]
        return obs, rew, term, trunc, {a: {} for a in obs}


def test_agents_that_leave_are_masked():
    env = PettingZooEnv(_LeavingEnv())
    td = env.reset()
    steps = []
    for _ in range(4):
        td["agents", "action"] = torch.tensor([1, 2])
        td = env.step(td)
        steps.append(td)
        td = td["next"].exclude(("agents", "reward"))
    out = torch.stack(steps)
    mask = out["next", "agents", "mask"]
    assert mask.tolist() == [[True, True], [True, False], [True, False], [False, False]]
    done_b = out["next", "agents", "done"][:, 1, 0]
    assert done_b.tolist() == [False, True, True, True]
    # b's reward is 2 while it acts, then 0; its observation is zero once it has left
    assert out["next", "agents", "reward"][:, 1, 0].tolist() == [2.0, 2.0, 0.0, 0.0]
    assert bool((out["next", "agents", "observation"][2:, 1] == 0).all())
    assert out["next", "done"][:, 0].tolist() == [False, False, False, True]
    assert bool(out["next", "terminated"][-1])


def test_unknown_task_and_wrong_action_shape():
    with pytest.raises(ValueError, match=r"Unknown PettingZoo task 'simple_sprad_v3'.*simple_spread_v3"):
        PettingZooEnv("simple_sprad_v3")
    env = PettingZooEnv("simple_spread_v3", N=3, seed=0)
    td = env.reset()
    td["agents", "action"] = torch.zeros(3, 5, dtype=torch.long)  # e.g. one-hot logits
    with pytest.raises(ValueError, match=r"group 'agents'.*\(3, 5\).*\(3,\)"):
        env.step(td)


def test_batched_with_serial_env():
    from tdrl.core.envs import SerialEnv

    env = SerialEnv(2, lambda: PettingZooEnv("simple_spread_v3", N=3, max_cycles=4))
    td = env.rollout(6, break_when_any_done=False)
    assert td["next", "agents", "reward"].shape == (2, 6, 3, 1)
    assert td["next", "done"][..., 0].tolist() == [[False, False, False, True, False, False]] * 2
