"""Policy-gradient token loss: hand-computed values, a plain-Python loop, Triton vs reference."""

from __future__ import annotations

import math

import pytest
import torch
from tdrl.kernels import pg_token_loss, pg_token_loss_reference, use_backend
from tdrl.kernels.pg_loss.reference import pg_token_loss_eager

LOG = math.log


def naive_loss(logp, old, adv, mask, ref, eps_low, eps_high, beta, reduction, max_len=None):
    """Token by token in Python floats: the formula as written in the PPO/GRPO papers."""
    b, t_len = logp.shape
    adv = adv.unsqueeze(1).expand(b, t_len) if adv.dim() == 1 else adv
    rows, counts = [], []
    for i in range(b):
        acc, n = 0.0, 0
        for t in range(t_len):
            if not mask[i, t]:
                continue
            ratio = math.exp(logp[i, t] - old[i, t])
            a = float(adv[i, t])
            term = -min(ratio * a, min(max(ratio, 1 - eps_low), 1 + eps_high) * a)
            if ref is not None:
                d = float(ref[i, t] - logp[i, t])
                term += beta * (math.exp(d) - d - 1)
            acc, n = acc + term, n + 1
        rows.append(acc)
        counts.append(n)
    if reduction == "token":
        return sum(rows) / max(sum(counts), 1)
    if reduction == "sequence":
        return sum(r / max(c, 1) for r, c in zip(rows, counts, strict=True)) / b
    return sum(rows) / (b * (max_len or t_len))


def make(b, t_len, seed=0, adv_per_token=False, p_mask=0.7, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(b, t_len, generator=g) * 3).to(dtype).requires_grad_(True)
    old = logp.detach().float() + 0.3 * torch.randn(b, t_len, generator=g)
    ref = logp.detach().float() + 0.2 * torch.randn(b, t_len, generator=g)
    adv = torch.randn((b, t_len) if adv_per_token else (b,), generator=g)
    mask = torch.rand(b, t_len, generator=g) < p_mask
    return logp, old, adv, mask, ref


def test_golden_values():
    # ratios 1.5 and 0.5 with A = 1, eps = 0.2: terms -min(1.5, 1.2) = -1.2 (clipped: no
    # gradient) and -min(0.5, 0.8) = -0.5 (gradient -ratio * A = -0.5).
    logp = torch.tensor([[LOG(1.5), LOG(0.5)]], requires_grad=True)
    old = torch.zeros(1, 2)
    mask = torch.ones(1, 2, dtype=torch.bool)
    for backend in ("torch", "triton"):
        with use_backend(backend):
            loss, stats = pg_token_loss(logp, old, torch.ones(1), mask)
            (grad,) = torch.autograd.grad(loss, logp)
            torch.testing.assert_close(loss, torch.tensor(-0.85))
            torch.testing.assert_close(grad, torch.tensor([[0.0, -0.25]]))
            torch.testing.assert_close(stats["clip_frac"], torch.tensor(0.5))
            torch.testing.assert_close(stats["ratio_mean"], torch.tensor(1.0))
            # k3 KL to ref = 0: exp(-log 1.5) + log 1.5 - 1 and exp(-log 0.5) + log 0.5 - 1
            kl = [1 / 1.5 + LOG(1.5) - 1, 2 + LOG(0.5) - 1]
            loss, stats = pg_token_loss(logp, old, torch.ones(1), mask, torch.zeros(1, 2), beta=0.1)
            torch.testing.assert_close(loss, torch.tensor((-1.2 - 0.5 + 0.1 * sum(kl)) / 2))
            torch.testing.assert_close(stats["kl"], torch.tensor(sum(kl) / 2))


@pytest.mark.parametrize("reduction", ["token", "sequence", "constant"])
@pytest.mark.parametrize("adv_per_token", [False, True])
@pytest.mark.parametrize("with_ref", [False, True])
def test_reference_matches_python_loop(reduction, adv_per_token, with_ref):
    logp, old, adv, mask, ref = make(4, 9, adv_per_token=adv_per_token)
    ref = ref if with_ref else None
    loss, _ = pg_token_loss_reference(logp, old, adv, mask, ref, 0.2, 0.28, 0.04, reduction, max_len=12)
    expected = naive_loss(logp.detach(), old, adv, mask, ref, 0.2, 0.28, 0.04, reduction, max_len=12)
    torch.testing.assert_close(loss, torch.tensor(expected, dtype=torch.float32), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("reduction", ["token", "sequence", "constant"])
@pytest.mark.parametrize("with_ref,beta", [(False, 0.0), (True, 0.0), (True, 0.1)])
def test_one_pass_reference_matches_eager_autograd(reduction, with_ref, beta):
    """The one-pass reference (analytic gradient) vs autograd through the eager composition,
    with zero advantages (GRPO groups of equal rewards), ratios exactly on the clip bounds,
    a float-weighted mask and per-token advantages."""
    logp, old, adv, mask, ref = make(5, 11, adv_per_token=True, seed=7)
    adv[1] = 0.0
    old[2, :3] = logp.detach()[2, :3] - torch.log(torch.tensor([0.8, 1.28, 1.0]))  # ratio 0.8, 1.28, 1
    weights = mask * torch.rand(5, 11, generator=torch.Generator().manual_seed(1))
    for m in (mask, weights):
        args = (logp, old, adv, m, ref if with_ref else None, 0.2, 0.28, beta, reduction, 13)
        loss, stats = pg_token_loss_reference(*args)
        loss_e, stats_e = pg_token_loss_eager(*args)
        torch.testing.assert_close(loss, loss_e, atol=1e-6, rtol=1e-5)
        for k in stats:
            torch.testing.assert_close(stats[k], stats_e[k], atol=1e-6, rtol=1e-5)
        g, g_e = (torch.autograd.grad(x * 1.7, logp)[0] for x in (loss, loss_e))
        torch.testing.assert_close(g, g_e, atol=1e-6, rtol=1e-5)


def test_reference_gradient_matches_finite_differences():
    logp, old, adv, mask, ref = make(2, 4, seed=5)
    logp64 = logp.detach().double().requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda lp: pg_token_loss_reference(lp, old.double(), adv.double(), mask, ref.double(), beta=0.1)[0],
        (logp64,),
    )


def test_masked_tokens_are_ignored_even_if_not_finite():
    logp, old, adv, mask, ref = make(3, 5)
    logp_bad = logp.detach().clone()
    logp_bad[~mask] = float("-inf")
    for backend in ("torch", "triton"):
        with use_backend(backend):
            a, sa = pg_token_loss(logp_bad, old, adv, mask, ref, beta=0.1)
            b, sb = pg_token_loss(logp.detach(), old, adv, mask, ref, beta=0.1)
        torch.testing.assert_close(a, b)
        for k in sa:
            torch.testing.assert_close(sa[k], sb[k])


CASES = [
    dict(b=1, t_len=1),
    dict(b=3, t_len=1),
    dict(b=5, t_len=37, adv_per_token=True),
    dict(b=2, t_len=1100),  # two token blocks of 1024
    dict(b=3, t_len=6, p_mask=0.0),  # all-zero mask
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reduction", ["token", "sequence", "constant"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_triton_matches_reference(case, reduction, dtype):
    logp, old, adv, mask, ref = make(**CASES[case], dtype=dtype, seed=case)
    tol = dict(atol=1e-6, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-2, rtol=1e-2)
    for r, beta in ((None, 0.0), (ref, 0.05)):
        with use_backend("torch"):
            loss_r, stats_r = pg_token_loss(logp, old, adv, mask, r, 0.2, 0.28, beta, reduction)
            (g_r,) = torch.autograd.grad(loss_r, logp)
        with use_backend("triton"):
            loss, stats = pg_token_loss(logp, old, adv, mask, r, 0.2, 0.28, beta, reduction)
            (g,) = torch.autograd.grad(loss, logp)
        torch.testing.assert_close(loss, loss_r, atol=1e-6, rtol=1e-5)
        assert g.dtype == dtype
        torch.testing.assert_close(g.float(), g_r.float(), **tol)
        for k in ("clip_frac", "kl", "ratio_mean"):
            assert not stats[k].requires_grad
            torch.testing.assert_close(stats[k], stats_r[k], atol=1e-6, rtol=1e-5)
        if CASES[case].get("p_mask") == 0.0:
            assert loss.item() == 0.0 and torch.all(g == 0)


def test_errors_name_the_problem():
    logp, old, adv, mask, ref = make(2, 3)
    with pytest.raises(ValueError, match="reduction"):
        pg_token_loss(logp, old, adv, mask, reduction="mean")
    with pytest.raises(ValueError, match="advantages"):
        pg_token_loss(logp, old, torch.zeros(3), mask)
    with pytest.raises(ValueError, match="old_logp"):
        pg_token_loss(logp, old[:, :2], adv, mask)
