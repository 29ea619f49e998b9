"""GRPO variants against a naive per-token loop, advantages, TIS and k3 on hand-made tensors."""

from __future__ import annotations

import math

import pytest
import torch

from tdrl.llm import GRPOLossConfig, group_advantages, grpo_objective, k3_kl, masked_reduce, tis_weights


def naive_grpo(logp, old, adv, mask, cfg, ref=None, sample=None):
    """Per-token Python loop of the GRPO family (the definition, written plainly)."""
    B, T = logp.shape
    per_seq, total, count = [], 0.0, 0
    for b in range(B):
        n_b = int(mask[b].sum())
        if cfg.sequence_level:
            s = torch.exp(sum((logp[b, t] - old[b, t]) for t in range(T) if mask[b, t]) / max(1, n_b))
        seq = 0.0
        for t in range(T):
            if not mask[b, t]:
                continue
            r = s if cfg.sequence_level else torch.exp(logp[b, t] - old[b, t])
            a = adv[b]
            if cfg.tis_cap is not None:
                a = a * min(math.exp(float(old[b, t] - sample[b, t])), cfg.tis_cap)
            lt = -torch.minimum(r * a, torch.clamp(r, 1 - cfg.eps_low, 1 + cfg.eps_high) * a)
            if cfg.beta > 0:
                d = ref[b, t] - logp[b, t]
                lt = lt + cfg.beta * (torch.exp(d) - d - 1)
            seq = seq + lt
            total, count = total + lt, count + 1
        per_seq.append(seq / max(1, n_b))
    if cfg.reduction == "token":
        return total / count
    if cfg.reduction == "sequence":
        return sum(per_seq) / B
    return total / (B * (cfg.max_len or T))


def _tensors(seed=0, B=4, T=6):
    g = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(B, T, generator=g) * 3).requires_grad_()
    old = (logp.detach() + 0.3 * torch.randn(B, T, generator=g))  # ratios on both sides of the clip
    ref = logp.detach() + 0.2 * torch.randn(B, T, generator=g)
    sample = old + 0.5 * torch.randn(B, T, generator=g)
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [1, 0, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0]], dtype=torch.bool)
    adv = torch.tensor([1.5, -0.7, 0.3, -1.1])
    return logp, old, ref, sample, mask, adv


VARIANTS = {
    "grpo": GRPOLossConfig.grpo(),
    "grpo_token_kl": GRPOLossConfig.grpo(reduction="token", beta=0.05),
    "dapo": GRPOLossConfig.dapo(),
    "dr_grpo": GRPOLossConfig.dr_grpo(max_len=8),
    "gspo": GRPOLossConfig.gspo(eps_low=0.05, eps_high=0.08),
    "gspo_kl": GRPOLossConfig.gspo(eps_low=0.05, eps_high=0.08, beta=0.1),
    "tis": GRPOLossConfig.grpo(tis_cap=1.5),
    "dapo_tis_kl": GRPOLossConfig.dapo(tis_cap=2.0, beta=0.02),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variant_matches_naive_loop(name):
    cfg = VARIANTS[name]
    logp, old, ref, sample, mask, adv = _tensors()
    loss, stats = grpo_objective(logp, old, adv, mask, cfg, ref_logp=ref, sample_logp=sample)
    (g,) = torch.autograd.grad(loss, logp)
    logp2 = logp.detach().clone().requires_grad_()
    expect = naive_grpo(logp2, old, adv, mask, cfg, ref=ref, sample=sample)
    (g2,) = torch.autograd.grad(expect, logp2)
    torch.testing.assert_close(loss, expect.to(loss.dtype), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g, g2, rtol=1e-5, atol=1e-6)
    assert torch.all(g[~mask] == 0), "gradient must be zero on tokens the policy did not generate"
    assert set(stats) >= {"clip_frac", "kl", "ratio_mean"}


def test_hand_computed_single_token():
    # one token, ratio e^0.5 = 1.6487 > 1.2, A = 2 -> clipped: loss = -(1.2 * 2) = -2.4, no gradient
    logp = torch.tensor([[0.0]], requires_grad=True)
    old = torch.tensor([[-0.5]])
    loss, stats = grpo_objective(logp, old, torch.tensor([2.0]), torch.ones(1, 1, dtype=torch.bool), GRPOLossConfig())
    assert loss.item() == pytest.approx(-2.4)
    assert stats["clip_frac"].item() == 1.0
    loss.backward()
    assert logp.grad.item() == 0.0
    # DAPO clip-higher (eps_high=0.28): still clipped at 1.28 -> -2.56
    loss, _ = grpo_objective(logp, old, torch.tensor([2.0]), torch.ones(1, 1, dtype=torch.bool), GRPOLossConfig.dapo())
    assert loss.item() == pytest.approx(-2.56)


def test_dr_grpo_constant_normaliser():
    # tokens' loss -A*ratio with ratio 1: values -1 (3 tokens) and -(-2)=2 (1 token): sum = -3 + 2 = -1
    logp = torch.zeros(2, 4)
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.bool)
    loss, _ = grpo_objective(logp, logp, torch.tensor([1.0, -2.0]), mask, GRPOLossConfig.dr_grpo(max_len=10))
    assert loss.item() == pytest.approx(-1.0 / (2 * 10))
    loss_seq, _ = grpo_objective(logp, logp, torch.tensor([1.0, -2.0]), mask, GRPOLossConfig(reduction="sequence"))
    assert loss_seq.item() == pytest.approx((-1.0 + 2.0) / 2)
    loss_tok, _ = grpo_objective(logp, logp, torch.tensor([1.0, -2.0]), mask, GRPOLossConfig(reduction="token"))
    assert loss_tok.item() == pytest.approx(-1.0 / 4)


def test_group_advantages_hand_values():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5])
    a = group_advantages(r, 4)
    std = torch.tensor([1.0, 0.0, 0.0, 1.0]).std().item()  # unbiased: sqrt(1/3)
    torch.testing.assert_close(a[:4], torch.tensor([0.5, -0.5, -0.5, 0.5]) / (std + 1e-4))
    assert torch.all(a[4:] == 0), "a group whose rewards are all equal must get exactly zero advantage"
    torch.testing.assert_close(group_advantages(r, 4, scale=False)[:4], torch.tensor([0.5, -0.5, -0.5, 0.5]))
    # equal rewards that are not exactly representable still give exact zeros
    assert torch.all(group_advantages(torch.full((6,), 0.1), 3) == 0)
    with pytest.raises(ValueError, match="group_size"):
        group_advantages(torch.zeros(7), 4)


def test_tis_weights_and_k3():
    old = torch.tensor([[0.0, -1.0, -2.0]])
    sample = torch.tensor([[-1.0, -1.0, 0.0]])
    w = tis_weights(old, sample, torch.tensor([[1, 1, 0]], dtype=torch.bool), cap=2.0)
    torch.testing.assert_close(w, torch.tensor([[2.0, 1.0, 0.0]]))  # e^1 capped at 2; e^0; masked
    kl = k3_kl(torch.tensor([0.0, -1.0]), torch.tensor([0.0, 0.0]))
    torch.testing.assert_close(kl, torch.tensor([0.0, math.e - 1 - 1]))
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    m = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    assert masked_reduce(x, m, "token").item() == pytest.approx(7 / 3)
    assert masked_reduce(x, m, "sequence").item() == pytest.approx((1.5 + 4) / 2)
    assert masked_reduce(x, m, "constant", 5).item() == pytest.approx(7 / 10)


@pytest.mark.parametrize(("mode", "expect"), [
    # token ratios: row 0 = (2, 0.5, masked), row 1 = (2, 1.5, 1); sequence ratios 1 and 3; cap 1.6
    ("token_truncate", [[1.6, 0.5, 0.0], [1.6, 1.5, 1.0]]),
    ("token_mask", [[0.0, 0.5, 0.0], [0.0, 1.5, 1.0]]),
    ("sequence_truncate", [[1.0, 1.0, 0.0], [1.6, 1.6, 1.6]]),
    ("sequence_mask", [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]),
])
def test_importance_sampling_modes_by_hand(mode, expect):
    """TRL's vllm_importance_sampling_mode values: truncate or mask, per token or per sequence."""
    old = torch.log(torch.tensor([[0.5, 0.2, 0.4], [0.6, 0.6, 0.5]]))
    sample = torch.log(torch.tensor([[0.25, 0.4, 0.1], [0.3, 0.4, 0.5]]))
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    w = tis_weights(old, sample, mask, cap=1.6, mode=mode)
    torch.testing.assert_close(w, torch.tensor(expect), rtol=1e-5, atol=1e-6)
    # in the loss: ratio 1 and advantage 1 make each token's loss -w_t; token mean over the 5 tokens
    cfg = GRPOLossConfig(reduction="token", tis_cap=1.6, tis_mode=mode)
    loss, _ = grpo_objective(old.clone(), old, torch.ones(2), mask, cfg, sample_logp=sample)
    assert loss.item() == pytest.approx(-sum(sum(r) for r in expect) / 5, rel=1e-5)


def test_config_checks():
    with pytest.raises(ValueError, match="reduction"):
        GRPOLossConfig(reduction="mean")
    with pytest.raises(ValueError, match="ref_logp"):
        grpo_objective(torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1), torch.ones(1, 2, dtype=torch.bool), GRPOLossConfig(beta=0.1))
    with pytest.raises(TypeError, match="no field"):
        GRPOLossConfig().update(clip=0.1)
    with pytest.raises(ValueError, match="sequence_mask"):
        GRPOLossConfig(tis_mode="sequence")
