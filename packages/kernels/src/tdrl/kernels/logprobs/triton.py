"""Triton row kernels for token log-probs: online logsumexp over vocabulary blocks.

One program per row streams the vocabulary in ``BLOCK_V`` blocks, keeping a running max
``m``, ``s = sum exp(z - m)`` and (for the entropy) ``w = sum exp(z - m) z``, rescaled when
the max grows (Milakov & Gimelshein, 2018, "Online normalizer calculation for softmax").
The backward kernel recomputes ``p = exp(z - lse)`` block by block and writes
``d/dz = g_logp (1[y] - p) - g_ent p (log p + H)``, scaled by ``1 / temperature``, into an
output buffer that may alias the logits (the fused LM-head path does that).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._dispatch import interpreting

MAX_BLOCK_V = 4096


def _block_v(vocab: int) -> int:
    return min(triton.next_power_of_2(max(vocab, 1)), MAX_BLOCK_V)


@triton.jit
def _logprobs_fwd_kernel(
    logits_ptr, stride_row, targets_ptr, logp_ptr, lse_ptr, ent_ptr, vocab, inv_temp,
    NEED_ENTROPY: tl.constexpr, BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * stride_row
    m = float("-inf")
    s = 0.0
    w = 0.0
    for start in range(0, vocab, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        valid = offs < vocab
        z = tl.load(base + offs, mask=valid, other=float("-inf")).to(tl.float32) * inv_temp
        m_new = tl.maximum(m, tl.max(z, 0))
        scale = tl.exp(m - m_new)
        e = tl.exp(z - m_new)
        s = s * scale + tl.sum(e, 0)
        if NEED_ENTROPY:
            w = w * scale + tl.sum(tl.where(e > 0, e * tl.where(valid, z, 0.0), 0.0), 0)
        m = m_new
    lse = m + tl.log(s)
    tgt = tl.load(targets_ptr + row)
    has_target = tgt >= 0
    z_t = tl.load(base + tl.where(has_target, tgt, 0)).to(tl.float32) * inv_temp
    tl.store(logp_ptr + row, tl.where(has_target, z_t - lse, 0.0))
    tl.store(lse_ptr + row, lse)
    if NEED_ENTROPY:
        tl.store(ent_ptr + row, lse - w / s)


@triton.jit
def _logprobs_bwd_kernel(
    logits_ptr, stride_row, out_ptr, stride_out, targets_ptr, lse_ptr, ent_ptr,
    grad_logp_ptr, grad_ent_ptr, vocab, inv_temp,
    HAS_GRAD_LOGP: tl.constexpr, HAS_GRAD_ENT: tl.constexpr, BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * stride_row
    out = out_ptr + row * stride_out
    lse = tl.load(lse_ptr + row)
    tgt = tl.load(targets_ptr + row)
    g_logp = 0.0
    if HAS_GRAD_LOGP:
        g_logp = tl.where(tgt >= 0, tl.load(grad_logp_ptr + row).to(tl.float32), 0.0)
    g_ent = 0.0
    ent = 0.0
    if HAS_GRAD_ENT:
        g_ent = tl.load(grad_ent_ptr + row).to(tl.float32)
        ent = tl.load(ent_ptr + row)
    for start in range(0, vocab, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        valid = offs < vocab
        z = tl.load(base + offs, mask=valid, other=0.0).to(tl.float32) * inv_temp
        p = tl.exp(z - lse)
        grad = -g_logp * p - g_ent * tl.where(p > 0, p * (z - lse + ent), 0.0)
        grad = tl.where(offs == tgt, grad + g_logp, grad) * inv_temp
        tl.store(out + offs, grad.to(out_ptr.dtype.element_ty), mask=valid)


def _launch_opts() -> dict:
    return {} if interpreting() else {"num_warps": 8}


def rows_forward_triton(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    need_entropy: bool,
    workspace: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Triton :func:`tdrl.kernels.logprobs.reference.rows_forward` (float32 results;
    ``workspace`` is accepted for the same signature and unused)."""
    n, vocab = logits.shape
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    targets = targets.contiguous()
    logp = torch.empty(n, dtype=torch.float32, device=logits.device)
    lse = torch.empty_like(logp)
    entropy = torch.empty_like(logp) if need_entropy else None
    if n:
        _logprobs_fwd_kernel[(n,)](
            logits, logits.stride(0), targets, logp, lse, entropy if need_entropy else lse,
            vocab, 1.0 / temperature,
            NEED_ENTROPY=need_entropy, BLOCK_V=_block_v(vocab), **_launch_opts(),
        )
    if logits.dtype == torch.float64:
        return logp.double(), lse.double(), None if entropy is None else entropy.double()
    return logp, lse, entropy


def rows_backward_triton(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    lse: torch.Tensor,
    entropy: torch.Tensor | None,
    grad_logp: torch.Tensor | None,
    grad_entropy: torch.Tensor | None,
    out: torch.Tensor,
    workspace: torch.Tensor | None = None,
) -> torch.Tensor:
    """Triton :func:`tdrl.kernels.logprobs.reference.rows_backward`; ``out`` may alias logits
    (``workspace`` is unused)."""
    n, vocab = logits.shape
    if n == 0:
        return out
    if logits.stride(-1) != 1 or out.stride(-1) != 1:
        raise ValueError("rows_backward_triton needs logits and out with a contiguous last dim.")
    lse32 = lse.float().contiguous()
    has_gl, has_ge = grad_logp is not None, grad_entropy is not None
    dummy = lse32
    _logprobs_bwd_kernel[(n,)](
        logits, logits.stride(0), out, out.stride(0), targets.contiguous(), lse32,
        entropy.float().contiguous() if has_ge else dummy,
        grad_logp.float().contiguous() if has_gl else dummy,
        grad_entropy.float().contiguous() if has_ge else dummy,
        vocab, 1.0 / temperature,
        HAS_GRAD_LOGP=has_gl, HAS_GRAD_ENT=has_ge, BLOCK_V=_block_v(vocab), **_launch_opts(),
    )
    return out
