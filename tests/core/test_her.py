"""HER relabelling on hand-made episodes: each strategy's goals and rewards by hand."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdrl.core.replay import LazyTensorStorage, ReplayBuffer
from tdrl.core.replay.her import HERTransform, her_relabel_fraction

torch.set_num_threads(1)

# episode 0: 4 steps, achieved goal t -> t + 1, desired 10; episode 1: 3 steps, 20 + t, desired 30
NEXT_AG = [1.0, 2.0, 3.0, 4.0, 21.0, 22.0, 23.0]
AG = [0.0, 1.0, 2.0, 3.0, 20.0, 21.0, 22.0]
DESIRED = [10.0] * 4 + [30.0] * 3
EPISODE = [0] * 4 + [1] * 3


def reward_fn(achieved: torch.Tensor, desired: torch.Tensor) -> torch.Tensor:
    """Sparse: 0 when the goal is reached, else -1 (Fetch's convention)."""
    return -((achieved - desired).abs() > 0.5).float().squeeze(-1)


def col(values) -> torch.Tensor:
    return torch.tensor(values).unsqueeze(-1)


def storage() -> LazyTensorStorage:
    n = len(AG)
    td = TensorDict(
        observation=torch.zeros(n, 2), achieved_goal=col(AG), desired_goal=col(DESIRED),
        action=torch.zeros(n, 1), episode=torch.tensor(EPISODE),
        next=TensorDict(observation=torch.zeros(n, 2), achieved_goal=col(NEXT_AG),
                        desired_goal=col(DESIRED), reward=-torch.ones(n, 1),
                        done=col([False] * 3 + [True] + [False] * 2 + [True]).bool(),
                        batch_size=[n]),
        batch_size=[n],
    )
    s = LazyTensorStorage(20)
    s.set(slice(0, n), td)
    return s


def batch_of(s, index) -> TensorDict:
    index = torch.as_tensor(index)
    out = s.get(index)
    out["index"] = index
    return out


def relabel(strategy, index, **kw):
    s = storage()
    her = HERTransform(s, reward_fn, strategy=strategy, relabel_fraction=1.0,
                       generator=torch.Generator().manual_seed(0), **kw)
    return her(batch_of(s, index))


def test_final_goal_and_reward_by_hand():
    out = relabel("final", range(7))
    # each episode's last achieved goal: 4 for episode 0, 23 for episode 1
    assert out["desired_goal"].view(-1).tolist() == [4.0] * 4 + [23.0] * 3
    assert out["next", "desired_goal"].view(-1).tolist() == [4.0] * 4 + [23.0] * 3
    # reached only by the last step of each episode
    assert out["next", "reward"].view(-1).tolist() == [-1, -1, -1, 0, -1, -1, 0]
    # nothing else changes
    assert out["achieved_goal"].view(-1).tolist() == AG
    assert out["next", "achieved_goal"].view(-1).tolist() == NEXT_AG


def test_future_goals_by_hand():
    index = torch.arange(7).repeat(300)
    out = relabel("future", index)
    goals = out["desired_goal"].view(-1)
    allowed = {0: {1, 2, 3, 4}, 1: {2, 3, 4}, 2: {3, 4}, 3: {4}, 4: {21, 22, 23}, 5: {22, 23},
               6: {23}}
    for t, values in allowed.items():
        seen = set(goals[index == t].tolist())
        assert seen == values, (t, seen)  # never a past step, never another episode
    reward = out["next", "reward"].view(-1)
    reached = goals == torch.tensor(NEXT_AG)[index]  # goal = this step's own achieved goal
    assert torch.equal(reward, torch.where(reached, 0.0, -1.0))
    assert (reward[index == 3] == 0).all() and (reward[index == 6] == 0).all()
    # t' uniform in [t, T-1]: step 0 draws each of its 4 future goals ~1/4 of the time
    share = (goals[index == 0] == 1).float().mean().item()
    assert 0.17 < share < 0.33


def test_episode_goals_by_hand():
    index = torch.arange(7).repeat(300)
    out = relabel("episode", index)
    goals = out["desired_goal"].view(-1)
    for t in range(7):
        expected = {1, 2, 3, 4} if t < 4 else {21, 22, 23}  # past steps allowed too
        assert set(goals[index == t].tolist()) == expected
    assert torch.equal(out["next", "desired_goal"].view(-1), goals)
    reached = goals == torch.tensor(NEXT_AG)[index]
    assert torch.equal(out["next", "reward"].view(-1), torch.where(reached, 0.0, -1.0))


def test_relabel_fraction_k4_is_exactly_80_percent_and_the_rest_untouched():
    assert her_relabel_fraction(4) == 0.8
    s = storage()
    her = HERTransform(s, reward_fn, strategy="final", k=4,
                       generator=torch.Generator().manual_seed(1))
    index = torch.tensor([0, 1, 2, 4, 5, 0, 1, 2, 4, 5])  # none is an episode's last step
    out = her(batch_of(s, index))
    stored = torch.tensor(DESIRED)[index]
    changed = out["desired_goal"].view(-1) != stored
    assert int(changed.sum()) == 8
    kept = ~changed
    assert (out["next", "desired_goal"].view(-1)[kept] == stored[kept]).all()
    assert (out["next", "reward"].view(-1)[kept] == -1).all()
    expected_final = torch.where(index < 4, 4.0, 23.0)
    assert torch.equal(out["desired_goal"].view(-1)[changed], expected_final[changed])


def test_in_a_replay_buffer_rewards_match_the_goals():
    s = storage()
    her = HERTransform(s, reward_fn, strategy="future", generator=torch.Generator().manual_seed(2))
    rb = ReplayBuffer(s, batch_size=64, transform=her)
    torch.manual_seed(0)
    out = rb.sample()
    assert out.shape == (64,)
    assert torch.equal(out["desired_goal"], out["next", "desired_goal"])
    expected = reward_fn(out["next", "achieved_goal"], out["desired_goal"])
    assert torch.equal(out["next", "reward"].view(-1), expected)
    assert (out["next", "reward"] == 0).any()  # hindsight made some successes


def test_bad_settings_say_what_to_do():
    s = storage()
    with pytest.raises(ValueError, match="Unknown HER strategy 'past'"):
        HERTransform(s, reward_fn, strategy="past")
    with pytest.raises(ValueError, match="not both"):
        HERTransform(s, reward_fn, k=4, relabel_fraction=0.5)
    with pytest.raises(ValueError, match=r"relabel_fraction must be in \[0, 1\]"):
        HERTransform(s, reward_fn, relabel_fraction=1.5)
    with pytest.raises(KeyError, match="episode_key="):
        HERTransform(s, reward_fn, episode_key="traj")(batch_of(s, [0]))
    with pytest.raises(KeyError, match="'index'"):
        HERTransform(s, reward_fn)(s.get(torch.tensor([0])))
