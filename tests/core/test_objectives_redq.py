"""REDQLoss: hand values, a naive per-sample loop reference (loss and gradients), the batched
ensemble against a per-critic loop of separate modules (losses and gradients to 1e-6), M = N is
SAC's target, soft updates and the state-dict round trip of the stacked layout, the subset
draws, bad settings."""

from __future__ import annotations

import copy

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn
from torch.func import functional_call

from tdrl.core.modules import MLP, NormalParamExtractor, ProbabilisticActor, TanhNormal, ValueOperator
from tdrl.core.objectives import REDQLoss, SACLoss, SoftUpdate
from tdrl.core.objectives.common import distance_loss


class _PointMass:
    """A distribution that always returns ``loc`` with a given log-prob (hand-made input)."""

    def __init__(self, loc, log_prob):
        self.loc, self.lp = loc, log_prob

    def rsample_with_log_prob(self, sample_shape=()):
        return self.loc, torch.full(self.loc.shape[:-1], self.lp)


class _FixedActor(nn.Module):
    def __init__(self, log_prob):
        super().__init__()
        self.lp = log_prob

    def get_dist(self, td):
        return _PointMass(torch.zeros(*td.batch_size, 1), self.lp)


def _const_critic():
    return ValueOperator(MLP(2, 1, num_cells=()), in_keys=["observation", "action"],
                         out_keys=["state_action_value"])


def _batch(n, obs_dim=1, act_dim=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    term = torch.zeros(n, 1, dtype=torch.bool)
    term[::2] = True
    return TensorDict(
        observation=torch.randn(n, obs_dim, generator=g),
        action=torch.rand(n, act_dim, generator=g) * 2 - 1,
        next=TensorDict(observation=torch.randn(n, obs_dim, generator=g),
                        reward=torch.randn(n, 1, generator=g), terminated=term,
                        done=term.clone(), batch_size=[n]),
        batch_size=[n],
    )


def test_hand_values():
    """Critics Q_i = c_i (constant), c = [1, -2, 3, 0.5], subset {0, 3}: min = 0.5;
    alpha 0.2, log pi = -1, gamma 0.9, reward 0.5: target 0.5 + 0.9 * (0.5 + 0.2) = 1.13
    (0.5 where terminated); actor -mean(c) + alpha log pi = -0.625 - 0.2."""
    c = [1.0, -2.0, 3.0, 0.5]
    loss = REDQLoss(_FixedActor(-1.0), _const_critic(), num_qvalue_nets=4, subset_size=2,
                    gamma=0.9, alpha_init=0.2, fixed_alpha=True)
    with torch.no_grad():
        for nets in (loss.qvalue, loss.target_qvalue):
            params = nets.net.stacked()
            assert sorted(params) == ["0.bias", "0.weight"] and params["0.bias"].shape == (4, 1)
            params["0.weight"].zero_()
            params["0.bias"].copy_(torch.tensor(c)[:, None])
    loss.draw_subset = lambda: torch.tensor([0, 3])
    td = TensorDict(observation=torch.zeros(2, 1), action=torch.zeros(2, 1),
                    next=TensorDict(observation=torch.zeros(2, 1), reward=torch.full((2, 1), 0.5),
                                    terminated=torch.tensor([[False], [True]]), batch_size=[2]),
                    batch_size=[2])
    out = loss(td)
    assert out["target_mean"].item() == pytest.approx((1.13 + 0.5) / 2)
    want = sum(0.25 * ((ci - 1.13) ** 2 + (ci - 0.5) ** 2) for ci in c)
    assert out["loss_qvalue"].item() == pytest.approx(want, rel=1e-6)
    assert out["loss_actor"].item() == pytest.approx(-0.625 - 0.2, rel=1e-6)
    assert "loss_alpha" not in out.keys()


def _redq(n, m, seed=0):
    torch.manual_seed(seed)
    net = TensorDictModule(nn.Sequential(MLP(3, 4, num_cells=(8,)), NormalParamExtractor()),
                           in_keys=["observation"], out_keys=["loc", "scale"])
    actor = ProbabilisticActor(net, TanhNormal)
    critic = ValueOperator(MLP(5, 1, num_cells=(8,)), in_keys=["observation", "action"],
                           out_keys=["state_action_value"])
    loss = REDQLoss(actor, critic, num_qvalue_nets=n, subset_size=m, gamma=0.95, alpha_init=0.3,
                    generator=torch.Generator().manual_seed(7))
    with torch.no_grad():  # targets differ from the online critics
        for p in loss.target_qvalue.parameters():
            p.add_(0.1 * torch.randn_like(p))
    loss._critic = critic.module  # a real module of the critics' architecture, for the references
    return loss


def _q(loss, ens, i, obs, act):
    """Critic ``i`` of the stacked ensemble ``ens`` alone (its slice of the stacked parameters)."""
    return functional_call(loss._critic, {n: p[i] for n, p in ens.net.stacked().items()}, (obs, act))


def test_matches_a_naive_loop_reference():
    """Per-sample loop over the batch and the drawn critics (same subset, same sampled next
    actions): equal critic loss and critic gradients; equal actor loss and actor gradients."""
    n, m, b = 5, 2, 6
    loss = _redq(n, m)
    td = _batch(b, obs_dim=3, act_dim=2)
    subset = torch.randperm(n, generator=torch.Generator().manual_seed(7))[:m]
    torch.manual_seed(1)
    out = loss.qvalue_loss(td.clone())
    grads = torch.autograd.grad(out["loss_qvalue"], list(loss.qvalue.parameters()))

    torch.manual_seed(1)
    nxt = td["next"]
    a2, lp2 = loss.actor.get_dist(nxt.copy()).rsample_with_log_prob()
    alpha = loss.temperature.alpha
    ref = 0.0
    for i in range(n):
        per = []
        for j in range(b):
            with torch.no_grad():
                qmin = min(_q(loss, loss.target_qvalue, int(s), nxt["observation"][j], a2[j]).item()
                           for s in subset)
                y = nxt["reward"][j, 0] + 0.95 * (0.0 if nxt["terminated"][j, 0] else 1.0) * (
                    qmin - alpha * lp2[j])
            q = _q(loss, loss.qvalue, i, td["observation"][j], td["action"][j])[0]
            per.append(0.5 * (q - y) ** 2)
        ref = ref + sum(per) / b
    assert out["loss_qvalue"].item() == pytest.approx(ref.item(), rel=1e-5)
    ref_grads = torch.autograd.grad(ref, list(loss.qvalue.parameters()))
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-6)

    torch.manual_seed(2)
    out = loss.actor_loss(td.clone())
    agrads = torch.autograd.grad(out["loss_actor"], list(loss.actor.parameters()))
    torch.manual_seed(2)
    a, lp = loss.actor.get_dist(td.copy()).rsample_with_log_prob()
    ref = 0.0
    for j in range(b):
        qbar = sum(_q(loss, loss.qvalue, i, td["observation"][j], a[j])[0] for i in range(n)) / n
        ref = ref + (alpha * lp[j] - qbar) / b
    assert out["loss_actor"].item() == pytest.approx(ref.item(), rel=1e-5)
    ref_grads = torch.autograd.grad(ref, list(loss.actor.parameters()))
    for g, r in zip(agrads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-6)


def _unstacked(loss, ens) -> nn.ModuleList:
    """The stacked ensemble ``ens`` as a list of separate critic modules (copied weights)."""
    out = nn.ModuleList()
    for i in range(ens.num_nets):
        net = ValueOperator(copy.deepcopy(loss._critic), in_keys=ens.in_keys, out_keys=[ens.out_key])
        net.module.load_state_dict(ens.net.seed_state(i))
        out.append(net)
    return out


def test_batched_ensemble_equals_a_per_critic_loop():
    """The stacked forward against REDQ written as a loop over N separate critic modules (the
    layout before the ensemble was stacked): critic and actor losses and every gradient, 1e-6."""
    n, m, b = 6, 2, 9
    loss = _redq(n, m)
    td = _batch(b, obs_dim=3, act_dim=2, seed=4)
    online, target = _unstacked(loss, loss.qvalue), _unstacked(loss, loss.target_qvalue)
    subset = loss.draw_subset()
    loss.draw_subset = lambda: subset

    torch.manual_seed(5)
    out = loss(td.clone())
    stacked = list(loss.qvalue.net.stacked().values())
    g_q = torch.autograd.grad(out["loss_qvalue"], stacked, retain_graph=True)
    g_a = torch.autograd.grad(out["loss_actor"], list(loss.actor.parameters()))

    torch.manual_seed(5)  # SAC's order: the actor's sample first, then the next actions
    a, lp = loss.actor.get_dist(td.copy()).rsample_with_log_prob()
    nxt = td["next"]
    a2, lp2 = loss.actor.get_dist(nxt.copy()).rsample_with_log_prob()
    alpha = loss.temperature.alpha
    qbar = sum(net.module(td["observation"], a) for net in online) / n  # actor: the mean of all critics
    ref_actor = (alpha * lp.unsqueeze(-1) - qbar).mean()
    with torch.no_grad():
        nq = torch.stack([target[int(i)].module(nxt["observation"], a2) for i in subset]).min(0).values
        y = nxt["reward"] + 0.95 * (~nxt["terminated"]).float() * (nq - alpha * lp2.unsqueeze(-1))
    ref_q = sum(distance_loss(net.module(td["observation"], td["action"]), y).mean() for net in online)
    torch.testing.assert_close(out["loss_qvalue"], ref_q.detach(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out["loss_actor"], ref_actor.detach(), rtol=1e-6, atol=1e-6)
    names = list(loss.qvalue.net.stacked())
    ref_g = torch.autograd.grad(ref_q, list(online.parameters()))
    per_critic = dict(zip([f"{i}.{k}" for i, net in enumerate(online) for k, _ in net.module.named_parameters()],
                          ref_g))
    for name, g in zip(names, g_q):
        want = torch.stack([per_critic[f"{i}.{name}"] for i in range(n)])
        torch.testing.assert_close(g, want, rtol=1e-6, atol=1e-6)
    for g, r in zip(g_a, torch.autograd.grad(ref_actor, list(loss.actor.parameters()))):
        torch.testing.assert_close(g, r, rtol=1e-6, atol=1e-6)


def test_soft_update_and_state_dict_round_trip():
    """SoftUpdate lerps the stacked target parameters; a loss loaded from another's state dict
    gives the same outputs."""
    loss = _redq(4, 2)
    before = {k: v.clone() for k, v in loss.target_qvalue.net.stacked().items()}
    online = loss.qvalue.net.stacked()
    SoftUpdate(loss, tau=0.25).step()
    for k, v in loss.target_qvalue.net.stacked().items():
        torch.testing.assert_close(v, 0.75 * before[k] + 0.25 * online[k])
        assert not v.requires_grad
    other = _redq(4, 2, seed=9)
    td = _batch(5, obs_dim=3, act_dim=2)
    torch.manual_seed(0)
    a = other.qvalue_loss(td.clone())["loss_qvalue"]
    other.load_state_dict(loss.state_dict())
    other.generator.set_state(loss.generator.get_state())
    torch.manual_seed(0)
    b = other.qvalue_loss(td.clone())["loss_qvalue"]
    torch.manual_seed(0)
    want = loss.qvalue_loss(td.clone())["loss_qvalue"]
    assert not torch.allclose(a, want) and torch.equal(b, want)


def test_full_subset_is_sacs_target():
    loss = _redq(3, 3)
    sac = SACLoss(loss.actor, ValueOperator(copy.deepcopy(loss._critic), in_keys=["observation", "action"],
                                            out_keys=["state_action_value"]),
                  num_qvalue_nets=3, gamma=0.95, alpha_init=0.3)
    sac.qvalue.load_state_dict(_unstacked(loss, loss.qvalue).state_dict())
    sac.target_qvalue.load_state_dict(_unstacked(loss, loss.target_qvalue).state_dict())
    td = _batch(8, obs_dim=3, act_dim=2)
    torch.manual_seed(3)
    a = loss.qvalue_loss(td.clone())
    torch.manual_seed(3)
    b = sac.qvalue_loss(td.clone())
    assert torch.allclose(a["loss_qvalue"], b["loss_qvalue"])
    assert torch.allclose(a["target_mean"], b["target_mean"])


def test_subset_draws_are_uniform_and_distinct():
    loss = _redq(10, 2)
    counts = torch.zeros(10)
    for _ in range(2000):
        s = loss.draw_subset()
        assert s.shape == (2,) and s[0] < s[1] and 0 <= int(s.min()) and int(s.max()) < 10
        counts[s] += 1
    assert (counts / 4000 - 0.1).abs().max() < 0.03  # each critic in ~1/5 of the draws


@pytest.mark.parametrize("m", [0, 11, 2.0])
def test_bad_subset_size(m):
    with pytest.raises(ValueError, match="subset_size"):
        REDQLoss(_FixedActor(0.0), _const_critic(), num_qvalue_nets=10, subset_size=m)
