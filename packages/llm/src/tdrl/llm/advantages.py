"""Group-relative advantages (GRPO, Shao et al. 2024, arXiv:2402.03300)."""

from __future__ import annotations

import torch

__all__ = ["group_advantages"]


def group_advantages(rewards: torch.Tensor, group_size: int, scale: bool = True, eps: float = 1e-4) -> torch.Tensor:
    """Advantage of each completion relative to the others answering the same prompt.

    ``A_i = (r_i - mean_g(r)) / (std_g(r) + eps)`` with ``scale=True`` (GRPO), or
    ``A_i = r_i - mean_g(r)`` with ``scale=False`` (Dr. GRPO, Liu et al. 2025,
    arXiv:2503.20783). Groups whose rewards are all equal get exactly 0.

    Args:
        rewards: ``[N]`` with ``N = n_prompts * group_size``, completions of one prompt
            contiguous.
        group_size: completions per prompt ``G``.
        scale: divide by the group's (unbiased) standard deviation.
        eps: added to the standard deviation.

    Returns:
        ``[N]`` advantages (float32).
    """
    if rewards.ndim != 1 or rewards.numel() % group_size:
        raise ValueError(
            f"group_advantages: rewards must be [n_prompts * group_size] with group_size={group_size}, "
            f"got shape {tuple(rewards.shape)}"
        )
    r = rewards.float().reshape(-1, group_size)
    adv = r - r.mean(dim=1, keepdim=True)
    if scale and group_size > 1:
        adv = adv / (r.std(dim=1, keepdim=True) + eps)
    same = (r.max(dim=1, keepdim=True).values == r.min(dim=1, keepdim=True).values)
    adv = torch.where(same, torch.zeros_like(adv), adv)
    return adv.reshape(-1)
