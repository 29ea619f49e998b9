"""Chunked fused LM head + token log-probs, pure torch (the row math is shared).

``logits = hidden @ weight.T + bias`` is never formed for all ``N`` tokens: rows of
``hidden`` are processed ``chunk`` at a time, so only a ``[chunk, V]`` logits buffer exists
in the forward and in the backward, which recomputes it. The backward writes the logits
gradient into that same buffer, then ``grad_hidden[chunk] = g @ weight`` and
``grad_weight += g.T @ hidden[chunk]`` (accumulated in the weight's dtype, as Liger-Kernel
does). Peak extra memory is ``O(chunk x V)`` plus the gradients themselves.

Frozen LM head (LoRA, adapters, a frozen tied embedding: ``hidden`` needs a gradient, the
weight and bias do not, no entropy requested): the gradient of a token's log-prob with respect
to its hidden state does not depend on the upstream gradient except by a per-row factor,
``d logp_i / d h_i = (W[y_i] - p_i @ W) / temperature``. The forward computes it for each
chunk while the chunk's logits are at hand (``[N, H]`` saved, like ``hidden`` itself) and the
backward only scales its rows, so the op costs two matmuls, as the full-logits path does,
instead of three (forward, recomputed logits, gradient).

The row functions (softmax statistics and their gradient) come from
:mod:`tdrl.kernels.logprobs`: torch here, Triton in :mod:`.triton`.
"""

from __future__ import annotations

import torch

from ..logprobs.reference import (
    backward_rows,
    forward_in_chunks,
    in_lead_shape,
    torch_workspace,
    check_target_range,
    compute_dtype,
    default_chunk_rows,
)
from .grads_in_forward import head_grads_in_forward, head_logits


class FusedLinearLogprobsFunction(torch.autograd.Function):
    """Chunked ``log_softmax(hidden @ W.T + b)[target]`` with a recomputing backward (with a
    frozen head: ``d logp / d hidden`` formed in the forward, the backward only scales it)."""

    @staticmethod
    def forward(
        ctx, hidden, weight, bias, targets, temperature, need_entropy, chunk, rows_fwd, rows_bwd,
        frozen_head=False,
    ):
        n = hidden.shape[0]
        dtype = compute_dtype(hidden.dtype)
        logp = torch.empty(n, dtype=dtype, device=hidden.device)
        entropy = torch.empty_like(logp) if need_entropy else None
        if frozen_head:  # d logp / d hidden for a unit upstream gradient, formed in the forward
            ones = torch.ones(min(chunk, n), dtype=dtype, device=hidden.device)

            def token_fn(s, e, lp, ent):
                logp[s:e] = lp
                return ones[: e - s]

            dlogp_dh, _, _ = head_grads_in_forward(
                hidden, weight, bias, targets, temperature, chunk, (True, False, False), False,
                rows_fwd, rows_bwd, token_fn,
            )
            ctx.save_for_backward(dlogp_dh, targets)
        else:
            lse = torch.empty_like(logp)
            ws = torch_workspace(rows_fwd, min(chunk, n), weight.shape[0], weight)
            forward_in_chunks(rows_fwd, lambda s, e: head_logits(hidden[s:e], weight, bias), targets, chunk,
                              temperature, need_entropy, ws, logp, lse, entropy)
            ctx.save_for_backward(hidden, weight, bias, targets, lse, entropy)
        ctx.frozen_head = frozen_head
        ctx.config = (temperature, chunk, rows_bwd)
        if need_entropy:
            return logp, entropy
        return logp

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy=None):
        if ctx.frozen_head:
            dlogp_dh, _ = ctx.saved_tensors
            grad_hidden = None
            if grad_logp is not None and ctx.needs_input_grad[0]:
                scale = grad_logp.to(compute_dtype(dlogp_dh.dtype)).unsqueeze(1)
                grad_hidden = (dlogp_dh * scale).to(dlogp_dh.dtype)
            return grad_hidden, None, None, None, None, None, None, None, None, None
        hidden, weight, bias, targets, lse, entropy = ctx.saved_tensors
        temperature, chunk, rows_bwd = ctx.config
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_hidden = torch.empty_like(hidden) if need_h else None
        # the first chunk writes the [V, H] weight gradient, later ones add to it: no zero fill
        grad_weight, w_written = (torch.empty_like(weight) if need_w else None), False
        grad_bias = torch.zeros_like(bias) if (need_b and bias is not None) else None
        n = hidden.shape[0]
        ws = torch_workspace(rows_bwd, min(chunk, n), weight.shape[0], weight)
        for s in range(0, n, chunk):
            e = min(n, s + chunk)
            h = hidden[s:e]
            logits = head_logits(h, weight, bias)
            g = backward_rows(rows_bwd, s, e, logits, logits, targets, temperature, lse, entropy, grad_logp,
                              grad_entropy, ws)
            if grad_hidden is not None:
                torch.mm(g, weight, out=grad_hidden[s:e])
            if grad_weight is not None:
                if w_written:
                    grad_weight.addmm_(g.t(), h)
                else:
                    torch.mm(g.t(), h, out=grad_weight)
                    w_written = True
            if grad_bias is not None:
                grad_bias += g.sum(0).to(grad_bias.dtype)
            del logits, g
        if grad_weight is not None and not w_written:  # no rows
            grad_weight.zero_()
        return grad_hidden, grad_weight, grad_bias, None, None, None, None, None, None, None


def check_fused_inputs(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, bias: torch.Tensor | None,
    temperature: float, op: str = "fused_linear_logprobs",
) -> None:
    """Validate the inputs of the fused LM-head op ``op`` with messages for the user."""
    if weight.dim() != 2 or hidden.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"{op} expects hidden [N, H] and weight [V, H]; got hidden "
            f"{tuple(hidden.shape)} and weight {tuple(weight.shape)}."
        )
    if hidden.shape[:-1] != targets.shape:
        raise ValueError(
            f"targets must have hidden's leading shape {tuple(hidden.shape[:-1])}, got {tuple(targets.shape)}."
        )
    if hidden.dtype != weight.dtype:
        raise TypeError(f"hidden ({hidden.dtype}) and weight ({weight.dtype}) must share a dtype.")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"bias must have shape ({weight.shape[0]},), got {tuple(bias.shape)}.")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}.")
    if targets.is_floating_point() or targets.is_complex():
        raise TypeError(f"targets must hold integer token ids, got {targets.dtype}.")
    check_target_range(targets, weight.shape[0], op)


def fused_linear_logprobs_impl(
    hidden, weight, targets, bias, temperature, chunk_size, return_entropy, rows_fwd, rows_bwd
):
    """Shared body of :func:`fused_linear_logprobs` for a pair of row functions."""
    check_fused_inputs(hidden, weight, targets, bias, temperature)
    lead = targets.shape
    h = hidden.reshape(-1, hidden.shape[-1])
    tgt = targets.reshape(-1).long()
    chunk = chunk_size or default_chunk_rows(h.shape[0], weight.shape[0], hidden.device)
    frozen_head = (
        torch.is_grad_enabled() and h.requires_grad and not return_entropy
        and not weight.requires_grad and not (bias is not None and bias.requires_grad)
    )
    out = FusedLinearLogprobsFunction.apply(
        h, weight, bias, tgt, float(temperature), bool(return_entropy), max(1, int(chunk)),
        rows_fwd, rows_bwd, frozen_head,
    )
    return in_lead_shape(out, lead, return_entropy)
