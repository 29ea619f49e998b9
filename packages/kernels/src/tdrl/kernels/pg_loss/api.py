"""Public policy-gradient token loss: fused Triton kernel on CUDA, eager torch elsewhere."""

from __future__ import annotations

import torch

from .._dispatch import call_reference, use_triton
from .reference import check_pg_inputs, pg_token_loss_reference


def pg_token_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    ref_logp: torch.Tensor | None = None,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    beta: float = 0.0,
    reduction: str = "token",
    max_len: int | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped policy-gradient loss over tokens with an optional k3 KL penalty.

    ``loss_t = -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A) + beta * kl_t`` with
    ``r = exp(logp - old_logp)`` and ``kl_t = exp(ref - logp) - (ref - logp) - 1``, reduced
    over the masked tokens (see :mod:`tdrl.kernels.pg_loss.reference`). On CUDA one Triton
    pass computes the loss terms, their gradient and the statistics; elsewhere the one-pass
    torch reference runs (through ``torch.compile`` with ``TDRL_KERNELS=compile``).

    Args:
        logp: ``[B, T]`` log-probs of the sampled tokens under the current policy.
        old_logp: ``[B, T]`` log-probs under the sampling policy (constants).
        advantages: ``[B]`` (one per sequence, GRPO) or ``[B, T]`` advantages (constants).
        mask: ``[B, T]`` bool/float mask of the tokens that count (completion tokens).
        ref_logp: optional ``[B, T]`` reference-model log-probs for the KL term.
        eps_low: lower clip range: ratios below ``1 - eps_low`` are clipped.
        eps_high: upper clip range (DAPO's clip-higher uses e.g. 0.28).
        beta: weight of the KL penalty (needs ``ref_logp`` to be non-zero).
        reduction: ``"token"``, ``"sequence"`` or ``"constant"`` (see module docs).
        max_len: the constant length of ``"constant"``; defaults to ``T``.

    Returns:
        ``(loss, stats)``: a float32 (float64 for float64 ``logp``) scalar differentiable
        with respect to ``logp``, and a
        dict of detached float32 scalars ``clip_frac`` (fraction of masked tokens whose
        gradient the clip removed), ``kl`` (masked mean k3 KL, 0 without ``ref_logp``) and
        ``ratio_mean`` (masked mean ratio).
    """
    if use_triton(logp, old_logp, advantages, mask, ref_logp):
        from .triton import PGTokenLossFunction

        check_pg_inputs(logp, old_logp, advantages, mask, ref_logp, reduction, max_len)
        loss, clip_frac, kl, ratio_mean = PGTokenLossFunction.apply(
            logp, old_logp, advantages, mask, ref_logp, float(eps_low), float(eps_high), float(beta),
            reduction, max_len,
        )
        return loss, {"clip_frac": clip_frac, "kl": kl, "ratio_mean": ratio_mean}
    return call_reference(
        pg_token_loss_reference,
        logp, old_logp, advantages, mask, ref_logp, eps_low, eps_high, beta, reduction, max_len,
    )
