"""Fused Triton policy-gradient token loss: one pass gives loss terms, gradient and stats.

One program per sequence walks its tokens in ``BLOCK_T`` blocks and computes, per token,
the clipped surrogate and k3 KL (see :mod:`.reference`) and their derivative with respect
to ``logp``::

    d loss_t / d logp = -A * ratio   (0 where the clip is active)  + beta * (1 - exp(ref - logp))

It writes that derivative (masked) to a ``[B, T]`` float32 buffer and five per-sequence
sums (loss, mask count, clipped, kl, ratio). The reductions then only touch ``[B]``
vectors, and the backward is one multiply: ``grad = g * row_scale[b] * dloss[b, t]``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._dispatch import interpreting
from .reference import expand_advantages

MAX_BLOCK_T = 1024


@triton.jit
def _pg_loss_fwd_kernel(
    logp_ptr, old_ptr, ref_ptr, adv_ptr, mask_ptr, dloss_ptr, sums_ptr,
    n_rows, t_len, stride_lp, stride_old, stride_ref, stride_adv_b, stride_adv_t, stride_mask,
    lo, hi, beta,
    HAS_REF: tl.constexpr, STORE_GRAD: tl.constexpr, BLOCK_T: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    acc_loss = tl.zeros([BLOCK_T], dtype=tl.float32)
    acc_cnt = tl.zeros([BLOCK_T], dtype=tl.float32)
    acc_clip = tl.zeros([BLOCK_T], dtype=tl.float32)
    acc_kl = tl.zeros([BLOCK_T], dtype=tl.float32)
    acc_ratio = tl.zeros([BLOCK_T], dtype=tl.float32)
    for start in range(0, t_len, BLOCK_T):
        t = start + tl.arange(0, BLOCK_T)
        inb = t < t_len
        m = tl.load(mask_ptr + row * stride_mask + t, mask=inb, other=0).to(tl.float32)
        keep = m > 0
        lp = tl.load(logp_ptr + row * stride_lp + t, mask=inb, other=0.0).to(tl.float32)
        old = tl.load(old_ptr + row * stride_old + t, mask=inb, other=0.0).to(tl.float32)
        adv = tl.load(adv_ptr + row * stride_adv_b + t * stride_adv_t, mask=inb, other=0.0).to(tl.float32)
        log_ratio = tl.where(keep, lp - old, 0.0)
        ratio = tl.exp(log_ratio)
        clipped_ratio = tl.minimum(tl.maximum(ratio, lo), hi)
        tok = -tl.minimum(ratio * adv, clipped_ratio * adv)
        clipped = ((ratio < lo) & (adv < 0)) | ((ratio > hi) & (adv > 0))
        grad = tl.where(clipped, 0.0, -adv * ratio)
        kl = tl.zeros([BLOCK_T], dtype=tl.float32)
        if HAS_REF:
            ref = tl.load(ref_ptr + row * stride_ref + t, mask=inb, other=0.0).to(tl.float32)
            diff = tl.where(keep, ref - lp, 0.0)
            e = tl.exp(diff)
            kl = e - diff - 1.0
            tok = tok + beta * kl
            grad = grad + beta * (1.0 - e)
        tok = tl.where(keep, tok * m, 0.0)
        acc_loss += tok
        acc_cnt += m
        acc_clip += tl.where(keep & clipped, 1.0, 0.0)
        acc_kl += tl.where(keep, kl, 0.0)
        acc_ratio += tl.where(keep, ratio, 0.0)
        if STORE_GRAD:
            tl.store(dloss_ptr + row * t_len + t, tl.where(keep, grad * m, 0.0), mask=inb)
    tl.store(sums_ptr + row, tl.sum(acc_loss, 0))
    tl.store(sums_ptr + n_rows + row, tl.sum(acc_cnt, 0))
    tl.store(sums_ptr + 2 * n_rows + row, tl.sum(acc_clip, 0))
    tl.store(sums_ptr + 3 * n_rows + row, tl.sum(acc_kl, 0))
    tl.store(sums_ptr + 4 * n_rows + row, tl.sum(acc_ratio, 0))


def _row_major(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


class PGTokenLossFunction(torch.autograd.Function):
    """The Triton path of :func:`tdrl.kernels.pg_token_loss` (arguments as there, all given,
    already checked): returns ``(loss, clip_frac, kl, ratio_mean)``."""

    @staticmethod
    def forward(ctx, logp, old_logp, advantages, mask, ref_logp, eps_low, eps_high, beta, reduction, max_len):
        b, t_len = logp.shape
        if mask.dtype == torch.bool:
            mask = mask.view(torch.uint8)
        lp, old, m = _row_major(logp.detach()), _row_major(old_logp.detach()), _row_major(mask)
        adv = expand_advantages(advantages.detach(), logp.shape)
        if adv.stride(-1) not in (0, 1):
            adv = adv.contiguous()
        ref = _row_major(ref_logp.detach()) if ref_logp is not None else lp
        store_grad = ctx.needs_input_grad[0]
        dloss = torch.empty((b, t_len) if store_grad else (1,), dtype=torch.float32, device=logp.device)
        sums = torch.empty(5, b, dtype=torch.float32, device=logp.device)
        if b:
            block_t = min(triton.next_power_of_2(max(t_len, 1)), MAX_BLOCK_T)
            opts = {} if interpreting() else {"num_warps": 4}
            _pg_loss_fwd_kernel[(b,)](
                lp, old, ref, adv, m, dloss, sums,
                b, t_len, lp.stride(0), old.stride(0), ref.stride(0), adv.stride(0), adv.stride(1),
                m.stride(0), 1.0 - eps_low, 1.0 + eps_high, float(beta),
                HAS_REF=ref_logp is not None, STORE_GRAD=store_grad, BLOCK_T=block_t, **opts,
            )
        tok_sum, cnt, clip_sum, kl_sum, ratio_sum = sums
        total_cnt = cnt.sum().clamp(min=1.0)
        if reduction == "token":
            row_scale = (1.0 / total_cnt).expand(b)
        elif reduction == "sequence":
            row_scale = 1.0 / (cnt.clamp(min=1.0) * max(b, 1))
        else:
            row_scale = torch.full((b,), 1.0 / (max(b, 1) * (max_len or t_len)), device=logp.device)
        loss = (tok_sum * row_scale).sum()
        ctx.save_for_backward(dloss, row_scale)
        ctx.logp_dtype = logp.dtype
        stats = (clip_sum.sum() / total_cnt, kl_sum.sum() / total_cnt, ratio_sum.sum() / total_cnt)
        ctx.mark_non_differentiable(*stats)
        return (loss, *stats)

    @staticmethod
    def backward(ctx, grad_loss, *_):
        dloss, row_scale = ctx.saved_tensors
        grad = dloss * (grad_loss * row_scale).unsqueeze(1)
        return grad.to(ctx.logp_dtype), None, None, None, None, None, None, None, None, None
