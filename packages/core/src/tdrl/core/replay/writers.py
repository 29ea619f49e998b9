"""Replay writers: which storage slots a new batch goes to.

- :class:`RoundRobinWriter` fills the storage in order, then overwrites the oldest items.
- :class:`MaxValueWriter` keeps the ``max_size`` items with the highest rank (e.g. the
  episode return), evicting the lowest-ranked ones; TorchRL calls it
  ``TensorDictMaxValueWriter`` (alias provided).

A writer's ``extend(storage, data)`` writes ``data`` (leading batch dim ``N``) and returns
the int64 slot index ``[N]`` of every item (``-1`` for an item that was not kept).
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase

from .storages import ListStorage, StatelessPart, Storage

__all__ = ["Writer", "RoundRobinWriter", "MaxValueWriter", "TensorDictMaxValueWriter"]


def _num_items(data) -> int:
    if isinstance(data, (torch.Tensor, TensorDictBase)):
        if len(data.shape) == 0:
            raise ValueError("extend() needs data with a leading batch dim; use add() for one item.")
        return data.shape[0]
    return len(data)


def _rows(data, index):
    if isinstance(data, (torch.Tensor, TensorDictBase)):
        return data[index]
    if isinstance(index, slice):
        return data[index]
    return [data[i] for i in index.tolist()]


class Writer(StatelessPart):
    """Base class of writers."""

    def extend(self, storage: Storage, data) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError


class RoundRobinWriter(Writer):
    """Writes to consecutive slots from ``storage.cursor``, wrapping around at ``max_size``.

    A batch larger than the storage keeps only its last ``max_size`` items (the earlier
    ones get index ``-1``).
    """

    def extend(self, storage: Storage, data) -> torch.Tensor:
        n = _num_items(data)
        cap = storage.max_size
        index = torch.full((n,), -1, dtype=torch.long)
        if n == 0:
            return index
        first = max(0, n - cap)  # items that would be overwritten within this very batch
        m = n - first
        start = storage.cursor
        slots = torch.arange(start, start + m) % cap
        index[first:] = slots
        # The cursor moves first so that a storage persisting its metadata on every write
        # (MemmapStorage) records the new one; it is restored if the write fails.
        storage.cursor = (start + m) % cap
        try:
            if start + m <= cap:
                storage.set(slice(start, start + m),
                            _rows(data, slice(first, n)) if first else data)
            elif isinstance(storage, ListStorage) and len(storage) < cap:
                # A list grows by appends: write the tail first, then the wrapped head.
                k = cap - start
                storage.set(slice(start, cap), _rows(data, slice(first, first + k)))
                storage.set(slice(0, m - k), _rows(data, slice(first + k, n)))
            else:
                storage.set(slots, _rows(data, slice(first, n)) if first else data)
        except BaseException:
            storage.cursor = start
            raise
        return index


class MaxValueWriter(Writer):
    """Keeps the ``max_size`` items with the highest rank.

    The rank of an item is ``data[rank_key]`` reduced over its non-batch dims. While the
    storage has free slots every item is written; once full, a new item replaces the
    lowest-ranked stored item if its rank is higher (all decided at once for a batch).

    Args:
        rank_key: key of the rank in the data (default ``("next", "reward")``).
        reduction: how a multi-element rank reduces to one number: ``"sum"``, ``"mean"``,
            ``"max"`` or ``"min"``.
    """

    def __init__(self, rank_key=("next", "reward"), reduction: str = "sum") -> None:
        if reduction not in ("sum", "mean", "max", "min"):
            raise ValueError(f"reduction must be sum/mean/max/min, got {reduction!r}.")
        self.rank_key = rank_key
        self.reduction = reduction
        self._ranks: torch.Tensor | None = None

    def _rank(self, data) -> torch.Tensor:
        if not isinstance(data, TensorDictBase):
            raise TypeError("MaxValueWriter ranks TensorDicts; got " + type(data).__name__)
        try:
            r = data.get(self.rank_key)
        except KeyError:
            r = None
        if r is None:
            raise KeyError(f"MaxValueWriter: rank key {self.rank_key!r} is missing from the data.")
        r = r.reshape(r.shape[0], -1).to("cpu", torch.float64)
        return getattr(r, self.reduction)(-1) if self.reduction in ("sum", "mean") else (
            r.amax(-1) if self.reduction == "max" else r.amin(-1))

    def _ensure_ranks(self, storage: Storage) -> torch.Tensor:
        if self._ranks is None or self._ranks.numel() != storage.max_size:
            self._ranks = torch.full((storage.max_size,), -torch.inf, dtype=torch.float64)
            if len(storage):  # a reopened storage: recompute the ranks of what it holds
                self._ranks[: len(storage)] = self._rank(storage.get(slice(0, len(storage))))
        return self._ranks

    def extend(self, storage: Storage, data) -> torch.Tensor:
        n = _num_items(data)
        ranks = self._ensure_ranks(storage)
        rank = self._rank(data)
        index = torch.full((n,), -1, dtype=torch.long)
        cap, filled = storage.max_size, len(storage)
        k = min(cap - filled, n)
        if k > 0:
            storage.set(slice(filled, filled + k), _rows(data, slice(0, k)))
            ranks[filled: filled + k] = rank[:k]
            index[:k] = torch.arange(filled, filled + k)
        if k == n:
            return index
        rest = rank[k:]
        keep = torch.topk(torch.cat([ranks, rest]), cap, sorted=False).indices
        incoming = keep[keep >= cap] - cap
        if incoming.numel() == 0:
            return index
        kept_old = torch.zeros(cap, dtype=torch.bool)
        kept_old[keep[keep < cap]] = True
        evicted = (~kept_old).nonzero().squeeze(-1)
        storage.set(evicted, _rows(data, incoming + k))
        ranks[evicted] = rest[incoming]
        index[incoming + k] = evicted
        return index

    def empty(self) -> None:
        self._ranks = None

    def state_dict(self) -> dict:
        return {"ranks": None if self._ranks is None else self._ranks.clone()}

    def load_state_dict(self, state: dict) -> None:
        self._ranks = state.get("ranks")


TensorDictMaxValueWriter = MaxValueWriter
