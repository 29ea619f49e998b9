"""Triton kernels on a real GPU vs the torch reference on the same device (skipped without CUDA)."""

from __future__ import annotations

import pytest
import torch
from tdrl.kernels import (
    fused_linear_cross_entropy,
    discounted_cumsum,
    fused_linear_logprobs,
    fused_linear_pg_loss,
    gae,
    pg_token_loss,
    token_logprobs,
    use_backend,
)
from tdrl.kernels._dispatch import use_triton

pytestmark = pytest.mark.gpu
DEV = "cuda"


def both(fn):
    out = {}
    for backend in ("torch", "triton"):
        with use_backend(backend):
            out[backend] = fn()
    return out["triton"], out["torch"]


def test_auto_dispatch_picks_triton_on_cuda():
    assert use_triton(torch.zeros(1, device=DEV))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gae_and_cumsum(dtype):
    g = torch.Generator().manual_seed(0)
    r, v, nv = (torch.randn(7, 300, 1, generator=g).to(DEV, dtype) for _ in range(3))
    term = (torch.rand(7, 300, 1, generator=g) < 0.05).to(DEV)
    done = term | (torch.rand(7, 300, 1, generator=g) < 0.05).to(DEV)
    x = r.clone().requires_grad_(True)

    def run():
        adv, target = gae(r, v, nv, done, term, 0.99, 0.95)
        cs = discounted_cumsum(x, 0.97, done)
        (grad,) = torch.autograd.grad(cs.float().sum(), x)
        return adv, target, cs, grad

    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=5e-2, rtol=2e-2)
    for a, b in zip(*both(run), strict=True):
        torch.testing.assert_close(a.float(), b.float(), **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab", [37, 4099, 50000])
def test_token_logprobs(vocab, dtype):
    g = torch.Generator().manual_seed(1)
    logits = (3 * torch.randn(2, 5, vocab, generator=g)).to(DEV, dtype).requires_grad_(True)
    targets = torch.randint(0, vocab, (2, 5), generator=g).to(DEV)
    targets[0, 0] = -100

    def run():
        logp, ent = token_logprobs(logits, targets, 0.8, return_entropy=True)
        return logp, ent, torch.autograd.grad((logp + 0.5 * ent).sum(), logits)[0]

    tri, ref = both(run)
    torch.testing.assert_close(tri[0], ref[0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(tri[1], ref[1], atol=1e-4, rtol=1e-4)
    tol = dict(atol=1e-5, rtol=1e-4) if dtype == torch.float32 else dict(atol=1e-2, rtol=2e-2)
    torch.testing.assert_close(tri[2].float(), ref[2].float(), **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_linear(dtype):
    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(300, 64, generator=g).to(DEV, dtype).requires_grad_(True)
    weight = (torch.randn(4099, 64, generator=g) / 8).to(DEV, dtype).requires_grad_(True)
    targets = torch.randint(0, 4099, (300,), generator=g).to(DEV)

    def run():
        logp = fused_linear_logprobs(hidden, weight, targets, chunk_size=128)
        return (logp, *torch.autograd.grad(logp.sum(), (hidden, weight)))

    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=5e-2, rtol=5e-2)
    for a, b in zip(*both(run), strict=True):
        torch.testing.assert_close(a.float(), b.float(), **tol)

    def frozen_head():  # LoRA-style: the 2-matmul path (d logp / d hidden formed in the forward)
        logp = fused_linear_logprobs(hidden, weight.detach(), targets, chunk_size=128)
        return logp, torch.autograd.grad(logp.sum(), hidden)[0]

    for a, b, c in zip(*both(frozen_head), run(), strict=False):
        torch.testing.assert_close(a.float(), b.float(), **tol)
        torch.testing.assert_close(a.float(), c.float(), **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_linear_cross_entropy(dtype):
    g = torch.Generator().manual_seed(6)
    hidden = torch.randn(2, 150, 64, generator=g).to(DEV, dtype).requires_grad_(True)
    weight = (torch.randn(4099, 64, generator=g) / 8).to(DEV, dtype).requires_grad_(True)
    targets = torch.randint(0, 4099, (2, 150), generator=g).to(DEV)
    targets[:, :20] = -100
    mask = (torch.rand(2, 150, generator=g) < 0.8).to(DEV)

    def run():
        loss = fused_linear_cross_entropy(hidden, weight, targets, mask=mask, chunk_size=128)
        return loss, *torch.autograd.grad(loss, (hidden, weight))

    def naive():
        logits = (hidden @ weight.t()).float()
        nll = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100,
                                                reduction="none")
        w = mask.flatten().float() * (targets.flatten() >= 0)
        loss = (nll * w).sum() / w.sum()
        return loss, *torch.autograd.grad(loss, (hidden, weight))

    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=5e-2, rtol=5e-2)
    tri, ref = both(run)
    for a, b, c in zip(tri, ref, naive(), strict=True):
        torch.testing.assert_close(a.float(), b.float(), **tol)
        torch.testing.assert_close(a.float(), c.float(), **tol)


@pytest.mark.parametrize("reduction", ["token", "sequence", "constant"])
def test_pg_token_loss(reduction):
    g = torch.Generator().manual_seed(3)
    logp = (-3 * torch.rand(8, 1100, generator=g)).to(DEV).requires_grad_(True)
    old = logp.detach() + 0.3 * torch.randn(8, 1100, generator=g).to(DEV)
    ref = logp.detach() + 0.2 * torch.randn(8, 1100, generator=g).to(DEV)
    adv = torch.randn(8, generator=g).to(DEV)
    mask = (torch.rand(8, 1100, generator=g) < 0.7).to(DEV)

    def run():
        loss, stats = pg_token_loss(logp, old, adv, mask, ref, 0.2, 0.28, 0.05, reduction)
        return loss, torch.autograd.grad(loss, logp)[0], *stats.values()

    for a, b in zip(*both(run), strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reduction", ["token", "sequence"])
def test_fused_linear_pg_loss(reduction, dtype):
    g = torch.Generator().manual_seed(4)
    hidden = torch.randn(3, 100, 64, generator=g).to(DEV, dtype).requires_grad_(True)
    weight = (torch.randn(4099, 64, generator=g) / 8).to(DEV, dtype).requires_grad_(True)
    targets = torch.randint(0, 4099, (3, 100), generator=g).to(DEV)
    with torch.no_grad():
        lp0 = fused_linear_logprobs(hidden, weight, targets).float()
    old, ref = lp0 + 0.3 * torch.randn_like(lp0), lp0 + 0.2 * torch.randn_like(lp0)
    adv = torch.randn(3, generator=g).to(DEV)
    mask = (torch.rand(3, 100, generator=g) < 0.7).to(DEV)

    def run():
        loss, stats = fused_linear_pg_loss(hidden, weight, targets, old, adv, mask, ref, beta=0.05,
                                           reduction=reduction, chunk_size=128)
        return loss, *stats.values(), *torch.autograd.grad(loss, (hidden, weight))

    def composed():
        logp = fused_linear_logprobs(hidden, weight, targets, chunk_size=128)
        loss, stats = pg_token_loss(logp, old, adv, mask, ref, beta=0.05, reduction=reduction)
        return loss, *stats.values(), *torch.autograd.grad(loss, (hidden, weight))

    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=5e-2, rtol=5e-2)
    tri, ref_out = both(run)
    for a, b, c in zip(tri, ref_out, composed(), strict=True):
        torch.testing.assert_close(a.float(), b.float(), **tol)
        torch.testing.assert_close(a.float(), c.float(), **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_linear_pg_loss_on_policy_entropy_logprobs(dtype):
    """old_logp=None and the entropy / log-prob outputs (GRPOLoss' fused path) on CUDA."""
    g = torch.Generator().manual_seed(5)
    hidden = torch.randn(4, 50, 64, generator=g).to(DEV, dtype).requires_grad_(True)
    weight = (torch.randn(4099, 64, generator=g) / 8).to(DEV, dtype).requires_grad_(True)
    targets = torch.randint(0, 4099, (4, 50), generator=g).to(DEV)
    adv = torch.randn(4, generator=g).to(DEV)
    mask = (torch.rand(4, 50, generator=g) < 0.7).to(DEV)

    def run():
        loss, stats = fused_linear_pg_loss(hidden, weight, targets, None, adv, mask, temperature=0.9,
                                           reduction="constant", max_len=64, chunk_size=64,
                                           return_entropy=True, return_logprobs=True)
        return loss, *stats.values(), *torch.autograd.grad(loss, (hidden, weight))

    def composed():
        logp, ent = fused_linear_logprobs(hidden, weight, targets, temperature=0.9, return_entropy=True)
        loss, stats = pg_token_loss(logp, logp.detach(), adv, mask, reduction="constant", max_len=64)
        extra = (ent[mask].mean(), torch.where(mask, logp, 0.0))
        return loss, *stats.values(), *extra, *torch.autograd.grad(loss, (hidden, weight))

    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=5e-2, rtol=5e-2)
    tri, ref_out = both(run)
    for a, b, c in zip(tri, ref_out, composed(), strict=True):
        torch.testing.assert_close(a.float(), b.float(), **tol)
        torch.testing.assert_close(a.float(), c.float(), **tol)


@pytest.mark.parametrize("kind", ["gru", "lstm"])
@pytest.mark.parametrize("hidden", [32, 128])
def test_recurrent_sequences_with_resets(kind, hidden):
    """The Triton GRU / LSTM kernels (all T in one launch) vs the torch path on CUDA: outputs and
    the gradients of x, the initial states and every weight, with random is_init resets."""
    from tdrl.kernels import gru_sequence, lstm_sequence

    g = torch.Generator(device=DEV).manual_seed(0)
    gates = 3 if kind == "gru" else 4
    n, t_len, f = 64, 48, 24

    def mk(*shape):
        return (torch.randn(*shape, generator=g, device=DEV) * 0.3).requires_grad_()

    x = mk(n, t_len, f)
    states = [mk(n, hidden) for _ in range(1 if kind == "gru" else 2)]
    weights = [mk(gates * hidden, f), mk(gates * hidden, hidden), mk(gates * hidden), mk(gates * hidden)]
    is_init = torch.rand(n, t_len, generator=g, device=DEV) < 0.05
    fn = gru_sequence if kind == "gru" else lstm_sequence
    leaves = [x, *states, *weights]

    def run():
        out = fn(x, *states, is_init, *weights)
        outs = out if isinstance(out, tuple) else (out,)
        loss = sum((o * torch.linspace(-1, 1, o.shape[-1], device=DEV)).sum() for o in outs)
        return [o.detach() for o in outs], torch.autograd.grad(loss, leaves)

    (tri_out, tri_grads), (ref_out, ref_grads) = both(run)
    for a, b in zip(tri_out, ref_out, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    for a, b in zip(tri_grads, ref_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-3)
