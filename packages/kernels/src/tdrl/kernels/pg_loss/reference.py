"""Pure-torch policy-gradient token loss (PPO / GRPO / DAPO / Dr. GRPO), eager ops.

Per token, with ``ratio = exp(logp - old_logp)`` and advantage ``A``::

    loss_t = -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A) + beta * kl_t
    kl_t   = exp(ref_logp - logp) - (ref_logp - logp) - 1          (the k3 estimator)

(Schulman et al., 2017, PPO; Shao et al., 2024, GRPO; Yu et al., 2025, DAPO's asymmetric
"clip-higher"; Liu et al., 2025, Dr. GRPO's constant normaliser.) Reductions over masked
tokens:

* ``"token"``: sum over all masked tokens / number of masked tokens (DAPO);
* ``"sequence"``: mean over the ``B`` sequences of each sequence's token mean (GRPO);
* ``"constant"``: sum / (``B * max_len``), ``max_len`` defaulting to ``T`` (Dr. GRPO).

Gradients flow to ``logp`` only: ``old_logp``, ``ref_logp`` and ``advantages`` are
treated as constants (detached). Masked-out tokens contribute nothing, even where their
log-probs are not finite. Empty masks give a zero loss, not NaN.
"""

from __future__ import annotations

import torch

REDUCTIONS = ("token", "sequence", "constant")


def check_pg_inputs(logp, old_logp, advantages, mask, ref_logp, reduction, max_len) -> None:
    """Validate :func:`pg_token_loss` inputs with messages for the user."""
    if logp.dim() != 2:
        raise ValueError(f"logp must have shape [B, T], got {tuple(logp.shape)}.")
    for name, t in (("old_logp", old_logp), ("mask", mask), ("ref_logp", ref_logp)):
        if t is not None and t.shape != logp.shape:
            raise ValueError(f"{name} must have logp's shape {tuple(logp.shape)}, got {tuple(t.shape)}.")
    if advantages.shape not in (logp.shape[:1], logp.shape, (logp.shape[0], 1)):
        raise ValueError(
            f"advantages must have shape [B] or [B, T] = {tuple(logp.shape)}, got {tuple(advantages.shape)}."
        )
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}.")
    if max_len is not None and max_len <= 0:
        raise ValueError(f"max_len must be a positive int, got {max_len}.")


def expand_advantages(advantages: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """``[B]`` / ``[B, 1]`` / ``[B, T]`` advantages as a ``[B, T]`` view."""
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    return advantages.expand(shape)


def reduce_tokens(
    per_token: torch.Tensor, mask: torch.Tensor, reduction: str, max_len: int | None
) -> torch.Tensor:
    """Masked reduction of a ``[B, T]`` per-token quantity (``mask`` is float, zeros elsewhere)."""
    b, t_len = per_token.shape
    total = per_token.sum()
    if reduction == "token":
        return total / mask.sum().clamp(min=1.0)
    if reduction == "sequence":
        return (per_token.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean() if b else total
    return total / (max(b, 1) * (max_len if max_len is not None else t_len))


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over the tokens where ``mask`` is set (0 for an empty mask)."""
    return (torch.where(mask > 0, x, torch.zeros_like(x))).sum() / mask.sum().clamp(min=1.0)


def pg_token_loss_reference(
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
    """Pure-torch :func:`tdrl.kernels.pg_token_loss` (same signature and result)."""
    check_pg_inputs(logp, old_logp, advantages, mask, ref_logp, reduction, max_len)
    cdt = torch.float64 if logp.dtype == torch.float64 else torch.float32
    lp = logp.to(cdt)
    m = mask.to(cdt)
    keep = m > 0
    adv = expand_advantages(advantages.detach().to(cdt), logp.shape)
    log_ratio = torch.where(keep, lp - old_logp.detach().to(cdt), torch.zeros_like(lp))
    ratio = torch.exp(log_ratio)
    clipped_ratio = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    per_token = -torch.minimum(ratio * adv, clipped_ratio * adv)
    kl = torch.zeros_like(lp)
    if ref_logp is not None:
        diff = torch.where(keep, ref_logp.detach().to(cdt) - lp, torch.zeros_like(lp))
        kl = torch.exp(diff) - diff - 1.0
        if beta != 0.0:
            per_token = per_token + beta * kl
    per_token = torch.where(keep, per_token * m, torch.zeros_like(per_token))
    loss = reduce_tokens(per_token, m, reduction, max_len)
    with torch.no_grad():
        clipped = ((ratio < 1.0 - eps_low) & (adv < 0)) | ((ratio > 1.0 + eps_high) & (adv > 0))
        stats = {
            "clip_frac": masked_mean(clipped.float(), m),
            "kl": masked_mean(kl.detach(), m),
            "ratio_mean": masked_mean(ratio.detach(), m),
        }
    return loss, stats
