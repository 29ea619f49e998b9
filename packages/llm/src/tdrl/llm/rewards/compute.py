"""Apply several reward functions to a batch; a function that raises gives 0 and is counted."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence

import torch

__all__ = ["RewardFn", "compute_rewards"]

log = logging.getLogger(__name__)

RewardFn = Callable[..., list[float]]


def _name(fn) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


def compute_rewards(
    reward_fns: Sequence[RewardFn],
    prompts: Sequence,
    completions: Sequence[str],
    columns: Mapping[str, Sequence] | None = None,
    weights: Sequence[float] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """Evaluate reward functions and sum them with weights.

    A reward function that raises, returns the wrong number of values, or returns a value
    that is not a finite number gives 0 for the affected samples; the count is reported.

    Args:
        reward_fns: ``K`` callables ``(prompts, completions, **columns) -> list[float]``.
        prompts: ``N`` prompts.
        completions: ``N`` completion texts.
        columns: extra dataset columns, each of length ``N``, passed as keyword arguments.
        weights: ``K`` weights (default all 1).

    Returns:
        ``(total [N], per_function [N, K], stats)`` where ``stats`` holds
        ``"reward_errors"`` (samples that got 0 because of an error) and the mean of each
        function (``"reward/<name>"``).
    """
    n = len(completions)
    weights = [1.0] * len(reward_fns) if weights is None else list(weights)
    if len(weights) != len(reward_fns):
        raise ValueError(f"compute_rewards: {len(reward_fns)} reward functions but {len(weights)} weights")
    per_fn = torch.zeros(n, len(reward_fns))
    errors = 0
    stats: dict[str, float] = {}
    for k, fn in enumerate(reward_fns):
        try:
            values = list(fn(prompts, completions, **dict(columns or {})))
            if len(values) != n:
                raise ValueError(f"returned {len(values)} values for {n} completions")
        except Exception as exc:  # a broken reward must never stop training
            log.warning("reward function %s raised %r; its rewards are 0 for this batch", _name(fn), exc)
            errors += n
            values = [0.0] * n
        for i, v in enumerate(values):
            try:
                v = float(v)
            except (TypeError, ValueError):
                v = math.nan
            if not math.isfinite(v):
                errors += 1
                v = 0.0
            per_fn[i, k] = v
        stats[f"reward/{_name(fn)}"] = per_fn[:, k].mean().item() if n else 0.0
    total = per_fn @ torch.tensor(weights, dtype=per_fn.dtype)
    stats["reward_errors"] = float(errors)
    return total, per_fn, stats
