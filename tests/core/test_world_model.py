"""DreamerV3 parts against hand-computed values: symlog/symexp, two-hot, unimix and
straight-through latents, the RSSM's shapes and filtering, KL balancing with free bits, the
imagined lambda return (vs tdrl's TD(lambda) and the paper's recursion), percentile return
normalisation, and the losses' gradients reaching only what they should train."""

from __future__ import annotations

import math

import pytest
import torch
from tensordict import TensorDict

from tdrl.core.modules import RSSM, ReturnNormalizer, TwoHot, straight_through_sample, symexp, symlog, unimix_logits
from tdrl.core.objectives import DreamerConfig, DreamerV3, kl_balance
from tdrl.core.objectives.dreamer import categorical_kl, imagined_lambda_return
from tdrl.core.values.functional import td_lambda_return

torch.set_num_threads(1)


def test_symlog_symexp():
    x = torch.tensor([-(math.e - 1), 0.0, math.e - 1, math.e ** 2 - 1])
    assert torch.allclose(symlog(x), torch.tensor([-1.0, 0.0, 1.0, 2.0]))
    assert torch.allclose(symexp(torch.tensor([-1.0, 0.0, 1.0, 2.0])), x)
    y = torch.linspace(-1e4, 1e4, 101, dtype=torch.float64)
    assert torch.allclose(symexp(symlog(y)), y)


def test_two_hot_encode_decode():
    th = TwoHot(255)
    b = th.bins
    assert b.shape == (255,) and float(b[127]) == 0.0
    assert float(b[128]) == pytest.approx(math.expm1(40 / 254))  # symexp of the first step of linspace(-20, 20)
    e = th.encode(torch.tensor([0.0, 0.25 * float(b[128]), 1e12, -1e12]))
    assert e.shape == (4, 255) and torch.allclose(e.sum(-1), torch.ones(4))
    assert float(e[0, 127]) == 1.0
    assert float(e[1, 127]) == pytest.approx(0.75) and float(e[1, 128]) == pytest.approx(0.25)
    assert float(e[2, 254]) == 1.0 and float(e[3, 0]) == 1.0  # out of range: the end bins
    # decoding the log of a two-hot vector gives the value back
    y = torch.tensor([-123.4, -1.0, 0.3, 7.0, 999.0], dtype=torch.float64)
    th64 = TwoHot(255).double()
    assert torch.allclose(th64.decode(torch.log(th64.encode(y).clamp_min(1e-300))), y, rtol=1e-9)
    # the loss is the cross-entropy against the two-hot target
    logits = torch.zeros(2, 255)
    assert torch.allclose(th.loss(logits, torch.tensor([0.0, 3.0])), torch.full((2,), math.log(255)))


def test_unimix_and_straight_through():
    lp = unimix_logits(torch.tensor([0.0, math.log(3.0)]), 0.01)
    assert torch.allclose(lp.exp(), torch.tensor([0.99 * 0.25 + 0.005, 0.99 * 0.75 + 0.005]))
    assert float(unimix_logits(torch.tensor([-1e9, 0.0]), 0.01).exp()[0]) == pytest.approx(0.005)
    logits = torch.randn(64, 4, 3, requires_grad=True)
    s = straight_through_sample(logits, torch.Generator().manual_seed(0))
    assert torch.equal(s.detach(), s.detach().round()) and torch.equal(s.detach().sum(-1), torch.ones(64, 4))
    w = torch.randn(64, 4, 3)
    (s * w).sum().backward()
    # the gradient of the sample is the gradient through the probabilities: d/dlogits sum(p * w)
    lg = logits.detach().clone().requires_grad_()
    (torch.softmax(lg, -1) * w).sum().backward()
    assert torch.allclose(logits.grad, lg.grad, atol=1e-6)


def test_kl_balance_free_bits_and_split_gradients():
    # one latent of 2 classes: KL([.5,.5] || [.9,.1]) = 0.5 ln(.5/.9) + 0.5 ln(.5/.1) = 0.5108 < 1 nat
    post = torch.log(torch.tensor([[[0.5, 0.5]]]))
    prior = torch.log(torch.tensor([[[0.9, 0.1]]]))
    assert float(categorical_kl(post, prior)) == pytest.approx(0.5 * math.log(5 / 9) + 0.5 * math.log(5))
    pl, ql = post.clone().requires_grad_(), prior.clone().requires_grad_()
    loss, dyn, rep = kl_balance(pl, ql)
    assert float(loss.detach()) == pytest.approx(0.6)  # both terms clipped at the free bit
    loss.sum().backward()
    assert float(pl.grad.abs().sum()) == 0.0 and float(ql.grad.abs().sum()) == 0.0
    # above the free bit: KL([.99,.01] || [.01,.99]) = 0.98 ln 99; dyn trains the prior (x0.5),
    # rep the posterior (x0.1)
    post = torch.log(torch.tensor([[[0.99, 0.01]]])).requires_grad_()
    prior = torch.log(torch.tensor([[[0.01, 0.99]]])).requires_grad_()
    loss, dyn, rep = kl_balance(post, prior)
    kl = 0.98 * math.log(99)
    assert float(loss.detach()) == pytest.approx(0.6 * kl, rel=1e-5) and float(dyn) == pytest.approx(kl, rel=1e-5)
    loss.sum().backward()
    p2, q2 = post.detach().clone().requires_grad_(), prior.detach().clone().requires_grad_()
    gp, gq = torch.autograd.grad(categorical_kl(p2, q2).sum(), [p2, q2])
    assert torch.allclose(post.grad, 0.1 * gp) and torch.allclose(prior.grad, 0.5 * gq)


def _naive_dreamer_return(r, v, c, gamma, lmbda):
    """R_t = r_t + gamma c_t ((1 - lmbda) v_{t+1} + lmbda R_{t+1}), R_H = v_H (the paper's eq.)."""
    out = torch.zeros_like(r)
    nxt = v[:, -1]
    for t in reversed(range(r.shape[1])):
        nxt = r[:, t] + gamma * c[:, t] * ((1 - lmbda) * v[:, t] + lmbda * nxt)
        out[:, t] = nxt
    return out


def test_imagined_lambda_return():
    # hand-computed: gamma = lmbda = 0.5, r = [1, 2], v_next = [10, 20]
    r, v = torch.tensor([[[1.0], [2.0]]]), torch.tensor([[[10.0], [20.0]]])
    alive = torch.ones(1, 2, 1, dtype=torch.bool)
    assert torch.allclose(imagined_lambda_return(r, v, alive, 0.5, 0.5), torch.tensor([[[6.5], [12.0]]]))
    ends = torch.tensor([[[True], [False]]])  # the state after the second action is terminal
    assert torch.allclose(imagined_lambda_return(r, v, ends, 0.5, 0.5), torch.tensor([[[4.0], [2.0]]]))
    # random trajectories: the paper's recursion == tdrl's TD(lambda) with terminated = ~cont
    g = torch.Generator().manual_seed(0)
    r, v = torch.randn(6, 15, 1, generator=g), torch.randn(6, 15, 1, generator=g)
    cont = torch.rand(6, 15, 1, generator=g) > 0.15
    ref = _naive_dreamer_return(r, v, cont.float(), 0.997, 0.95)
    assert torch.allclose(imagined_lambda_return(r, v, cont, 0.997, 0.95), ref, atol=1e-5)
    assert torch.allclose(td_lambda_return(r, v, ~cont, ~cont, 0.997, 0.95), ref, atol=1e-5)


def test_return_normalizer():
    norm = ReturnNormalizer()
    x = torch.arange(101.0)  # P5 = 5, P95 = 95
    assert float(norm.update(x)) == 1.0  # S = 0.95 - 0.05 = 0.9 -> max(1, S)
    assert float(norm.low) == pytest.approx(0.05) and float(norm.high) == pytest.approx(0.95)
    for _ in range(499):
        s = norm.update(x)
    assert float(s) == pytest.approx(90 * (1 - 0.99 ** 500), rel=1e-4)
    state = norm.state_dict()
    assert set(state) == {"low", "high"}
    with pytest.raises(ValueError, match="decay"):
        ReturnNormalizer(decay=1.0)


def test_rssm_shapes_and_filtering():
    torch.manual_seed(0)
    rssm = RSSM(action_dim=2, embed_dim=5, deter=8, stoch=3, classes=4, hidden=6)
    out = rssm.observe(torch.randn(2, 7, 5), torch.randn(2, 7, 2))
    assert out["h"].shape == (2, 7, 8) and out["z"].shape == (2, 7, 12)
    assert out["post"].shape == (2, 7, 3, 4) and out["prior"].shape == (2, 7, 3, 4)
    assert torch.allclose(out["post"].exp().sum(-1), torch.ones(2, 7, 3))
    assert float(out["post"].detach().exp().min()) >= 0.01 / 4 - 1e-7  # unimix floor
    assert torch.equal(out["z"].reshape(2, 7, 3, 4).sum(-1), torch.ones(2, 7, 3))
    feats, acts = rssm.imagine(out["h"][:, -1], out["z"][:, -1], lambda f: torch.zeros(2, 2), horizon=4)
    assert feats.shape == (2, 5, 20) and acts.shape == (2, 4, 2)
    assert torch.equal(feats[:, 0], torch.cat([out["h"][:, -1], out["z"][:, -1]], -1))


def _batch(B=3, L=6, obs=4, act=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    nxt = torch.randn(B, L, obs, generator=g)
    return TensorDict({"observation": torch.cat([torch.randn(B, 1, obs, generator=g), nxt[:, :-1]], 1),
                       "action": torch.rand(B, L, act, generator=g) * 2 - 1,
                       "next": {"observation": nxt, "reward": torch.randn(B, L, 1, generator=g),
                                "terminated": torch.zeros(B, L, 1, dtype=torch.bool)}}, [B, L])


@pytest.mark.parametrize("discrete", [False, True])
def test_losses_train_what_they_should(discrete):
    torch.manual_seed(0)
    cfg = DreamerConfig(deter=16, stoch=4, classes=4, hidden=16, layers=1, horizon=3)
    agent = DreamerV3(4, 2, discrete=discrete, cfg=cfg)
    batch = _batch()
    wm, (h, z) = agent.world_model_loss(batch)
    assert h.shape == (3 * 7, 16) and z.shape == (3 * 7, 16) and not h.requires_grad
    assert float(wm["loss_reward"].detach()) == pytest.approx(math.log(255), rel=1e-4)  # zero-init head: uniform
    assert float(wm["loss_kl"].detach()) >= 0.6 - 1e-6
    ac = agent.actor_critic_loss(h, z)
    actor = list(agent.actor.parameters())
    ac["loss_actor"].backward(inputs=actor)
    assert all(p.grad is not None and float(p.grad.abs().sum()) > 0 for p in actor[-2:])
    assert all(p.grad is None for p in agent.world_model_parameters())
    ac["loss_critic"].backward()
    assert all(p.grad is None for p in agent.world_model_parameters())
    assert agent.critic[-1].weight.grad is not None
    # the slow critic follows the critic by EMA
    with torch.no_grad():
        agent.critic[-1].bias.fill_(1.0)
    agent.update_slow_critic()
    assert torch.allclose(agent.slow_critic[-1].bias, torch.full((255,), 0.02))
    with pytest.raises(ValueError, match="SliceSampler"):
        agent.world_model_loss(batch[:, 0])


def test_world_model_learns_a_sequence():
    """A few hundred steps fit the rewards and observations of a fixed batch (loss falls)."""
    torch.manual_seed(0)
    agent = DreamerV3(4, 2, cfg=DreamerConfig(deter=16, stoch=4, classes=4, hidden=32, layers=1))
    batch = _batch(B=4, L=8)
    opt = torch.optim.Adam(agent.world_model_parameters(), lr=3e-3)
    first = None
    for _ in range(150):
        wm, _ = agent.world_model_loss(batch)
        loss = wm["loss_decoder"] + wm["loss_reward"]
        first = float(loss) if first is None else first
        opt.zero_grad()
        (loss + wm["loss_kl"] + wm["loss_cont"]).backward()
        opt.step()
    assert float(loss) < 0.3 * first
