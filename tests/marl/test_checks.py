"""QMIX/VDN refuse a zero-sum game inside one group (the team reward is always 0), on the real
PettingZoo tic-tac-toe; a group per player trains."""

from __future__ import annotations

import pytest
import torch

from tdrl.core.envs import SerialEnv
from tdrl.marl.algorithms import make_groups
from tdrl.marl.checks import TeamRewardCheck, ZeroTeamRewardError
from tdrl.marl.envs import PettingZooEnv
from tdrl.marl.objectives import QMIXConfig
from tdrl.marl.loops import TrainConfig, train_off_policy

# 4 boards x 25 moves per batch: several finished games (+1/-1) in the first batch
CFG = dict(frames_per_batch=100, n_iters=2, minibatch_size=16, n_optimizer_steps=2, eval_interval=0)


def _tictactoe(group_map=None):
    return SerialEnv(4, lambda: PettingZooEnv("tictactoe_v3", seed=0, group_map=group_map))


@pytest.mark.parametrize("algo", ["qmix", "vdn"])
def test_mixer_on_one_group_of_both_players_is_refused(algo):
    torch.manual_seed(0)
    env = _tictactoe()
    parts = make_groups(algo, env, QMIXConfig(), num_cells=(16,))
    with pytest.raises(ZeroTeamRewardError) as info:
        train_off_policy(env, parts, TrainConfig(**CFG))
    msg = str(info.value)
    assert f"{algo.upper()} on 'tictactoe_v3' (group 'agents')" in msg
    assert "agent rewards [1.0, -1.0]" in msg or "agent rewards [-1.0, 1.0]" in msg
    for advice in ("own group", "group_map=", "IPPO", "check_team_reward=False"):
        assert advice in msg


def _params(parts):
    return {g: [q.detach().clone() for q in p.loss.parameters()] for g, p in parts.items()}


def test_a_group_per_player_trains():
    torch.manual_seed(0)
    env = _tictactoe({"player_1": ["player_1"], "player_2": ["player_2"]})
    parts = make_groups("qmix", env, QMIXConfig(), num_cells=(16,))
    before = _params(parts)
    history = train_off_policy(env, parts, TrainConfig(**CFG))
    assert len(history) == 2 and all(torch.isfinite(torch.tensor(r["loss"])) for r in history)
    after = _params(parts)
    assert all(any(not torch.equal(a, b) for a, b in zip(before[g], after[g])) for g in parts)


def test_the_check_can_be_switched_off():
    torch.manual_seed(0)
    env = _tictactoe()
    parts = make_groups("vdn", env, QMIXConfig(), num_cells=(16,))
    history = train_off_policy(env, parts, TrainConfig(**CFG, check_team_reward=False))
    assert len(history) == 2


def test_check_decides_on_rewarded_transitions_only():
    zero_sum = torch.tensor([[1.0, -1.0], [0.0, 0.0]]).unsqueeze(-1)  # [T=2, n=2, 1]
    check = TeamRewardCheck("QMIX", "agents", None, min_events=3)
    for _ in range(2):  # 2 rewarded transitions so far: not enough to decide
        check.update(zero_sum, zero_sum.mean(-2))
    with pytest.raises(ZeroTeamRewardError, match=r"all 3 transitions.*\[1.0, -1.0\]"):
        check.update(zero_sum, zero_sum.mean(-2))
    # per-agent rewards that differ but do not cancel: a real team signal, checking stops
    team_game = torch.tensor([[1.0, -1.0], [0.5, 0.0]]).unsqueeze(-1)
    check = TeamRewardCheck("QMIX", "agents", None, min_events=3)
    check.update(team_game, team_game.mean(-2))
    assert not check.active
    for _ in range(5):
        check.update(zero_sum, zero_sum.mean(-2))  # no longer looked at
    # no rewards at all for max_batches batches: the check gives up without raising
    check = TeamRewardCheck("VDN", "agents", None, min_events=1, max_batches=3)
    for _ in range(3):
        check.update(torch.zeros(4, 2, 1), torch.zeros(4, 1))
    assert not check.active
