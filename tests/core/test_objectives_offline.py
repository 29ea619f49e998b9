"""IQL and CQL: golden pieces and gradient steps on an offline bandit dataset."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import InteractionType, TensorDictModule, set_interaction_type
from torch import nn

from tdrl.core.modules import MLP, NormalParamExtractor, ProbabilisticActor, TanhNormal, ValueOperator
from tdrl.core.objectives import CQLLoss, IQLLoss, SoftUpdate, total_loss
from tdrl.core.objectives.iql import expectile_loss


def dataset(n=128, seed=0):
    """Offline one-step data: behaviour actions near -0.5 (poor) and +0.5 (good)."""
    g = torch.Generator().manual_seed(seed)
    good = torch.arange(n) % 2 == 0
    action = torch.where(good, 0.5, -0.5).unsqueeze(-1) + 0.05 * torch.randn(n, 1, generator=g)
    return TensorDict(
        observation=torch.ones(n, 1),
        action=action,
        next=TensorDict(
            observation=torch.ones(n, 1),
            reward=good.float().unsqueeze(-1),
            terminated=torch.ones(n, 1, dtype=torch.bool),
            batch_size=[n],
        ),
        batch_size=[n],
    )


def actor():
    net = TensorDictModule(
        nn.Sequential(MLP(1, 2, num_cells=(16,)), NormalParamExtractor()),
        in_keys=["observation"], out_keys=["loc", "scale"],
    )
    return ProbabilisticActor(net, TanhNormal)


def qnet():
    return ValueOperator(MLP(2, 1, num_cells=(32,), activation=nn.ReLU),
                         in_keys=["observation", "action"], out_keys=["state_action_value"])


def greedy(policy):
    td = TensorDict(observation=torch.ones(1, 1), batch_size=[1])
    with set_interaction_type(InteractionType.DETERMINISTIC), torch.no_grad():
        return policy(td)["action"].item()


def train(loss, td, steps, lr=1e-2):
    opt = torch.optim.Adam(loss.parameters(), lr=lr)
    soft = SoftUpdate(loss, tau=0.1)
    for _ in range(steps):
        out = loss(td)
        opt.zero_grad()
        total_loss(out).backward()
        opt.step()
        soft.step()
    return out


def test_expectile_loss_golden():
    diff = torch.tensor([2.0, -2.0])
    torch.testing.assert_close(expectile_loss(diff, 0.7), torch.tensor([0.7 * 4, 0.3 * 4]))


def test_iql_learns_to_imitate_the_good_actions():
    torch.manual_seed(0)
    td = dataset()
    pi = actor()
    v = ValueOperator(MLP(1, 1, num_cells=(16,)))
    loss = IQLLoss(pi, qnet(), v, expectile=0.9, temperature=5.0)
    out = train(loss, td, 200)
    # V is an upper expectile of Q over the data actions: between the mean 0.5 and max 1
    assert 0.5 < out["value_mean"].item() < 1.0
    assert abs(greedy(pi) - 0.5) < 0.2


def test_iql_value_loss_golden():
    q = ValueOperator(lambda o, a: a, in_keys=["observation", "action"],
                      out_keys=["state_action_value"])
    v = ValueOperator(lambda o: torch.zeros_like(o))
    loss = IQLLoss(actor(), q, v, expectile=0.8, num_qvalue_nets=1)
    td = dataset(2)
    td["action"] = torch.tensor([[1.0], [-2.0]])
    out = loss.value_loss(td)
    torch.testing.assert_close(out["loss_value"], torch.tensor((0.8 * 1 + 0.2 * 4) / 2))


def test_cql_pushes_down_out_of_distribution_q():
    """Same data, same init: SAC extrapolates Q to the unseen action +1 above the best
    data action; CQL keeps it below."""
    import copy

    from tdrl.core.objectives import SACLoss

    td = dataset(64)
    torch.manual_seed(0)
    pi, q = actor(), qnet()
    probe = TensorDict(observation=torch.ones(2, 1), action=torch.tensor([[0.5], [1.0]]),
                       batch_size=[2])
    values = {}
    for name in ("sac", "cql"):
        torch.manual_seed(1)
        pi_i, q_i = copy.deepcopy(pi), copy.deepcopy(q)
        if name == "sac":
            loss = SACLoss(pi_i, q_i, alpha_init=0.05)
        else:
            loss = CQLLoss(pi_i, q_i, action_low=-1.0, action_high=1.0, num_random=4,
                           min_q_weight=1.0, alpha_init=0.05)
        train(loss, td, 60)
        with torch.no_grad():
            values[name] = q_i(probe.clone())["state_action_value"].squeeze(-1)
    assert values["sac"][1] > values["sac"][0]  # extrapolation error without CQL
    assert values["cql"][1] < values["cql"][0]
    assert values["cql"][1] < values["sac"][1] - 0.5


def test_cql_set_keys_reaches_the_inner_sac_and_bad_input():
    loss = CQLLoss(actor(), qnet(), action_low=-1.0, action_high=1.0)
    loss.set_keys(reward="r")
    assert loss.sac.tensor_keys.reward == "r"
    with pytest.raises(KeyError, match=r"\('next', 'r'\)"):
        loss(dataset(4))


def test_cql_target_pairs_are_the_inner_sacs_and_a_bad_distance_is_refused():
    loss = CQLLoss(actor(), qnet(), action_low=-1.0, action_high=1.0)
    pairs = list(loss.target_pairs())
    assert pairs == list(loss.sac.target_pairs()) and len(pairs) == 1
    online, target = pairs[0]
    assert online is loss.sac.qvalue and target is loss.sac.target_qvalue
    with pytest.raises(ValueError, match="loss kind must be one of 'l2', 'mse', 'l1', 'smooth_l1', got 'huber'"):
        CQLLoss(actor(), qnet(), action_low=-1.0, action_high=1.0, loss_function="huber")
