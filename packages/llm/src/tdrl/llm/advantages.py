"""Group-relative advantages (GRPO, Shao et al. 2024, arXiv:2402.03300)."""

from __future__ import annotations

import torch

__all__ = ["SCALE_REWARDS", "group_advantages", "scale_mode"]

SCALE_REWARDS = ("group", "batch", "none")


def scale_mode(owner: str, value) -> str:
    """TRL's ``scale_rewards`` values as one of :data:`SCALE_REWARDS` (``True`` is ``"group"``,
    ``False`` ``"none"``); anything else is refused (a string must not pass as ``True``)."""
    if value is True or value is False:
        return "group" if value else "none"
    if isinstance(value, str) and value in SCALE_REWARDS:
        return value
    raise ValueError(f"{owner}.scale_rewards={value!r}: expected one of {SCALE_REWARDS}, True (= 'group') or False (= 'none')")


def group_advantages(rewards: torch.Tensor, group_size: int, scale: bool | str = True, eps: float = 1e-4) -> torch.Tensor:
    """Advantage of each completion relative to the others answering the same prompt.

    ``A_i = (r_i - mean_g(r)) / (std_g(r) + eps)`` with ``scale="group"`` / ``True`` (GRPO),
    ``A_i = (r_i - mean_g(r)) / (std(r) + eps)`` with ``scale="batch"`` (the std of all ``N``
    rewards; Lite PPO, Liu et al. 2025, arXiv:2508.08221), or ``A_i = r_i - mean_g(r)`` with
    ``scale="none"`` / ``False`` (Dr. GRPO, Liu et al. 2025, arXiv:2503.20783): TRL's
    ``scale_rewards`` values. Groups whose rewards are all equal get exactly 0.

    Args:
        rewards: ``[N]`` with ``N = n_prompts * group_size``, completions of one prompt
            contiguous.
        group_size: completions per prompt ``G``.
        scale: ``"group"`` / ``True``, ``"batch"`` or ``"none"`` / ``False``: which (unbiased)
            standard deviation divides the centred rewards.
        eps: added to the standard deviation.

    Returns:
        ``[N]`` advantages (float32).
    """
    if rewards.ndim != 1 or rewards.numel() % group_size:
        raise ValueError(
            f"group_advantages: rewards must be [n_prompts * group_size] with group_size={group_size}, "
            f"got shape {tuple(rewards.shape)}"
        )
    mode = scale_mode("group_advantages", scale)
    r = rewards.float().reshape(-1, group_size)
    adv = r - r.mean(dim=1, keepdim=True)
    if mode == "group" and group_size > 1:
        adv = adv / (r.std(dim=1, keepdim=True) + eps)
    elif mode == "batch" and r.numel() > 1:
        adv = adv / (r.std() + eps)
    same = (r.max(dim=1, keepdim=True).values == r.min(dim=1, keepdim=True).values)
    adv = torch.where(same, torch.zeros_like(adv), adv)
    return adv.reshape(-1)
