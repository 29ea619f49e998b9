"""Public reverse discounted scan and GAE: Triton on CUDA, the torch reference elsewhere."""

from __future__ import annotations

import torch

from .._dispatch import torch_reference, use_triton
from .reference import discounted_cumsum_impl, gae_impl, reverse_scan_rows


def _check_unit(name: str, value: float | torch.Tensor) -> None:
    """Refuse a discount or trace decay outside ``[0, 1]`` (tensors: checked on the CPU;
    on an accelerator the check would cost a synchronisation, so it is skipped there)."""
    if isinstance(value, torch.Tensor):
        if value.device.type != "cpu" or value.numel() == 0:
            return
        lo, hi = float(value.min()), float(value.max())
    else:
        lo = hi = float(value)
    if not (0.0 <= lo and hi <= 1.0):  # also refuses NaN
        shown = value if not isinstance(value, torch.Tensor) else f"values in [{lo}, {hi}]"
        raise ValueError(f"{name} must lie in [0, 1], got {shown}.")


def _scan_fn(*tensors: torch.Tensor | None):
    if use_triton(*tensors):
        from .triton import reverse_scan_rows_triton

        return reverse_scan_rows_triton
    return reverse_scan_rows


def discounted_cumsum(
    x: torch.Tensor, gamma: float | torch.Tensor, done: torch.Tensor | None = None
) -> torch.Tensor:
    """Reverse discounted cumulative sum over time (dim -2).

    ``y[t] = x[t] + gamma * (1 - done[t]) * y[t + 1]``: the discounted return-to-go, cut at
    episode ends (``done[t]`` marks that step ``t`` is the last of its episode).

    Args:
        x: ``[..., T, F]`` floating tensor (usually ``[*batch, T, 1]`` rewards).
        gamma: discount, a float or a tensor broadcastable to ``x``.
        done: optional bool tensor of ``x``'s shape; ``True`` stops the sum after that step.

    Returns:
        ``[..., T, F]`` tensor of ``x``'s dtype (bfloat16/float16 are computed in float32).
        Differentiable with respect to ``x``.
    """
    return discounted_cumsum_impl(x, gamma, done, _scan_fn(x, done))


def gae(
    reward: torch.Tensor,
    value: torch.Tensor,
    next_value: torch.Tensor,
    done: torch.Tensor,
    terminated: torch.Tensor,
    gamma: float | torch.Tensor,
    lmbda: float | torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized Advantage Estimation (Schulman et al., 2016) over time (dim -2).

    ``delta[t] = r[t] + gamma * V(s[t+1]) * (1 - terminated[t]) - V(s[t])`` and
    ``A[t] = delta[t] + gamma * lmbda * (1 - done[t]) * A[t + 1]``: ``terminated`` stops
    bootstrapping from the next value, ``done`` (terminated or truncated) stops the
    lambda-trace. Same conventions as TorchRL's ``generalized_advantage_estimate``.

    Args:
        reward: ``[..., T, 1]`` rewards ``("next", "reward")``.
        value: ``[..., T, 1]`` state values ``V(s[t])``.
        next_value: ``[..., T, 1]`` values of the next states ``V(s[t+1])``.
        done: ``[..., T, 1]`` bool ``("next", "done")``.
        terminated: ``[..., T, 1]`` bool ``("next", "terminated")``.
        gamma: discount factor in ``[0, 1]`` (float or broadcastable tensor).
        lmbda: GAE lambda in ``[0, 1]`` (float or broadcastable tensor).

    Returns:
        ``(advantage, value_target)``, both ``[..., T, 1]`` with
        ``value_target = advantage + value``; low-precision inputs are computed in float32
        and returned in their dtype. Differentiable with respect to the values and rewards.
        ``T = 0`` gives empty tensors of the input shape.

    Raises:
        ValueError: ``gamma`` or ``lmbda`` outside ``[0, 1]``.
    """
    _check_unit("gamma", gamma)
    _check_unit("lmbda", lmbda)
    if reward.dim() >= 2 and reward.shape[-2] == 0:  # no time steps: nothing to scan
        out_dtype = torch.promote_types(reward.dtype, value.dtype)
        if value.shape != reward.shape:
            raise ValueError(f"value has shape {tuple(value.shape)}, reward {tuple(reward.shape)}.")
        return reward.to(out_dtype).clone(), value.to(out_dtype).clone()
    return gae_impl(
        reward, value, next_value, done, terminated, gamma, lmbda,
        _scan_fn(reward, value, next_value, done, terminated),
    )


discounted_cumsum_reference = torch_reference(discounted_cumsum)
gae_reference = torch_reference(gae)
