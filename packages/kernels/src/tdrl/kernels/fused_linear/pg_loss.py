"""Fused LM head + log-probs + policy-gradient token loss, gradients computed in the forward.

``fused_linear_logprobs`` cannot know the gradient that will reach its log-probs, so its
backward recomputes every chunk's logits: four matmuls in all. When the log-probs feed the
PPO / GRPO token loss of :mod:`tdrl.kernels.pg_loss`, the per-token ``d loss / d logp`` is
known as soon as a chunk's log-probs are, so the gradients are computed chunk by chunk in the
forward (:mod:`.grads_in_forward`): three matmuls and ``O(chunk x V)`` extra memory.

The reductions need per-sequence token counts before the first chunk: they come from the
mask, so every token's weight in the loss (``mask * row_scale[b]``) is known up front.
Tokens outside the mask contribute nothing, so only the masked rows are gathered and go
through the LM head (one host sync for their count).

Two extras serve a trainer that would otherwise need a second pass: ``old_logp=None`` is the
on-policy single update (each chunk's own log-probs, detached, are the old ones: ratio 1),
and the per-token log-probs and the mean entropy (computed by the same softmax pass) can be
returned as detached outputs.
"""

from __future__ import annotations

import torch

from ..logprobs.reference import compute_dtype, default_chunk_rows
from ..pg_loss.reference import check_pg_inputs, expand_advantages, row_scales, token_terms
from .grads_in_forward import head_grads_in_forward, kept_rows, scaled_stored_grads
from .reference import check_fused_inputs


class FusedLinearPGLossFunction(torch.autograd.Function):
    """Chunked LM head + log-probs + PG loss with the gradients computed in the forward."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, old, adv, mask, ref, scale, config):
        temperature, eps_low, eps_high, beta, chunk, need_grad, need_ent, need_logp, rows_fwd, rows_bwd = config
        n = hidden.shape[0]
        cdt = compute_dtype(hidden.dtype)
        needs = tuple(need_grad and f for f in ctx.needs_input_grad[:3])
        backprop = any(needs)
        sums = torch.zeros(5, dtype=cdt, device=hidden.device)  # loss, clipped, kl, ratio, entropy
        zero = sums.new_zeros(())
        logp_out = torch.empty(n if need_logp else 0, dtype=cdt, device=hidden.device)

        def token_fn(s, e, lp, ent):
            nonlocal sums
            if need_logp:
                logp_out[s:e] = lp
            m = mask[s:e]
            # on-policy (old is None): the ratio's denominator is the current value itself
            old_c = lp.clone() if old is None else old[s:e]
            loss_t, dloss_t, clip_t, kl_t, ratio_t = token_terms(
                lp, old_c, adv[s:e], m, m > 0, None if ref is None else ref[s:e],
                eps_low, eps_high, beta, backprop,
            )
            sc = scale[s:e]
            ent_sum = (ent.to(cdt) * m).sum() if need_ent else zero
            sums += torch.stack([(loss_t * sc).sum(), clip_t.sum().to(sums.dtype), kl_t.sum(), ratio_t.sum(), ent_sum])
            return dloss_t * sc if backprop else None

        grads = head_grads_in_forward(
            hidden, weight, bias, targets, temperature, chunk, needs, need_ent, rows_fwd, rows_bwd, token_fn
        )
        count = mask.sum().clamp(min=1.0)
        # Held on ctx rather than saved: backward hands these very tensors to autograd (scaled
        # in place), so the [V, H] weight gradient is never copied.
        ctx.grads = grads
        loss = sums[0]
        stats = sums[1] / count, sums[2] / count, sums[3] / count, sums[4] / count
        ctx.mark_non_differentiable(*stats, logp_out)
        return (loss, *stats, logp_out)

    @staticmethod
    def backward(ctx, grad_loss, *_):
        grads = scaled_stored_grads(ctx, grad_loss, "fused_linear_pg_loss")
        return (*grads, None, None, None, None, None, None, None)


def fused_linear_pg_loss_impl(
    hidden, weight, targets, old_logp, advantages, mask, ref_logp, bias, temperature, eps_low,
    eps_high, beta, reduction, max_len, chunk_size, return_entropy, return_logprobs, rows_fwd, rows_bwd,
):
    """Shared body of :func:`tdrl.kernels.fused_linear_pg_loss` for a pair of row functions."""
    if targets.dim() != 2:
        raise ValueError(
            f"fused_linear_pg_loss expects hidden [B, T, H] and targets [B, T]; got hidden "
            f"{tuple(hidden.shape)} and targets {tuple(targets.shape)}."
        )
    check_fused_inputs(hidden, weight, targets, bias, temperature, "fused_linear_pg_loss")
    check_pg_inputs(targets, old_logp, advantages, mask, ref_logp, reduction, max_len)
    cdt = compute_dtype(hidden.dtype)
    h = hidden.reshape(-1, hidden.shape[-1])
    n = h.shape[0]
    m = mask.detach().to(cdt)
    scale = row_scales(m, reduction, max_len).unsqueeze(1).expand(targets.shape).reshape(n)
    adv = expand_advantages(advantages.detach().to(cdt), targets.shape).reshape(n)
    old = None if old_logp is None else old_logp.detach().to(cdt).reshape(n)
    ref = None if ref_logp is None else ref_logp.detach().to(cdt).reshape(n)
    tgt, m = targets.reshape(n).long(), m.reshape(n)
    # Masked-out tokens add nothing to the loss, its gradient or the statistics: only the
    # kept rows go through the LM head (padding of ragged completions costs no matmul).
    kept, subset = kept_rows(m)
    if subset:
        h = h.index_select(0, kept)  # differentiable: the gradient scatters back
        tgt, adv, m, scale = (x.index_select(0, kept) for x in (tgt, adv, m, scale))
        old = None if old is None else old.index_select(0, kept)
        ref = None if ref is None else ref.index_select(0, kept)
    chunk = chunk_size or default_chunk_rows(h.shape[0], weight.shape[0], hidden.device)
    need_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (hidden, weight, bias)
    )
    config = (float(temperature), float(eps_low), float(eps_high), float(beta), max(1, int(chunk)),
              need_grad, bool(return_entropy), bool(return_logprobs), rows_fwd, rows_bwd)
    loss, clip_frac, kl, ratio_mean, entropy, logp = FusedLinearPGLossFunction.apply(
        h, weight, bias, tgt, old, adv, m, ref, scale, config
    )
    stats = {"clip_frac": clip_frac, "kl": kl, "ratio_mean": ratio_mean}
    if return_entropy:
        stats["entropy"] = entropy
    if return_logprobs:
        full = logp.new_zeros(n).index_copy_(0, kept, logp) if subset else logp
        stats["logp"] = full.reshape(targets.shape)
    return loss, stats
