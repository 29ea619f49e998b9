"""Trajectory-slice sampling: contiguous sub-trajectories that never cross an episode end.

Episodes are found in the storage either by a trajectory id (a new episode starts where
the id changes, e.g. the collector's ``("collector", "traj_ids")``) or by done flags (a
new episode starts after an item whose ``("next", "done")`` is True). The storage's
write cursor and slot 0 are boundaries too, so a slice never joins the newest and the
oldest items of a full ring buffer. Every valid slice start is equally likely, so each
transition of a long episode is as likely to be replayed as one of a short episode.

Sampled batches have shape ``[num_slices, slice_len]``: time is the last dim, as in a
rollout.
"""

from __future__ import annotations

import torch

from .samplers import Sampler, check_nonempty
from .storages import Storage, TensorStorage

__all__ = ["SliceSampler"]

_DEFAULT_TRAJ_KEY = ("collector", "traj_ids")
_DEFAULT_END_KEY = ("next", "done")


def _norm_key(key):
    return (key,) if isinstance(key, str) else tuple(key)


class SliceSampler(Sampler):
    """Samples ``num_slices`` slices of ``slice_len`` consecutive steps of one episode each.

    Give one of ``num_slices`` / ``slice_len``; the other is ``batch_size // given``.
    Episodes shorter than ``slice_len`` are never sampled.

    Args:
        num_slices: slices per batch.
        slice_len: steps per slice.
        traj_key: key of an episode id per item. Default: ``("collector", "traj_ids")``
            when the storage has it, else episodes are split by ``end_key``.
        end_key: key of a done flag per item (default ``("next", "done")``); used when
            ``traj_key`` is not given and the storage has no trajectory ids.

    Raises:
        ValueError: at sampling, if ``batch_size`` is not a multiple of the given length,
            or no episode in the storage is at least ``slice_len`` long.
    """

    def __init__(self, num_slices: int | None = None, slice_len: int | None = None,
                 traj_key=None, end_key=None) -> None:
        if (num_slices is None) == (slice_len is None):
            raise ValueError("SliceSampler needs exactly one of num_slices and slice_len.")
        if (num_slices or slice_len) < 1:
            raise ValueError("num_slices / slice_len must be >= 1.")
        self.num_slices = num_slices
        self.slice_len = slice_len
        self.traj_key = None if traj_key is None else _norm_key(traj_key)
        self.end_key = _norm_key(end_key) if end_key is not None else None
        self._cache: tuple | None = None  # (len, cursor, starts, lengths)

    def mark_update(self, index: torch.Tensor, storage: Storage) -> None:
        self._cache = None

    def _shape(self, batch_size: int) -> tuple[int, int]:
        given = self.num_slices or self.slice_len
        if batch_size % given:
            raise ValueError(
                f"batch_size {batch_size} is not a multiple of "
                f"{'num_slices' if self.num_slices else 'slice_len'}={given}."
            )
        if self.num_slices:
            return self.num_slices, batch_size // self.num_slices
        return batch_size // self.slice_len, self.slice_len

    def _column(self, storage: TensorStorage, key) -> torch.Tensor:
        col = storage._leaves.get(key)
        if col is None:
            raise KeyError(
                f"SliceSampler: key {key!r} is not in the storage (keys: {list(storage._leaves)}); "
                "pass traj_key= or end_key= naming a stored key."
            )
        n = len(storage)
        return col[:n].reshape(n, -1)[:, 0]

    def _segments(self, storage: Storage) -> tuple[torch.Tensor, torch.Tensor]:
        n = len(storage)
        if self._cache is not None and self._cache[:2] == (n, storage.cursor):
            return self._cache[2], self._cache[3]
        if not isinstance(storage, TensorStorage):
            raise TypeError("SliceSampler needs a TensorStorage (or MemmapStorage).")
        start = torch.zeros(n, dtype=torch.bool)
        start[0] = True
        traj_key = self.traj_key
        if traj_key is None and self.end_key is None and _DEFAULT_TRAJ_KEY in storage._leaves:
            traj_key = _DEFAULT_TRAJ_KEY
        if traj_key is not None:
            ids = self._column(storage, traj_key).cpu()
            start[1:] = ids[1:] != ids[:-1]
        else:
            done = self._column(storage, self.end_key or _DEFAULT_END_KEY).cpu().bool()
            start[1:] = done[:-1]
        if 0 < storage.cursor < n:
            start[storage.cursor] = True  # newest item is followed by the oldest one
        starts = start.nonzero().squeeze(-1)
        lengths = torch.diff(starts, append=torch.tensor([n]))
        self._cache = (n, storage.cursor, starts, lengths)
        return starts, lengths

    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, dict]:
        check_nonempty(storage)
        num_slices, slice_len = self._shape(batch_size)
        starts, lengths = self._segments(storage)
        count = (lengths - slice_len + 1).clamp_min(0)
        cum = count.cumsum(0)
        total = int(cum[-1]) if cum.numel() else 0
        if total == 0:
            raise ValueError(
                f"No episode in the buffer has {slice_len} steps (the longest has "
                f"{int(lengths.max()) if lengths.numel() else 0}): cannot sample slices of "
                f"length {slice_len}."
            )
        r = torch.randint(total, (num_slices,))
        seg = torch.searchsorted(cum, r, right=True)
        offset = r - (cum[seg] - count[seg])
        first = starts[seg] + offset
        index = first.unsqueeze(-1) + torch.arange(slice_len)
        return index, {}
