"""Fused LM head + masked cross-entropy (the SFT loss), gradients computed in the forward.

``loss = -sum_i w_i * logp_i / sum_i w_i`` (``"mean"``) or ``-sum_i w_i * logp_i``
(``"sum"``), with ``logp_i = log_softmax(hidden_i @ W.T + b)[y_i] / T`` and ``w_i`` the
token's weight (the mask, 1 without one; 0 for a negative target id). ``d loss / d logp_i =
-w_i / sum(w)`` is known before the first chunk, so the gradients are computed in the
forward (:mod:`.grads_in_forward`): three matmuls instead of the four of
``fused_linear_logprobs`` followed by a masked mean, two with a frozen head, and no
``[tokens, V]`` buffer (Liger-Kernel's fused linear cross-entropy does the same).
"""

from __future__ import annotations

import torch

from ..logprobs.reference import compute_dtype, default_chunk_rows
from .grads_in_forward import head_grads_in_forward, kept_rows, scaled_stored_grads
from .reference import check_fused_inputs

REDUCTIONS = ("mean", "sum")


class FusedLinearCrossEntropyFunction(torch.autograd.Function):
    """Chunked LM head + weighted negative log-likelihood, gradients in the forward."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, token_scale, config):
        temperature, chunk, need_grad, rows_fwd, rows_bwd = config
        cdt = compute_dtype(hidden.dtype)
        needs = tuple(need_grad and f for f in ctx.needs_input_grad[:3])
        total = torch.zeros((), dtype=cdt, device=hidden.device)

        def token_fn(s, e, lp, ent):
            nonlocal total
            sc = token_scale[s:e]
            total -= (lp.to(cdt) * sc).sum()
            return -sc

        ctx.grads = head_grads_in_forward(
            hidden, weight, bias, targets, temperature, chunk, needs, False, rows_fwd, rows_bwd, token_fn
        )
        return total

    @staticmethod
    def backward(ctx, grad_loss):
        grads = scaled_stored_grads(ctx, grad_loss, "fused_linear_cross_entropy")
        return (*grads, None, None, None)


def fused_linear_cross_entropy_impl(
    hidden, weight, targets, bias, mask, temperature, reduction, chunk_size, rows_fwd, rows_bwd
):
    """Shared body of :func:`tdrl.kernels.fused_linear_cross_entropy` for a pair of row functions."""
    check_fused_inputs(hidden, weight, targets, bias, temperature, "fused_linear_cross_entropy")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}.")
    if mask is not None and mask.shape != targets.shape:
        raise ValueError(f"mask must have the shape of targets {tuple(targets.shape)}, got {tuple(mask.shape)}.")
    cdt = compute_dtype(hidden.dtype)
    h = hidden.reshape(-1, hidden.shape[-1])
    tgt = targets.reshape(-1).long()
    w = (tgt >= 0).to(cdt)
    if mask is not None:
        if mask.dtype.is_floating_point and not bool(torch.isfinite(mask).all()):
            raise ValueError("mask holds NaN or infinite weights.")
        w = w * mask.detach().reshape(-1).to(cdt)
        if bool((w < 0).any()):
            raise ValueError("mask weights must be >= 0 (a token's weight in the loss).")
    kept, subset = kept_rows(w)
    if subset:  # tokens with weight 0 cost no matmul
        h = h.index_select(0, kept)  # differentiable: the gradient scatters back
        tgt, w = tgt.index_select(0, kept), w.index_select(0, kept)
    scale = w / w.sum() if (reduction == "mean" and kept.numel() > 0) else w
    chunk = chunk_size or default_chunk_rows(h.shape[0], weight.shape[0], hidden.device)
    need_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (hidden, weight, bias)
    )
    config = (float(temperature), max(1, int(chunk)), need_grad, rows_fwd, rows_bwd)
    return FusedLinearCrossEntropyFunction.apply(h, weight, bias, tgt, scale, config)
