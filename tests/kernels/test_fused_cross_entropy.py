"""Fused LM head + masked cross-entropy: parity with F.cross_entropy and the masked mean of the
log-probs, gradients, matmul count, Triton rows, edge cases and errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tdrl.kernels import (
    fused_linear_cross_entropy,
    fused_linear_cross_entropy_reference,
    fused_linear_logprobs,
    use_backend,
)

TOL = {torch.float32: dict(atol=5e-5, rtol=5e-5), torch.bfloat16: dict(atol=5e-2, rtol=5e-2)}


def make(shape, h, v, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(*shape, h, generator=g).to(dtype).requires_grad_(True)
    weight = (torch.randn(v, h, generator=g) / h**0.5).to(dtype).requires_grad_(True)
    bias = (0.1 * torch.randn(v, generator=g)).to(dtype).requires_grad_(True)
    targets = torch.randint(0, v, shape, generator=g)
    return hidden, weight, bias, targets


def grads(loss, params):
    return torch.autograd.grad(loss, params)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("chunk_size", [None, 1, 4])
def test_matches_torch_cross_entropy_with_ignore_index(chunk_size, reduction):
    hidden, weight, bias, targets = make((11,), 16, 37)
    targets[[2, 7]] = -100
    params = (hidden, weight, bias)
    loss = fused_linear_cross_entropy_reference(
        hidden, weight, targets, bias=bias, temperature=0.7, reduction=reduction, chunk_size=chunk_size
    )
    ref = F.cross_entropy((hidden @ weight.t() + bias) / 0.7, targets, ignore_index=-100, reduction=reduction)
    torch.testing.assert_close(loss, ref, **TOL[torch.float32])
    for a, b in zip(grads(loss, params), grads(ref, params), strict=True):
        torch.testing.assert_close(a, b, **TOL[torch.float32])
    assert grads(
        fused_linear_cross_entropy(hidden, weight, targets, bias=bias, chunk_size=chunk_size), (hidden,)
    )[0][2].abs().max() == 0  # an ignored token gets no gradient


def test_float_mask_equals_masked_mean_of_logprobs_any_leading_shape():
    hidden, weight, _, targets = make((3, 5), 8, 29, seed=1)
    mask = torch.rand(3, 5, generator=torch.Generator().manual_seed(2))
    mask[1] = 0.0  # a sequence entirely masked out
    params = (hidden, weight)
    loss = fused_linear_cross_entropy(hidden, weight, targets, mask=mask, chunk_size=4)
    logp = fused_linear_logprobs(hidden, weight, targets)
    ref = -(logp * mask).sum() / mask.sum()
    torch.testing.assert_close(loss, ref, **TOL[torch.float32])
    g, g_ref = grads(loss, params), grads(ref, params)
    for a, b in zip(g, g_ref, strict=True):
        torch.testing.assert_close(a, b, **TOL[torch.float32])
    assert g[0][1].abs().max() == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("v,chunk", [(7, None), (4099, 3)])
def test_triton_rows_match_torch_rows(v, chunk, dtype):
    hidden, weight, bias, targets = make((6,), 8, v, dtype=dtype, seed=3)
    targets[0] = -100
    mask = torch.tensor([1.0, 0.5, 0.0, 1.0, 2.0, 1.0])
    params = (hidden, weight, bias)
    out = {}
    for backend in ("torch", "triton"):
        with use_backend(backend):
            loss = fused_linear_cross_entropy(hidden, weight, targets, bias=bias, mask=mask, temperature=1.3,
                                              chunk_size=chunk)
            out[backend] = (loss, *grads(loss, params))
    for a, b in zip(out["triton"], out["torch"], strict=True):
        torch.testing.assert_close(a.float(), b.float(), **TOL[dtype])
    assert [g.dtype for g in out["triton"][1:]] == [dtype] * 3


def test_bfloat16_close_to_float32_math():
    hidden, weight, bias, targets = make((9,), 32, 50, dtype=torch.bfloat16, seed=4)
    loss = fused_linear_cross_entropy(hidden, weight, targets, bias=bias, chunk_size=4)
    ref = F.cross_entropy(hidden.float() @ weight.float().t() + bias.float(), targets)
    torch.testing.assert_close(loss, ref, **TOL[torch.bfloat16])
    assert loss.dtype == torch.float32


@pytest.mark.parametrize("frozen", [False, True])
def test_three_matmuls_per_chunk_two_with_a_frozen_head(frozen, count_matmuls):
    hidden, weight, _, targets = make((10,), 16, 41, seed=5)
    if frozen:
        weight = weight.detach()
    params = (hidden,) if frozen else (hidden, weight)
    counter = count_matmuls()
    with counter:
        loss = fused_linear_cross_entropy(hidden, weight, targets, chunk_size=4)
        g = grads(loss, params)
    assert counter.count == (2 if frozen else 3) * 3  # 3 chunks of <= 4 rows
    ref = F.cross_entropy(hidden @ weight.t(), targets)
    for a, b in zip(g, grads(ref, params), strict=True):
        torch.testing.assert_close(a, b, **TOL[torch.float32])
    with torch.no_grad(), count_matmuls() as c:  # nothing to differentiate: 1 matmul per chunk
        fused_linear_cross_entropy(hidden, weight, targets, chunk_size=4)
    assert c.count == 3


def test_masked_tokens_skip_the_head_and_empty_mask_gives_zero(count_matmuls):
    hidden, weight, _, targets = make((2, 6), 8, 20, seed=6)
    mask = torch.zeros(2, 6, dtype=torch.bool)
    mask[0, :3] = True
    counter = count_matmuls()
    with counter:
        fused_linear_cross_entropy(hidden, weight, targets, mask=mask, chunk_size=3)
    assert counter.count == 3  # only the 3 kept tokens: one chunk, 3 matmuls
    loss = fused_linear_cross_entropy(hidden, weight, targets, mask=torch.zeros(2, 6))
    assert loss.item() == 0.0
    g = grads(loss, (hidden, weight))
    assert all(bool((x == 0).all()) for x in g)


def test_one_backward_per_forward():
    hidden, weight, _, targets = make((4,), 8, 10, seed=7)
    loss = fused_linear_cross_entropy(hidden, weight, targets)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="twice"):
        loss.backward()


def test_errors_name_the_problem():
    hidden, weight, bias, targets = make((4,), 8, 10)
    with pytest.raises(ValueError, match="reduction"):
        fused_linear_cross_entropy(hidden, weight, targets, reduction="none")
    with pytest.raises(ValueError, match="mask must have the shape"):
        fused_linear_cross_entropy(hidden, weight, targets, mask=torch.ones(3))
    with pytest.raises(ValueError, match=">= 0"):
        fused_linear_cross_entropy(hidden, weight, targets, mask=torch.tensor([1.0, -1.0, 1.0, 1.0]))
    with pytest.raises(ValueError, match="NaN"):
        fused_linear_cross_entropy(hidden, weight, targets, mask=torch.tensor([1.0, float("nan"), 1.0, 1.0]))
    with pytest.raises(ValueError, match=r"weight \[V, H\]"):
        fused_linear_cross_entropy(hidden, weight.t(), targets)
    with pytest.raises(TypeError, match="dtype"):
        fused_linear_cross_entropy(hidden, weight.double(), targets)
    with pytest.raises(ValueError, match="fused_linear_cross_entropy: target id 12 is out of range"):
        fused_linear_cross_entropy(hidden, weight, torch.tensor([0, 12, 3, -100]))
