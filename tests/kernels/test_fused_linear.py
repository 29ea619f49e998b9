"""Chunked fused LM head + log-probs: naive parity, chunk invariance, Triton rows, bf16."""

from __future__ import annotations

import pytest
import torch
from tdrl.kernels import fused_linear_logprobs, fused_linear_logprobs_reference, use_backend

TOL = {torch.float32: dict(atol=5e-5, rtol=5e-5), torch.bfloat16: dict(atol=5e-2, rtol=5e-2)}


def naive(hidden, weight, targets, bias=None, temperature=1.0):
    logits = hidden @ weight.t()
    if bias is not None:
        logits = logits + bias
    logsm = torch.log_softmax(logits.float() / temperature, dim=-1)
    valid = targets >= 0
    logp = logsm.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1) * valid
    return logp, -(logsm.exp() * logsm).sum(-1)


def make(n, h, v, dtype=torch.float32, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=g).to(dtype).requires_grad_(True)
    weight = (torch.randn(v, h, generator=g) / h**0.5).to(dtype).requires_grad_(True)
    b = (0.1 * torch.randn(v, generator=g)).to(dtype).requires_grad_(True) if bias else None
    targets = torch.randint(0, v, (n,), generator=g)
    if n > 2:
        targets[1] = -100
    return hidden, weight, b, targets


def all_grads(logp, entropy, params, seed=1):
    g = torch.Generator().manual_seed(seed)
    w1, w2 = torch.randn(logp.shape, generator=g), torch.randn(logp.shape, generator=g)
    params = [p for p in params if p is not None]
    return torch.autograd.grad((logp * w1).sum() + (entropy * w2).sum(), params)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("chunk_size", [None, 1, 3, 64])
def test_reference_matches_naive(chunk_size, bias):
    hidden, weight, b, targets = make(10, 16, 37, bias=bias)
    out = fused_linear_logprobs_reference(
        hidden, weight, targets, bias=b, temperature=0.9, chunk_size=chunk_size, return_entropy=True
    )
    ref = naive(hidden, weight, targets, b, 0.9)
    for a, r in zip(out, ref, strict=True):
        torch.testing.assert_close(a, r, **TOL[torch.float32])
    params = (hidden, weight, b)
    for a, r in zip(all_grads(*out, params), all_grads(*ref, params), strict=True):
        torch.testing.assert_close(a, r, **TOL[torch.float32])


def test_logp_only_and_leading_shape():
    hidden, weight, _, targets = make(6, 8, 20, bias=False)
    h3, t3 = hidden.reshape(2, 3, 8), targets.reshape(2, 3)
    logp = fused_linear_logprobs(h3, weight, t3, chunk_size=4)
    assert logp.shape == (2, 3)
    ref = naive(hidden, weight, targets)[0].reshape(2, 3)
    torch.testing.assert_close(logp, ref, **TOL[torch.float32])
    g = torch.autograd.grad(logp.sum(), (hidden, weight))
    g_ref = torch.autograd.grad(ref.sum(), (hidden, weight))
    for a, r in zip(g, g_ref, strict=True):
        torch.testing.assert_close(a, r, **TOL[torch.float32])


def test_bfloat16_close_to_float32_math():
    hidden, weight, b, targets = make(8, 32, 50, dtype=torch.bfloat16)
    out = fused_linear_logprobs(hidden, weight, targets, bias=b, chunk_size=3, return_entropy=True)
    ref = naive(hidden.float(), weight.float(), targets, b.float())
    for a, r in zip(out, ref, strict=True):
        torch.testing.assert_close(a, r, **TOL[torch.bfloat16])
    grads = all_grads(*out, (hidden, weight, b))
    assert [g.dtype for g in grads] == [torch.bfloat16] * 3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n,v,chunk", [(1, 7, None), (5, 37, 2), (3, 4099, 2)])
def test_triton_matches_reference(n, v, chunk, dtype):
    hidden, weight, b, targets = make(n, 8, v, dtype=dtype, seed=3)
    params = (hidden, weight, b)
    kwargs = dict(bias=b, temperature=1.1, chunk_size=chunk, return_entropy=True)
    with use_backend("torch"):
        ref = fused_linear_logprobs(hidden, weight, targets, **kwargs)
        g_ref = all_grads(*ref, params)
    with use_backend("triton"):
        out = fused_linear_logprobs(hidden, weight, targets, **kwargs)
        g_out = all_grads(*out, params)
    for a, r in zip(out, ref, strict=True):
        torch.testing.assert_close(a, r, **TOL[torch.float32])
    for a, r in zip(g_out, g_ref, strict=True):
        torch.testing.assert_close(a.float(), r.float(), **TOL[dtype])


def test_errors_name_the_problem():
    hidden, weight, b, targets = make(4, 8, 10)
    with pytest.raises(ValueError, match=r"weight \[V, H\]"):
        fused_linear_logprobs(hidden, weight.t(), targets)
    with pytest.raises(ValueError, match="targets"):
        fused_linear_logprobs(hidden, weight, targets[:3])
    with pytest.raises(ValueError, match="bias"):
        fused_linear_logprobs(hidden, weight, targets, bias=b[:3])
    with pytest.raises(ValueError, match="target id 10 is out of range for a vocabulary of 10"):
        fused_linear_logprobs(hidden, weight, torch.tensor([0, 10, 3, -100]))
    with pytest.raises(TypeError, match="integer"):
        fused_linear_logprobs(hidden, weight, targets.float())


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk", [None, 1, 4])
def test_frozen_head_matches_naive_in_two_matmuls_per_chunk(chunk, dtype, backend, count_matmuls):
    # LoRA-style: the hidden states need a gradient, the LM head (and bias) does not.
    hidden, weight, b, targets = make(9, 16, 41, dtype=dtype, seed=5)
    weight, b = weight.detach(), b.detach()
    g = torch.randn(9, generator=torch.Generator().manual_seed(2))
    with use_backend(backend):
        counter = count_matmuls()
        with counter:
            logp = fused_linear_logprobs(hidden, weight, targets, bias=b, temperature=0.8, chunk_size=chunk)
            (grad,) = torch.autograd.grad((logp * g).sum(), hidden)
    chunks = 1 if chunk is None else -(-9 // chunk)
    assert counter.count == 2 * chunks  # logits + d logp / d hidden, no recomputation
    ref = naive(hidden.float(), weight.float(), targets, b.float(), 0.8)[0]
    (grad_ref,) = torch.autograd.grad((ref * g).sum(), hidden)
    torch.testing.assert_close(logp, ref, **TOL[dtype])
    assert grad.dtype == dtype
    torch.testing.assert_close(grad.float(), grad_ref.float(), **TOL[dtype])
    assert grad[1].abs().max() == 0  # the ignored target (-100) gets no gradient
    # A trainable head keeps the recomputing backward (4 matmuls per chunk: logits, logits
    # again, d hidden, d weight) and its gradients.
    weight.requires_grad_(True)
    with use_backend(backend):
        counter = count_matmuls()
        with counter:
            logp = fused_linear_logprobs(hidden, weight, targets, bias=b, temperature=0.8, chunk_size=chunk)
            gh, gw = torch.autograd.grad((logp * g).sum(), (hidden, weight))
    assert counter.count == 4 * chunks
    torch.testing.assert_close(gh.float(), grad_ref.float(), **TOL[dtype])


def test_reference_is_the_op_forced_to_torch():
    import inspect

    from tdrl.kernels import current_backend

    assert inspect.signature(fused_linear_logprobs_reference) == inspect.signature(fused_linear_logprobs)
    seen = []
    with use_backend("auto"):
        hidden, weight, b, targets = make(5, 8, 11)
        logp = fused_linear_logprobs_reference(hidden, weight, targets, bias=b)
        seen.append(current_backend())
    torch.testing.assert_close(logp, naive(hidden, weight, targets, b)[0], **TOL[torch.float32])
    assert seen == ["auto"]  # the forced backend is restored after the call
