"""DQN (plain, double, dueling network) and the target updaters."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn

from tdrl.core.modules import MLP, DuelingHead, QValueActor
from tdrl.core.objectives import DQNLoss, HardUpdate, SoftUpdate, total_loss


class Table(nn.Module):
    """Tabular Q: observation is a one-hot state, output Q[state]."""

    def __init__(self, q):
        super().__init__()
        self.q = nn.Parameter(torch.tensor(q))

    def forward(self, obs):
        return obs @ self.q


def transitions():
    # two transitions from state 0 to state 1 (actions 0 and 1), reward 1, not terminated
    td = TensorDict(
        observation=torch.tensor([[1.0, 0.0], [1.0, 0.0]]),
        action=torch.tensor([0, 1]),
        next=TensorDict(
            observation=torch.tensor([[0.0, 1.0], [0.0, 1.0]]),
            reward=torch.ones(2, 1),
            terminated=torch.tensor([[False], [True]]),
            done=torch.tensor([[False], [True]]),
            batch_size=[2],
        ),
        batch_size=[2],
    )
    return td


def q_module(q):
    return TensorDictModule(Table(q), in_keys=["observation"], out_keys=["action_value"])


def test_dqn_target_golden_plain_and_double():
    net = q_module([[1.0, 2.0], [3.0, 5.0]])
    loss = DQNLoss(net, gamma=0.5, loss_function="l2")
    # the target net disagrees with the online net on the greedy next action
    with torch.no_grad():
        loss.target_value_network.module.q.copy_(torch.tensor([[0.0, 0.0], [4.0, 2.0]]))
    out = loss(transitions())
    # plain: max_a Q_target(s1) = 4 -> target 1 + 0.5 * 4 = 3 (second: terminated -> 1)
    expected = 0.5 * ((1.0 - 3.0) ** 2 + (2.0 - 1.0) ** 2) / 2
    torch.testing.assert_close(out["loss_qvalue"], torch.tensor(expected))
    double = DQNLoss(net, gamma=0.5, loss_function="l2", double_dqn=True)
    with torch.no_grad():
        double.target_value_network.module.q.copy_(torch.tensor([[0.0, 0.0], [4.0, 2.0]]))
    td = transitions()
    out = double(td)
    # double: argmax online Q(s1) = action 1, evaluated by the target: 2 -> target 2
    expected = 0.5 * ((1.0 - 2.0) ** 2 + (2.0 - 1.0) ** 2) / 2
    torch.testing.assert_close(out["loss_qvalue"], torch.tensor(expected))
    torch.testing.assert_close(td["td_error"], torch.tensor([1.0, 1.0]))


def test_dqn_one_hot_actions_and_action_mask():
    net = q_module([[1.0, 2.0], [3.0, 5.0]])
    loss = DQNLoss(net, gamma=0.5, loss_function="l2", use_action_mask=True)
    td = transitions()
    td["action"] = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    td["next", "action_mask"] = torch.tensor([[True, False], [True, False]])
    out = loss(td)
    # masked: next value = Q(s1, 0) = 3 -> target 2.5; second terminated -> 1
    expected = 0.5 * ((1.0 - 2.5) ** 2 + (2.0 - 1.0) ** 2) / 2
    torch.testing.assert_close(out["loss_qvalue"], torch.tensor(expected))


def test_dqn_gradient_steps_learn_bandit_with_dueling_net():
    torch.manual_seed(0)
    actor = QValueActor(nn.Sequential(MLP(2, 16, num_cells=(16,), activate_last=True),
                                      DuelingHead(16, 2)))
    n = 64
    action = torch.randint(2, (n,))
    td = TensorDict(
        observation=torch.tensor([1.0, 0.0]).expand(n, 2).clone(),
        action=action,
        next=TensorDict(
            observation=torch.zeros(n, 2),
            reward=(action == 1).float().unsqueeze(-1),  # action 1 pays 1, then terminal
            terminated=torch.ones(n, 1, dtype=torch.bool),
            batch_size=[n],
        ),
        batch_size=[n],
    )
    loss = DQNLoss(actor, gamma=0.9)
    opt = torch.optim.Adam(loss.value_network.parameters(), lr=1e-2)
    first = loss(td)["loss_qvalue"].item()
    for _ in range(100):
        out = loss(td)
        opt.zero_grad()
        total_loss(out).backward()
        opt.step()
    assert loss(td)["loss_qvalue"].item() < 0.1 * first
    greedy = actor(TensorDict(observation=torch.tensor([[1.0, 0.0]]), batch_size=[1]))
    assert greedy["action"].item() == 1


def test_soft_and_hard_update():
    net = q_module([[1.0, 2.0], [3.0, 5.0]])
    loss = DQNLoss(net)
    target = loss.target_value_network.module.q
    assert not target.requires_grad
    with torch.no_grad():
        net.module.q.add_(1.0)
    soft = SoftUpdate(loss, tau=0.25)
    soft.step()
    torch.testing.assert_close(target, torch.tensor([[1.25, 2.25], [3.25, 5.25]]))
    hard = HardUpdate(loss, update_interval=2)
    hard.step()
    torch.testing.assert_close(target, torch.tensor([[1.25, 2.25], [3.25, 5.25]]))
    hard.step()
    torch.testing.assert_close(target, net.module.q.detach())
    with pytest.raises(ValueError, match="tau"):
        SoftUpdate(loss, tau=0.0)


def test_dqn_bad_input():
    net = q_module([[1.0, 2.0], [3.0, 5.0]])
    td = transitions().exclude(("next", "reward"))
    with pytest.raises(KeyError, match=r"\('next', 'reward'\).*Keys found"):
        DQNLoss(net)(td)
    td = transitions()
    td["next", "reward"] = torch.tensor([[float("inf")], [1.0]])
    with pytest.raises(FloatingPointError, match="loss_qvalue"):
        DQNLoss(net, check_finite=True)(td)
