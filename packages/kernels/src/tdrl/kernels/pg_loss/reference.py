"""Pure-torch policy-gradient token loss (PPO / GRPO / DAPO / Dr. GRPO).

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

:func:`pg_token_loss_reference` (the CPU path) makes one pass over the tokens that yields
the loss terms, their derivative with respect to ``logp`` and the statistics, mostly in
place (like the Triton kernel); its backward is one multiply. :func:`pg_token_loss_eager`
is the same loss as a plain composition of differentiable torch ops (the baseline of the
benchmarks and a second reference for the tests).
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


def pg_token_loss_eager(
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
    """:func:`pg_token_loss_reference` as a composition of differentiable eager torch ops."""
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


def row_scales(mask: torch.Tensor, reduction: str, max_len: int | None) -> torch.Tensor:
    """Weight of one unit of masked per-token loss in the reduced loss, per sequence.

    Args:
        mask: ``[B, T]`` float mask (compute dtype).
        reduction: ``"token"``, ``"sequence"`` or ``"constant"``.
        max_len: the constant length of ``"constant"`` (``None``: ``T``).

    Returns:
        ``[B]`` scales: ``1 / max(sum(mask), 1)`` for ``"token"``,
        ``1 / (B * max(sum_t mask[b], 1))`` for ``"sequence"``, ``1 / (B * max_len)`` for
        ``"constant"``.
    """
    b, t_len = mask.shape
    if reduction == "token":
        return (1.0 / mask.sum().clamp(min=1.0)).expand(b)
    if reduction == "sequence":
        return 1.0 / (mask.sum(-1).clamp(min=1.0) * max(b, 1))
    return torch.full((b,), 1.0 / (max(b, 1) * (max_len or t_len)), dtype=mask.dtype, device=mask.device)


def token_terms(
    lp: torch.Tensor,
    old: torch.Tensor,
    adv: torch.Tensor,
    m: torch.Tensor,
    keep: torch.Tensor,
    ref: torch.Tensor | None,
    eps_low: float,
    eps_high: float,
    beta: float,
    need_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token loss, its derivative and the statistics' terms, in one (mostly in-place) pass.

    Uses ``-min(r A, clip(r) A) = -A min(r, 1 + eps_high)`` for ``A > 0`` and
    ``-A max(r, 1 - eps_low)`` otherwise; the clip removes the gradient where that bound is
    active (``A != 0``).

    Args:
        lp, old: log-probs (compute dtype), any shape ``S``.
        adv: advantages broadcastable to ``S``.
        m: float mask of shape ``S``; ``keep`` its ``> 0`` bool.
        ref: reference log-probs of shape ``S`` or ``None``.
        eps_low, eps_high, beta: as in :func:`tdrl.kernels.pg_token_loss`.
        need_grad: also return ``d loss_t / d lp``.

    Returns:
        ``(loss_t, dloss_t, clipped_t, kl_t, ratio_t)`` of shape ``S``: the loss term and
        its derivative, both multiplied by ``m`` (``dloss_t`` ``None`` without
        ``need_grad``); a bool of the kept tokens whose gradient the clip removed; the k3
        KL and the ratio (both 0 off the mask).
    """
    drop = ~keep
    ratio = torch.sub(lp, old).masked_fill_(drop, 0.0).exp_()
    pos = adv > 0
    r_eff = torch.where(pos, ratio.clamp(max=1.0 + eps_high), ratio.clamp(min=1.0 - eps_low))
    clipped = (r_eff != ratio).logical_and_(adv != 0).logical_and_(keep)
    loss = r_eff.mul_(adv).neg_()
    grad = None
    if need_grad:
        grad = torch.mul(ratio, adv).neg_().masked_fill_(clipped, 0.0)
    if ref is not None:
        diff = torch.sub(ref, lp).masked_fill_(drop, 0.0)
        e = diff.exp()
        kl = torch.sub(e, diff).sub_(1.0)
        if beta != 0.0:
            loss.add_(kl, alpha=beta)
            if grad is not None:
                grad.sub_(e, alpha=beta).add_(beta)
    else:
        kl = torch.zeros((), dtype=lp.dtype, device=lp.device).expand(lp.shape)
    loss.mul_(m)
    if grad is not None:
        grad.mul_(m)
    return loss, grad, clipped, kl, ratio.masked_fill_(drop, 0.0)


class _WithGradient(torch.autograd.Function):
    """Attach a precomputed gradient: ``forward`` returns ``value``, ``backward`` scales ``grad``."""

    @staticmethod
    def forward(ctx, logp, value, grad):
        ctx.save_for_backward(grad)
        ctx.logp_dtype = logp.dtype
        return value.clone()

    @staticmethod
    def backward(ctx, grad_out):
        (grad,) = ctx.saved_tensors
        return (grad * grad_out).to(ctx.logp_dtype), None, None


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
    need_grad = logp.requires_grad and torch.is_grad_enabled()
    lp = logp.detach().to(cdt)
    m = mask.detach().to(cdt)
    keep = mask.detach() if mask.dtype == torch.bool else m > 0
    adv = advantages.detach().to(cdt)
    adv = adv.unsqueeze(1) if adv.dim() == 1 else adv
    ref = None if ref_logp is None else ref_logp.detach().to(cdt)
    loss_t, grad_t, clipped, kl, ratio = token_terms(
        lp, old_logp.detach().to(cdt), adv, m, keep, ref, eps_low, eps_high, beta, need_grad
    )
    scale = row_scales(m, reduction, max_len)
    loss = (loss_t.sum(-1) * scale).sum()
    if need_grad:
        loss = _WithGradient.apply(logp, loss, grad_t.mul_(scale.unsqueeze(1)))
    count = m.sum().clamp(min=1.0)
    stats = {
        "clip_frac": clipped.sum() / count,
        "kl": kl.sum() / count,
        "ratio_mean": ratio.sum() / count,
    }
    return loss, stats
