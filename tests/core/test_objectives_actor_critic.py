"""DDPG, TD3, SAC and discrete SAC: golden targets and gradient steps on bandits."""

from __future__ import annotations

import math

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule, InteractionType, set_interaction_type
from torch import nn

from tdrl.core.modules import (
    MLP,
    Actor,
    MaskedCategorical,
    NormalParamExtractor,
    ProbabilisticActor,
    TanhNormal,
    ValueOperator,
)
from tdrl.core.objectives import DDPGLoss, DiscreteSACLoss, SACLoss, SoftUpdate, TD3Loss, total_loss


def continuous_bandit(n=128, seed=0):
    """One-step episodes; reward -(a - 0.5)^2 for a 1-d action in [-1, 1]."""
    g = torch.Generator().manual_seed(seed)
    action = torch.rand(n, 1, generator=g) * 2 - 1
    return TensorDict(
        observation=torch.ones(n, 1),
        action=action,
        next=TensorDict(
            observation=torch.ones(n, 1),
            reward=-(action - 0.5) ** 2,
            terminated=torch.ones(n, 1, dtype=torch.bool),
            done=torch.ones(n, 1, dtype=torch.bool),
            batch_size=[n],
        ),
        batch_size=[n],
    )


def qnet():
    return ValueOperator(
        MLP(2, 1, num_cells=(32, 32), activation=nn.ReLU),
        in_keys=["observation", "action"], out_keys=["state_action_value"],
    )


def _start_at(mlp, loc):
    """Start the policy far from the optimum: output layer = constant ``loc``."""
    last = mlp[-1]
    with torch.no_grad():
        last.weight.zero_()
        last.bias.zero_()
        last.bias[0] = loc
    return mlp


def det_actor():
    return Actor(nn.Sequential(_start_at(MLP(1, 1, num_cells=(16,)), -0.7), nn.Tanh()))


def tanh_actor():
    net = TensorDictModule(
        nn.Sequential(_start_at(MLP(1, 2, num_cells=(16,)), -0.7), NormalParamExtractor()),
        in_keys=["observation"], out_keys=["loc", "scale"],
    )
    return ProbabilisticActor(net, TanhNormal)


def greedy_action(actor):
    td = TensorDict(observation=torch.ones(1, 1), batch_size=[1])
    with set_interaction_type(InteractionType.DETERMINISTIC), torch.no_grad():
        return actor(td)["action"].item()


def train(loss, td, steps, lr=3e-3):
    opt = torch.optim.Adam(loss.parameters(), lr=lr)
    updater = SoftUpdate(loss, tau=0.05)
    for _ in range(steps):
        out = loss(td)
        opt.zero_grad()
        total_loss(out).backward()
        opt.step()
        updater.step()
    return out


@pytest.mark.parametrize("kind", ["ddpg", "td3", "sac"])
def test_gradient_steps_move_action_to_the_best(kind):
    torch.manual_seed(0)
    td = continuous_bandit()
    actor = det_actor() if kind != "sac" else tanh_actor()
    if kind == "ddpg":
        loss = DDPGLoss(actor, qnet())
    elif kind == "td3":
        loss = TD3Loss(actor, qnet(), action_low=-1.0, action_high=1.0)
    else:
        loss = SACLoss(actor, qnet(), alpha_init=0.01)
    start = abs(greedy_action(actor) - 0.5)
    first = loss(td)["loss_qvalue"].item()
    train(loss, td, 250, lr=1e-2)
    assert loss(td)["loss_qvalue"].item() < 0.2 * first
    assert start > 1.0
    assert abs(greedy_action(actor) - 0.5) < 0.15


def test_actor_loss_does_not_update_the_critic():
    torch.manual_seed(0)
    loss = DDPGLoss(det_actor(), qnet())
    loss.actor_loss(continuous_bandit(8))["loss_actor"].backward()
    assert all(p.grad is None for p in loss.qvalue.parameters())
    assert all(p.grad is not None for p in loss.actor.parameters())


def test_ddpg_target_golden():
    q = ValueOperator(lambda o, a: o + a, in_keys=["observation", "action"],
                      out_keys=["state_action_value"])
    actor = Actor(lambda o: 2 * o)
    loss = DDPGLoss(actor, q, gamma=0.5)
    td = continuous_bandit(2)
    td["next", "terminated"] = torch.tensor([[False], [True]])
    td["next", "observation"] = torch.tensor([[1.0], [3.0]])
    out = loss.qvalue_loss(td)
    # target = r + 0.5 * (1 - term) * (o' + 2 o')
    r = td["next", "reward"]
    target = r + 0.5 * torch.tensor([[3.0], [0.0]])
    torch.testing.assert_close(out["target_mean"], target.mean())


def test_ddpg_without_delayed_actor_bootstraps_from_the_online_actor():
    """``delay_actor=False`` (TorchRL's default, BenchMARL's MADDPG): no target actor; the next
    action comes from the online actor, so moving it moves the target."""
    q = ValueOperator(lambda o, a: o + a, in_keys=["observation", "action"], out_keys=["state_action_value"])
    net = nn.Linear(1, 1, bias=False)
    nn.init.constant_(net.weight, 2.0)
    loss = DDPGLoss(Actor(net), q, gamma=0.5, delay_actor=False)
    assert not hasattr(loss, "target_actor") and len(list(loss.target_pairs())) == 1
    td = continuous_bandit(2)
    td["next", "terminated"] = torch.tensor([[False], [False]])
    td["next", "observation"] = torch.tensor([[1.0], [3.0]])
    r = td["next", "reward"]
    torch.testing.assert_close(loss.qvalue_loss(td)["target_mean"], (r + 0.5 * torch.tensor([[3.0], [9.0]])).mean())
    with torch.no_grad():
        net.weight.fill_(1.0)  # online actor a = o: the target follows at once
    torch.testing.assert_close(loss.qvalue_loss(td)["target_mean"], (r + 0.5 * torch.tensor([[2.0], [6.0]])).mean())


def test_sac_min_max_alpha_clamp_the_temperature():
    loss = SACLoss(tanh_actor(), qnet(), alpha_init=1.0, min_alpha=0.1, max_alpha=0.5)
    assert float(loss.temperature.alpha) == pytest.approx(0.5)
    with torch.no_grad():
        loss.temperature.log_alpha.fill_(math.log(0.01))
    assert float(loss.temperature.alpha) == pytest.approx(0.1)


def test_td3_uses_the_min_of_two_critics_and_smoothing():
    torch.manual_seed(0)
    loss = TD3Loss(det_actor(), qnet(), action_low=-1.0, action_high=1.0, num_qvalue_nets=2)
    assert len(loss.qvalue) == 2
    p0 = list(loss.qvalue[0].parameters())[0]
    p1 = list(loss.qvalue[1].parameters())[0]
    assert not torch.equal(p0, p1)  # the second critic is re-initialised
    out = loss(continuous_bandit(8))
    assert set(out.keys()) >= {"loss_actor", "loss_qvalue", "td_error"}


def test_sac_alpha_tuning_direction():
    torch.manual_seed(0)
    td = continuous_bandit(64)
    loss = SACLoss(tanh_actor(), qnet(), alpha_init=1.0)
    out = loss(td)
    assert loss.temperature.target_entropy == -1.0  # auto: -action_dim
    # entropy of the initial policy is above -1: alpha must decrease
    assert out["entropy"] > -1.0
    opt = torch.optim.SGD([loss.temperature.log_alpha], lr=0.1)
    out["loss_alpha"].backward()
    opt.step()
    assert loss.temperature.alpha < 1.0


def test_tanh_normal_log_prob_is_stable_at_the_bounds():
    dist = TanhNormal(torch.tensor([[8.0]]), torch.tensor([[0.1]]))
    action, lp = dist.rsample_with_log_prob()
    assert torch.isfinite(lp).all()
    assert torch.isfinite(dist.log_prob(torch.tensor([[1.0]]))).all()


def test_discrete_sac_golden_target_and_learning():
    torch.manual_seed(0)
    n = 96
    action = torch.arange(n) % 3
    td = TensorDict(
        observation=torch.ones(n, 1),
        action=action,
        next=TensorDict(
            observation=torch.ones(n, 1),
            reward=(action == 1).float().unsqueeze(-1),
            terminated=torch.ones(n, 1, dtype=torch.bool),
            batch_size=[n],
        ),
        batch_size=[n],
    )
    actor = ProbabilisticActor(
        TensorDictModule(MLP(1, 3, num_cells=(16,)), in_keys=["observation"], out_keys=["logits"]),
        MaskedCategorical, in_keys=["logits"],
    )
    q = TensorDictModule(MLP(1, 3, num_cells=(16,)), in_keys=["observation"],
                         out_keys=["action_value"])
    loss = DiscreteSACLoss(actor, q, num_actions=3, alpha_init=0.05)
    assert math.isclose(loss.temperature.target_entropy, 0.98 * math.log(3))
    out = loss.qvalue_loss(td)  # terminated: target = reward exactly
    torch.testing.assert_close(out["target_mean"], torch.tensor(1 / 3))
    train(loss, td, 120, lr=1e-2)
    probs = actor.get_dist(td[:1]).probs[0]
    assert probs[1] > 0.6


def test_bad_input_names_key():
    loss = SACLoss(tanh_actor(), qnet())
    td = continuous_bandit(4).exclude(("next", "terminated"))
    with pytest.raises(KeyError, match=r"\('next', 'terminated'\).*Keys found"):
        loss(td)
    td = continuous_bandit(4)
    td["next", "reward"][0] = float("nan")
    with pytest.raises(FloatingPointError, match="loss_qvalue"):
        SACLoss(tanh_actor(), qnet(), check_finite=True)(td)
