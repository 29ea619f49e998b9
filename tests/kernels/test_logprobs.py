"""Token log-probs and entropy: naive log_softmax parity, Triton vs reference, fwd and bwd."""

from __future__ import annotations

import pytest
import torch
from tdrl.kernels import token_logprobs, token_logprobs_reference, use_backend
from tdrl.kernels.logprobs.reference import TokenLogprobsFunction, rows_backward, rows_forward

TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def naive(logits, targets, temperature=1.0):
    """Full log_softmax + gather (what everyone writes first)."""
    logsm = torch.log_softmax(logits.float() / temperature, dim=-1)
    valid = targets >= 0
    logp = logsm.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1) * valid
    entropy = -(logsm.exp() * logsm).sum(-1)
    return logp, entropy


def make(b, t, v, dtype=torch.float32, seed=0, ignore=True):
    g = torch.Generator().manual_seed(seed)
    logits = (3 * torch.randn(b, t, v, generator=g)).to(dtype).requires_grad_(True)
    targets = torch.randint(0, v, (b, t), generator=g)
    if ignore and targets.numel() > 1:
        targets[0, 0] = -100
    return logits, targets


def grads(logp, entropy, logits, seed=1):
    g = torch.Generator().manual_seed(seed)
    w1 = torch.randn(logp.shape, generator=g)
    w2 = torch.randn(logp.shape, generator=g)
    return torch.autograd.grad((logp * w1).sum() + (entropy * w2).sum(), logits)[0]


def test_golden_uniform_logits():
    # Uniform logits over V tokens: logp = -log V and entropy = log V for any temperature.
    logits = torch.zeros(1, 2, 10)
    logp, ent = token_logprobs(logits, torch.tensor([[3, 9]]), temperature=0.5, return_entropy=True)
    torch.testing.assert_close(logp, torch.full((1, 2), -torch.log(torch.tensor(10.0)).item()))
    torch.testing.assert_close(ent, torch.full((1, 2), torch.log(torch.tensor(10.0)).item()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 1, 5), (2, 3, 37), (3, 4, 1000)])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_reference_matches_naive(shape, dtype, temperature):
    logits, targets = make(*shape, dtype=dtype)
    logp, ent = token_logprobs_reference(logits, targets, temperature, return_entropy=True)
    logp_n, ent_n = naive(logits, targets, temperature)
    assert logp.dtype == torch.float32 and logp.shape == targets.shape
    torch.testing.assert_close(logp, logp_n, **TOL[torch.float32])
    torch.testing.assert_close(ent, ent_n, **TOL[torch.float32])
    g = grads(logp, ent, logits)
    g_n = grads(logp_n, ent_n, logits)
    assert g.dtype == dtype
    torch.testing.assert_close(g.float(), g_n.float(), **TOL[dtype])


def test_chunking_does_not_change_results():
    logits, targets = make(3, 5, 50)
    flat, tgt = logits.reshape(15, 50), targets.reshape(15)
    outs = []
    for chunk in (1, 4, 15):
        logp, ent = TokenLogprobsFunction.apply(flat, tgt, 1.3, True, chunk, rows_forward, rows_backward)
        outs.append((logp, ent, grads(logp, ent, logits)))
    for other in outs[1:]:
        for a, b in zip(outs[0], other, strict=True):
            torch.testing.assert_close(a, b)


def test_logp_only_gradient_and_ignored_targets():
    logits, targets = make(2, 3, 11)
    logp = token_logprobs(logits, targets)
    grad = torch.autograd.grad(logp.sum(), logits)[0]
    assert logp[0, 0] == 0 and torch.all(grad[0, 0] == 0)  # target -100: no log-prob, no gradient
    logp_n, _ = naive(logits, targets)
    torch.testing.assert_close(grad, torch.autograd.grad(logp_n.sum(), logits)[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 1, 7), (2, 3, 37), (1, 2, 4099)])
def test_triton_matches_reference(shape, dtype):
    """V=4099 spans two vocab blocks of 4096 with a ragged tail; T=1; an ignored target."""
    logits, targets = make(*shape, dtype=dtype, seed=2)
    with use_backend("torch"):
        ref = token_logprobs(logits, targets, 0.8, return_entropy=True)
        g_ref = grads(*ref, logits)
    with use_backend("triton"):
        out = token_logprobs(logits, targets, 0.8, return_entropy=True)
        g_out = grads(*out, logits)
        logp_only = token_logprobs(logits, targets, 0.8)
        g_logp_only = torch.autograd.grad(logp_only.sum(), logits)[0]
    for a, b in zip(out, ref, strict=True):
        torch.testing.assert_close(a, b, **TOL[torch.float32])
    torch.testing.assert_close(g_out.float(), g_ref.float(), **TOL[dtype])
    torch.testing.assert_close(logp_only, ref[0], **TOL[torch.float32])
    g_ref_logp = torch.autograd.grad(token_logprobs_reference(logits, targets, 0.8).sum(), logits)[0]
    torch.testing.assert_close(g_logp_only.float(), g_ref_logp.float(), **TOL[dtype])


def test_non_contiguous_logits():
    base, targets = make(2, 3, 40)
    logits = base.detach()[..., :37].requires_grad_(False)  # rows with stride 40
    t = targets.clamp(max=36)
    ref = naive(logits, t)[0]
    for backend in ("torch", "triton"):
        with use_backend(backend):
            torch.testing.assert_close(token_logprobs(logits, t), ref, **TOL[torch.float32])


def test_errors_name_the_problem():
    logits, targets = make(2, 3, 5)
    with pytest.raises(ValueError, match="targets"):
        token_logprobs(logits, targets[:, :2])
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(logits, targets, temperature=0.0)
    with pytest.raises(TypeError, match="integer"):
        token_logprobs(logits, targets.float())
    with pytest.raises(ValueError, match="target id 5 is out of range for a vocabulary of 5"):
        token_logprobs(logits, targets.clamp(min=0) * 0 + 5)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # numpy in the interpreter
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_masked_vocabulary_with_minus_inf_logits(backend):
    """Logits set to -inf (banned tokens) must not turn the entropy or gradients into NaN."""
    logits, targets = make(2, 3, 20, ignore=False)
    masked = logits.detach().clone()
    masked[..., 10:] = float("-inf")
    masked.requires_grad_(True)
    t = targets % 10
    with use_backend(backend):
        logp, ent = token_logprobs(masked, t, return_entropy=True)
        grad = grads(logp, ent, masked)
    logp_n, ent_n = naive(logits.detach()[..., :10], t)
    torch.testing.assert_close(logp, logp_n, **TOL[torch.float32])
    torch.testing.assert_close(ent, ent_n, **TOL[torch.float32])
    assert torch.isfinite(grad).all() and torch.all(grad[..., 10:] == 0)
