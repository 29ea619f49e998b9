"""fused_linear_pg_loss: equal to the composed ops and to a naive log_softmax path, every
reduction and option, odd shapes, empty masks, Triton rows (interpreter) vs torch rows."""

from __future__ import annotations

import pytest
import torch
from tdrl.kernels import (
    fused_linear_logprobs,
    fused_linear_pg_loss,
    fused_linear_pg_loss_reference,
    pg_token_loss,
    use_backend,
)

TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.bfloat16: dict(atol=3e-2, rtol=3e-2),
       torch.float64: dict(atol=1e-10, rtol=1e-10)}
STATS = ("clip_frac", "kl", "ratio_mean")


def make(b, t, h, v, dtype=torch.float32, bias=True, adv_per_token=False, p_mask=0.7, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(b, t, h, generator=g).to(dtype).requires_grad_(True)
    weight = (torch.randn(v, h, generator=g) / h**0.5).to(dtype).requires_grad_(True)
    bias_t = (0.1 * torch.randn(v, generator=g)).to(dtype).requires_grad_(True) if bias else None
    targets = torch.randint(0, v, (b, t), generator=g)
    with torch.no_grad():
        lp = naive_logprobs(hidden.double(), weight.double(), targets, None if bias_t is None else bias_t.double())
    # old / ref close enough to the current policy that some ratios clip and some do not.
    old = (lp + 0.3 * torch.randn(b, t, generator=g, dtype=torch.float64)).float()
    ref = (lp + 0.2 * torch.randn(b, t, generator=g, dtype=torch.float64)).float()
    adv = torch.randn((b, t) if adv_per_token else (b,), generator=g)
    mask = torch.rand(b, t, generator=g) < p_mask
    return dict(hidden=hidden, weight=weight, targets=targets, old_logp=old, advantages=adv,
                mask=mask, ref_logp=ref, bias=bias_t)


def naive_logprobs(hidden, weight, targets, bias=None, temperature=1.0):
    """Full [B, T, V] logits, log_softmax and gather: the obvious implementation."""
    logits = hidden @ weight.t()
    if bias is not None:
        logits = logits + bias
    if logits.dtype != torch.float64:
        logits = logits.float()
    logsm = torch.log_softmax(logits / temperature, -1)
    return logsm.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1) * (targets >= 0)


def params(case):
    return [p for p in (case["hidden"], case["weight"], case["bias"]) if p is not None]


def composed(case, use_ref=True, temperature=1.0, naive=False, **kw):
    """pg_token_loss over log-probs from fused_linear_logprobs (or the naive full path)."""
    if naive:
        logp = naive_logprobs(case["hidden"], case["weight"], case["targets"], case["bias"], temperature)
    else:
        logp = fused_linear_logprobs(case["hidden"], case["weight"], case["targets"], bias=case["bias"],
                                     temperature=temperature)
    return pg_token_loss(logp, case["old_logp"], case["advantages"], case["mask"],
                         case["ref_logp"] if use_ref else None, **kw)


def fused(case, use_ref=True, fn=fused_linear_pg_loss, **kw):
    return fn(case["hidden"], case["weight"], case["targets"], case["old_logp"], case["advantages"],
              case["mask"], case["ref_logp"] if use_ref else None, bias=case["bias"], **kw)


def assert_same(case, out, ref, tol, grad_scale=1.0):
    (loss, stats), (loss_r, stats_r) = out, ref
    torch.testing.assert_close(loss, loss_r.to(loss.dtype), **tol)
    for k in STATS:
        torch.testing.assert_close(stats[k], stats_r[k].to(stats[k].dtype), **tol)
        assert not stats[k].requires_grad
    ps = params(case)
    grads = torch.autograd.grad(loss * grad_scale, ps)
    grads_r = torch.autograd.grad(loss_r * grad_scale, ps)
    for g, g_r in zip(grads, grads_r, strict=True):
        assert g.dtype == g_r.dtype and g.shape == g_r.shape
        torch.testing.assert_close(g.float(), g_r.float(), **tol)


@pytest.mark.parametrize("reduction", ["token", "sequence", "constant"])
@pytest.mark.parametrize("adv_per_token", [False, True])
def test_matches_composed_and_naive_every_reduction(reduction, adv_per_token):
    case = make(3, 7, 16, 37, adv_per_token=adv_per_token)
    kw = dict(eps_low=0.2, eps_high=0.28, beta=0.05, reduction=reduction, temperature=0.9)
    out = fused(case, chunk_size=4, **kw)
    assert out[0].dtype == torch.float32 and out[0].dim() == 0
    assert_same(case, out, composed(case, **kw), TOL[torch.float32], grad_scale=2.5)
    assert_same(case, fused(case, chunk_size=4, **kw), composed(case, naive=True, **kw), TOL[torch.float32])


@pytest.mark.parametrize("chunk_size", [None, 1, 5, 64])
@pytest.mark.parametrize("use_ref,beta,bias,p_mask", [(False, 0.0, True, 0.7), (True, 0.0, False, 0.7),
                                                      (True, 0.3, True, 0.7), (True, 0.1, True, 1.0)])
def test_options_and_chunk_sizes(chunk_size, use_ref, beta, bias, p_mask):
    case = make(2, 5, 8, 23, bias=bias, seed=1, p_mask=p_mask)
    kw = dict(beta=beta, reduction="sequence", max_len=None)
    out = fused(case, use_ref=use_ref, chunk_size=chunk_size, **kw)
    assert_same(case, out, composed(case, use_ref=use_ref, **kw), TOL[torch.float32])


def test_constant_reduction_max_len_and_float_mask():
    case = make(2, 4, 8, 19, seed=2)
    case["mask"] = torch.rand(2, 4, generator=torch.Generator().manual_seed(5)) * (case["mask"].float())
    kw = dict(reduction="constant", max_len=11, beta=0.1)
    assert_same(case, fused(case, chunk_size=3, **kw), composed(case, **kw), TOL[torch.float32])


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("reduction", ["token", "sequence", "constant"])
def test_all_zero_mask_gives_zero_loss_and_gradients(reduction, backend):
    case = make(2, 3, 8, 11, p_mask=0.0)
    with use_backend(backend):
        loss, stats = fused(case, beta=0.1, reduction=reduction, chunk_size=2)
    assert loss.item() == 0.0 and all(stats[k].item() == 0.0 for k in STATS)
    for g in torch.autograd.grad(loss, params(case)):
        assert torch.count_nonzero(g) == 0


def test_odd_shapes_t1_ignored_targets_and_partially_empty_rows():
    case = make(3, 1, 5, 4099, seed=3)
    case["mask"] = torch.tensor([[True], [False], [True]])
    kw = dict(reduction="sequence", beta=0.2)
    assert_same(case, fused(case, chunk_size=2, **kw), composed(case, **kw), TOL[torch.float32])
    # A negative target (HF's -100) gives log-prob 0 and no gradient, as in the composed ops.
    case = make(2, 3, 8, 13, seed=4)
    case["targets"][0, 1] = -100
    assert_same(case, fused(case, chunk_size=2), composed(case), TOL[torch.float32])


def test_float64_and_no_grad_forward():
    case = make(2, 4, 8, 17, dtype=torch.float64, seed=6)
    out = fused(case, beta=0.1, chunk_size=3)
    assert out[0].dtype == torch.float64
    assert_same(case, out, composed(case, beta=0.1), TOL[torch.float64])
    with torch.no_grad():
        loss, _ = fused(case, beta=0.1)
    assert not loss.requires_grad
    torch.testing.assert_close(loss, out[0].detach())


def test_only_weight_requires_grad_and_loss_reused_in_a_graph():
    case = make(2, 3, 8, 13, seed=7)
    case["hidden"] = case["hidden"].detach()
    loss, _ = fused(case, chunk_size=2)
    total = 3.0 * loss + loss**2  # upstream gradient 3 + 2 * loss
    (gw,) = torch.autograd.grad(total, case["weight"])
    loss_r, _ = composed(case)
    (gw_r,) = torch.autograd.grad(3.0 * loss_r + loss_r**2, case["weight"])
    torch.testing.assert_close(gw, gw_r, **TOL[torch.float32])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reduction,b,t,v,chunk", [("token", 1, 1, 7, None), ("sequence", 2, 3, 37, 2),
                                                  ("constant", 2, 2, 4099, 3)])
def test_triton_rows_match_torch_rows(dtype, reduction, b, t, v, chunk):
    case = make(b, t, 8, v, dtype=dtype, seed=8)
    kw = dict(beta=0.05, eps_high=0.28, reduction=reduction, temperature=1.1, chunk_size=chunk)
    with use_backend("torch"):
        ref = fused(case, **kw)
    with use_backend("triton"):
        out = fused(case, **kw)
    assert_same(case, out, ref, TOL[dtype])


def test_reference_is_the_torch_path_and_bfloat16_close_to_float32():
    case = make(2, 3, 16, 29, dtype=torch.bfloat16, seed=9)
    out = fused(case, fn=fused_linear_pg_loss_reference, beta=0.05, chunk_size=2)
    assert out[0].dtype == torch.float32
    grads = torch.autograd.grad(out[0], params(case))
    assert [g.dtype for g in grads] == [torch.bfloat16] * 3
    case32 = {k: (v.detach().float().requires_grad_(True) if isinstance(v, torch.Tensor) and v.is_floating_point()
                  and v.requires_grad else v) for k, v in case.items()}
    loss32, _ = composed(case32, naive=True, beta=0.05)
    torch.testing.assert_close(out[0], loss32, **TOL[torch.bfloat16])


def test_errors_name_the_problem():
    case = make(2, 3, 8, 11)
    with pytest.raises(ValueError, match=r"hidden \[B, T, H\]"):
        fused_linear_pg_loss(case["hidden"].reshape(6, 8), case["weight"], case["targets"].reshape(6),
                             case["old_logp"].reshape(6), case["advantages"], case["mask"].reshape(6))
    with pytest.raises(ValueError, match="reduction"):
        fused(case, reduction="mean")
    with pytest.raises(ValueError, match="old_logp"):
        fused_linear_pg_loss(case["hidden"], case["weight"], case["targets"], case["old_logp"][:, :2],
                             case["advantages"], case["mask"])
    with pytest.raises(ValueError, match=r"fused_linear_pg_loss expects hidden \[N, H\] and weight \[V, H\]"):
        fused(dict(case, weight=case["weight"].t()))
    for backend in ("torch", "triton"):  # an id past the vocabulary would read another row in a kernel
        with use_backend(backend), pytest.raises(ValueError, match="fused_linear_pg_loss: target id 11 is out"):
            fused(dict(case, targets=torch.full_like(case["targets"], 11)))


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("reduction", ["token", "sequence", "constant"])
def test_on_policy_old_none_entropy_and_logprobs_outputs(reduction, backend):
    """``old_logp=None`` is the on-policy case (old = current log-probs, detached); the
    optional entropy / log-prob outputs equal fused_linear_logprobs' and are detached."""
    case = make(3, 5, 8, 29, seed=10, p_mask=0.6)
    kw = dict(beta=0.1, eps_high=0.28, reduction=reduction, temperature=0.7, chunk_size=4)
    with use_backend(backend):
        loss, stats = fused_linear_pg_loss(
            case["hidden"], case["weight"], case["targets"], None, case["advantages"], case["mask"],
            case["ref_logp"], bias=case["bias"], return_entropy=True, return_logprobs=True, **kw)
    kw.pop("chunk_size")
    logp, ent = fused_linear_logprobs(case["hidden"], case["weight"], case["targets"], bias=case["bias"],
                                      temperature=kw["temperature"], return_entropy=True)
    tol = TOL[torch.float32]
    m = case["mask"]
    torch.testing.assert_close(stats["logp"], torch.where(m, logp, 0.0).detach(), **tol)
    torch.testing.assert_close(stats["entropy"], ent[m].mean().detach(), **tol)
    assert not stats["logp"].requires_grad and not stats["entropy"].requires_grad
    torch.testing.assert_close(stats["ratio_mean"], torch.tensor(1.0), **tol)
    assert stats["clip_frac"].item() == 0.0
    kw.pop("temperature")
    ref = pg_token_loss(logp, logp.detach(), case["advantages"], m, case["ref_logp"], **kw)
    assert_same(case, (loss, stats), ref, tol)


def test_backward_twice_is_a_clear_error():
    """The gradients are computed once in the forward and handed over without a copy."""
    case = make(2, 3, 8, 13, seed=11)
    loss, _ = fused(case, chunk_size=2)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="retain_graph"):
        loss.backward()
