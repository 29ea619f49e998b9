"""BC (deterministic, Gaussian) and TD3+BC: hand-computed values on tiny inputs, parity with
a naive reference (Fujimoto & Gu's code in plain torch), and where the gradients go."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn

from tdrl.core.modules import Actor, IndependentNormal, ProbabilisticActor, ValueOperator
from tdrl.core.objectives import BCLoss, GaussianBCLoss, TD3BCLoss, TD3Loss, total_loss

torch.set_num_threads(1)


def batch(obs, action) -> TensorDict:
    obs, action = torch.tensor(obs), torch.tensor(action)
    n = obs.shape[0]
    return TensorDict(
        observation=obs, action=action,
        next=TensorDict(observation=obs + 1, reward=torch.ones(n, 1),
                        terminated=torch.zeros(n, 1, dtype=torch.bool), batch_size=[n]),
        batch_size=[n],
    )


def linear(n_in, n_out, weight) -> nn.Linear:
    layer = nn.Linear(n_in, n_out, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor(weight))
    return layer


class Critic(nn.Module):
    """``Q(s, a) = w . [s, a]``."""

    def __init__(self, weight) -> None:
        super().__init__()
        self.net = linear(len(weight[0]), 1, weight)

    def forward(self, obs, act):
        return self.net(torch.cat([obs, act], -1))


class GaussianHead(nn.Module):
    """``loc = W s``, ``scale = exp(log_std)`` (a free parameter)."""

    def __init__(self, weight, log_std) -> None:
        super().__init__()
        self.loc = linear(len(weight[0]), len(weight), weight)
        self.log_std = nn.Parameter(torch.tensor(log_std))

    def forward(self, obs):
        loc = self.loc(obs)
        return loc, self.log_std.exp().expand_as(loc)


# ----------------------------------------------------------------------------- BC
def test_bc_hand_value_reference_and_gradients():
    actor = Actor(linear(1, 2, [[1.0], [2.0]]))
    td = batch([[1.0], [2.0]], [[0.0, 0.0], [1.0, 1.0]])
    out = BCLoss(actor)(td)
    # pi = [[1, 2], [2, 4]]; errors 1, 2, 1, 3 -> (1 + 4 + 1 + 9) / 4
    assert out["loss_actor"].item() == pytest.approx(3.75)
    assert out["action_error"].item() == pytest.approx(7 / 4)
    ref = nn.functional.mse_loss(actor.module(td["observation"]), td["action"])
    assert out["loss_actor"].item() == pytest.approx(ref.item())
    total_loss(out).backward()
    # d/dW mean((W s - a)^2) = 2/4 * sum_i (W s_i - a_i) s_i
    expected = 0.5 * torch.tensor([[1 * 1 + 1 * 2], [2 * 1 + 3 * 2]], dtype=torch.float32)
    assert torch.allclose(actor.module.weight.grad, expected)
    assert out["action_error"].grad_fn is None  # diagnostics are detached


def test_bc_reads_rebound_action_key_and_checks_shapes():
    actor = Actor(linear(1, 1, [[1.0]]))
    td = batch([[1.0]], [[0.0]])
    td["expert_action"] = torch.tensor([[3.0]])
    loss = BCLoss(actor).set_keys(action="expert_action")
    with pytest.raises(KeyError, match="action"):
        loss(td)  # the actor now writes "expert_action": the module's out key must follow
    td2 = batch([[1.0]], [[0.0, 0.0]])
    with pytest.raises(ValueError, match="must match"):
        BCLoss(actor)(td2)


def gaussian_actor(weight, log_std):
    net = TensorDictModule(GaussianHead(weight, log_std), in_keys=["observation"],
                           out_keys=["loc", "scale"])
    return ProbabilisticActor(net, IndependentNormal)


def test_gaussian_bc_hand_value_reference_and_gradients():
    actor = gaussian_actor([[0.0]], [0.0])  # N(0, 1)
    td = batch([[1.0], [1.0]], [[1.0], [-2.0]])
    out = GaussianBCLoss(actor)(td)
    half_log_2pi = 0.5 * math.log(2 * math.pi)
    # -log N(a; 0, 1) = a^2 / 2 + log(2 pi) / 2, averaged over a = 1, -2
    assert out["loss_actor"].item() == pytest.approx((0.5 + 2.0) / 2 + half_log_2pi)
    assert out["entropy"].item() == pytest.approx(0.5 + half_log_2pi)

    actor2 = gaussian_actor([[0.5], [-1.0]], [0.3, -0.2])  # 2-d action, reference
    td2 = batch([[1.0], [2.0], [-1.0]], [[0.1, 0.2], [1.5, -2.0], [0.0, 0.4]])
    out2 = GaussianBCLoss(actor2)(td2)
    head = actor2.module[0].module
    loc, scale = head(td2["observation"])
    ref = -torch.distributions.Normal(loc, scale).log_prob(td2["action"]).sum(-1).mean()
    assert out2["loss_actor"].item() == pytest.approx(ref.item(), rel=1e-6)
    grads = torch.autograd.grad(out2["loss_actor"], [head.loc.weight, head.log_std])
    ref_grads = torch.autograd.grad(ref, [head.loc.weight, head.log_std])
    for g, r in zip(grads, ref_grads):
        assert torch.allclose(g, r, atol=1e-6)
    # d/dlog_std of mean NLL = mean(1 - (a - loc)^2 / scale^2) per action dim
    z2 = ((td2["action"] - loc) / scale).pow(2).detach()
    assert torch.allclose(grads[1], (1 - z2).mean(0), atol=1e-6)


# ----------------------------------------------------------------------------- TD3+BC
def td3bc_parts():
    actor = Actor(linear(1, 1, [[0.5]]))
    critic = ValueOperator(Critic([[1.0, 2.0]]), in_keys=["observation", "action"],
                           out_keys=["state_action_value"])
    return actor, critic


def test_td3bc_actor_loss_hand_value():
    actor, critic = td3bc_parts()
    loss = TD3BCLoss(actor, critic, action_low=-1.0, action_high=1.0, alpha=2.5)
    td = batch([[1.0], [2.0]], [[0.0], [1.0]])
    out = loss.actor_loss(td)
    # pi = [0.5, 1.0]; Q = s + 2 pi = [2, 4]; lambda = 2.5 / 3; mean Q = 3
    # bc = ((0.5 - 0)^2 + (1 - 1)^2) / 2 = 0.125 -> loss = -2.5 + 0.125
    assert out["lmbda"].item() == pytest.approx(2.5 / 3)
    assert out["bc_loss"].item() == pytest.approx(0.125)
    assert out["loss_actor"].item() == pytest.approx(-2.375)


def reference_actor_loss(actor_net, critic_net, obs, data_action, alpha=2.5):
    """Fujimoto & Gu's TD3_BC.py, actor update, in plain torch."""
    pi = actor_net(obs)
    q = critic_net(obs, pi)
    lmbda = alpha / q.abs().mean().detach()
    return -lmbda * q.mean() + nn.functional.mse_loss(pi, data_action)


def random_batch(n=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return batch(torch.randn(n, 3, generator=g).tolist(),
                 torch.rand(n, 2, generator=g).mul(2).sub(1).tolist())


def mlp_parts(seed=0):
    torch.manual_seed(seed)
    actor = Actor(nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2), nn.Tanh()))

    class Q(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 1))

        def forward(self, obs, act):
            return self.net(torch.cat([obs, act], -1))

    critic = ValueOperator(Q(), in_keys=["observation", "action"],
                           out_keys=["state_action_value"])
    return actor, critic


def test_td3bc_matches_reference_and_gradients_reach_the_actor_only():
    actor, critic = mlp_parts()
    ref_actor, ref_critic = copy.deepcopy(actor.module), copy.deepcopy(critic.module)
    loss = TD3BCLoss(actor, critic, action_low=-1.0, action_high=1.0)
    td = random_batch()
    out = loss.actor_loss(td)
    ref = reference_actor_loss(ref_actor, ref_critic, td["observation"], td["action"])
    assert out["loss_actor"].item() == pytest.approx(ref.item(), rel=1e-5)
    out["loss_actor"].backward()
    ref.backward()
    for p, r in zip(actor.module.parameters(), ref_actor.parameters()):
        assert torch.allclose(p.grad, r.grad, atol=1e-6)
    critic_params = [p for q in loss.qvalue for p in q.parameters()]
    assert all(p.grad is None for p in critic_params)  # the actor loss leaves the critics
    target_params = list(loss.td3.target_actor.parameters()) + list(
        loss.td3.target_qvalue.parameters())
    assert all(p.grad is None and not p.requires_grad for p in target_params)


def test_td3bc_critic_is_td3s_and_does_not_touch_the_actor():
    actor, critic = mlp_parts()
    torch.manual_seed(1)
    ours = TD3BCLoss(actor, critic, action_low=-1.0, action_high=1.0, gamma=0.9)
    torch.manual_seed(1)
    theirs = TD3Loss(copy.deepcopy(actor), copy.deepcopy(critic), action_low=-1.0,
                     action_high=1.0, gamma=0.9)
    td = random_batch(seed=3)
    torch.manual_seed(2)
    a = ours(td)
    torch.manual_seed(2)
    b = theirs.qvalue_loss(td.clone())
    assert a["loss_qvalue"].item() == pytest.approx(b["loss_qvalue"].item(), rel=1e-6)
    a["loss_qvalue"].backward()
    assert all(p.grad is None for p in actor.parameters())
    assert all(p.grad is not None for q in ours.qvalue for p in q.parameters())
    assert {"loss_actor", "loss_qvalue", "lmbda", "bc_loss"} <= set(a.keys())
    assert len(list(ours.target_pairs())) == 2  # SoftUpdate finds the TD3 targets


def test_td3bc_alpha_zero_is_behaviour_cloning():
    actor, critic = mlp_parts()
    td = random_batch()
    a = TD3BCLoss(actor, critic, action_low=-1.0, action_high=1.0, alpha=0.0).actor_loss(td)
    b = BCLoss(actor)(td)
    assert a["loss_actor"].item() == pytest.approx(b["loss_actor"].item(), rel=1e-6)
    with pytest.raises(ValueError, match="alpha must be >= 0"):
        TD3BCLoss(actor, critic, action_low=-1.0, action_high=1.0, alpha=-1.0)
