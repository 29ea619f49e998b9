"""Collector helpers: splitting a batch into trajectories, dropping next observations."""

from __future__ import annotations

import torch
from tensordict import TensorDictBase

from ..keys import TRAJ_ID, next_key

__all__ = ["split_trajectories", "compact_batch", "MASK_KEY"]

MASK_KEY = ("collector", "mask")


def split_trajectories(batch: TensorDictBase, traj_key=TRAJ_ID) -> TensorDictBase:
    """Regroup a batch ``(*env_batch, T)`` into one row per trajectory.

    Steps of a trajectory are the steps sharing a trajectory id, in time order. Rows are
    ordered by trajectory id and zero-padded to the longest one.

    Args:
        batch: collector output with ``traj_key`` of shape ``(*env_batch, T)``.
        traj_key: key of the trajectory ids.

    Returns:
        TensorDict ``(num_trajs, max_len)`` with a bool ``("collector", "mask")`` marking
        the real (non-padding) steps.
    """
    flat = batch.reshape(-1)  # env-major: each sub-env's steps stay in time order
    ids = flat.get(traj_key)
    order = torch.sort(ids, stable=True).indices
    _, counts = torch.unique_consecutive(ids[order], return_counts=True)
    n, max_len = counts.numel(), int(counts.max())
    starts = torch.cumsum(counts, 0) - counts
    pos = torch.arange(max_len)
    mask = pos < counts[:, None]  # [n, max_len]
    gather = (starts[:, None] + pos).clamp_max(ids.numel() - 1)
    index = order[gather]
    out = flat[index.reshape(-1)].reshape(n, max_len)
    out = out.apply(lambda x: x.masked_fill(~_bcast(mask, x), 0))
    out.set(MASK_KEY, mask)
    return out


def compact_batch(batch: TensorDictBase, keys) -> TensorDictBase:
    """``batch`` without ``("next", key)`` for each of ``keys`` (``compact_obs=True``).

    Rewards and done flags stay under ``"next"``; the observations of step ``t + 1`` are the
    root's observations of the step after, which
    :class:`~tdrl.core.replay.NextStateReconstructor` puts back. Keys the batch lacks are
    skipped.
    """
    nxt = batch.get("next", None)
    if nxt is None:
        return batch
    drop = [next_key(k) for k in keys if (k if isinstance(k, str) else tuple(k)) in nxt.keys(True)]
    return batch.exclude(*drop) if drop else batch


def _bcast(mask: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return mask.reshape(*mask.shape, *([1] * (x.ndim - mask.ndim)))
