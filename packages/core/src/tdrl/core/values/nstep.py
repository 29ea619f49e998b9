"""n-step transitions: the discounted reward sums and the discount a bootstrap then uses.

:func:`nstep_returns` is the maths of :class:`~tdrl.core.transforms.MultiStepTransform`
(Sutton 1988, "Learning to predict by the methods of temporal differences"; the n-step targets
of Rainbow, Hessel et al. 2018): step ``t`` sums ``r_t + gamma r_{t+1} + ... +
gamma^{k-1} r_{t+k-1}`` with ``k = min(n, steps left in its episode)``, and bootstraps from the
observation ``k`` steps ahead. The data then carries ``"steps_to_next_obs"`` (``k``), and every
one-step target of tdrl (the losses' bootstrap and the TD(0) estimator) discounts by
``gamma ** k`` instead of ``gamma`` through :func:`step_discount`, as TorchRL's estimators do.
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from torch import Tensor

from tdrl.core.keys import STEPS_TO_NEXT_OBS

__all__ = ["nstep_returns", "step_discount"]


def nstep_returns(reward: Tensor, done: Tensor, n_steps: int, gamma: float) -> tuple[Tensor, Tensor]:
    """Discounted sums of the next ``n_steps`` rewards, stopping at the episode end.

    Args:
        reward: ``[*B, T, *R]`` float (``R`` e.g. ``(1,)``); time is dim ``len(B)``.
        done: ``[*B, T]`` bool: step ``t`` ended its episode.
        n_steps: ``n >= 1`` (``1``: the rewards unchanged).
        gamma: discount.

    Returns:
        ``(summed, steps)``: ``summed`` ``[*B, T, *R]``, and ``steps`` int64 ``[*B, T]``, the
        number of rewards summed (``min(n, steps to the episode's last step in the data,
        inclusive)``); ``t + steps - 1`` is the step whose next observation ends the window.
    """
    if not isinstance(n_steps, int) or n_steps < 1:
        raise ValueError(f"n_steps must be an int >= 1, got {n_steps!r}.")
    t_dim = done.dim() - 1
    if reward.shape[: t_dim + 1] != done.shape:
        raise ValueError(f"reward {tuple(reward.shape)} must start with the done shape {tuple(done.shape)}.")
    T = done.shape[-1]
    idx = torch.arange(T, device=done.device)
    # the first episode end at or after t (the last step of the data when none): a reverse cummin
    ends = torch.where(done.bool(), idx, torch.full_like(idx, T - 1))
    last = ends.flip(-1).cummin(-1).values.flip(-1)
    steps = (last - idx + 1).clamp_max(n_steps)
    summed = torch.zeros_like(reward)
    extra = reward.dim() - done.dim()
    for k in range(min(n_steps, T)):
        shifted = reward.narrow(t_dim, k, T - k)
        keep = (steps.narrow(-1, 0, T - k) > k).reshape(*done.shape[:-1], T - k, *([1] * extra))
        summed.narrow(t_dim, 0, T - k).add_(torch.where(keep, shifted, torch.zeros_like(shifted)) * gamma**k)
    return summed, steps


def step_discount(td: TensorDictBase, gamma: float, like: Tensor) -> Tensor | float:
    """The discount of a bootstrap from ``td["next"]``: ``gamma ** td["steps_to_next_obs"]``
    shaped like ``like`` (``[*B, 1]`` or ``[*B, T, 1]``) on n-step data, else ``gamma``.

    Args:
        td: the batch (``"steps_to_next_obs"`` at its root, ``[*B]`` or ``[*B, 1]``, is optional).
        gamma: the one-step discount.
        like: the tensor the discount multiplies (its shape and dtype are taken).
    """
    steps = td.get(STEPS_TO_NEXT_OBS, None)
    if steps is None:
        return gamma
    if steps.numel() != like.numel():
        raise ValueError(f"{STEPS_TO_NEXT_OBS!r} has shape {tuple(steps.shape)}; expected one value "
                         f"per target, {tuple(like.shape)}.")
    return torch.pow(torch.as_tensor(gamma, dtype=like.dtype, device=like.device),
                     steps.reshape(like.shape).to(like.dtype))
