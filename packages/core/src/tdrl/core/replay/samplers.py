"""Replay samplers: which stored items a batch is drawn from.

A sampler's ``sample(storage, batch_size)`` returns ``(index, info)``: an int64 tensor of
storage slots (shape ``[batch_size]``, or ``[num_slices, slice_len]`` for slice samplers)
and a dict of extra per-item tensors (e.g. the importance weights ``"_weight"``).
The buffer calls ``mark_update(index)`` after every write so samplers with per-item
state (priorities, episode boundaries) stay in sync.
"""

from __future__ import annotations

import torch

from .storages import StatelessPart, Storage

__all__ = ["Sampler", "RandomSampler", "SamplerWithoutReplacement"]


class Sampler(StatelessPart):
    """Base class of samplers."""

    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, dict]:
        raise NotImplementedError  # pragma: no cover

    def mark_update(self, index: torch.Tensor, storage: Storage) -> None:
        """Called by the buffer after items were written to the slots ``index`` ``[N]``."""
        return None

    def update_priority(self, index: torch.Tensor, priority: torch.Tensor) -> None:
        """Only prioritized samplers have priorities; the others ignore updates."""
        return None

    @property
    def ran_out(self) -> bool:
        """True when an epoch of a without-replacement sampler has just been exhausted."""
        return False


def check_nonempty(storage: Storage) -> int:
    n = len(storage)
    if n == 0:
        raise RuntimeError("Cannot sample from an empty replay buffer: extend it first.")
    return n


class RandomSampler(Sampler):
    """Uniform sampling with replacement over the stored items."""

    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, dict]:
        n = check_nonempty(storage)
        return torch.randint(n, (batch_size,)), {}


class SamplerWithoutReplacement(Sampler):
    """Epochs over the stored items: every item is drawn once before any is drawn again.

    A permutation of ``range(len(storage))`` is drawn at the start of each epoch (or the
    items are taken in order with ``shuffle=False``). When fewer than ``batch_size`` items
    remain in the epoch, ``drop_last=True`` starts a new epoch; otherwise the short last
    batch is returned. :attr:`ran_out` is True right after the last batch of an epoch.

    Args:
        drop_last: drop the incomplete last batch of an epoch.
        shuffle: draw a random permutation per epoch (else storage order).

    Raises:
        ValueError: at sampling, if ``batch_size`` exceeds the number of stored items.
    """

    def __init__(self, drop_last: bool = False, shuffle: bool = True) -> None:
        self.drop_last = drop_last
        self.shuffle = shuffle
        self._perm: torch.Tensor | None = None
        self._pos = 0
        self._ran_out = False

    def _new_epoch(self, n: int) -> None:
        self._perm = torch.randperm(n) if self.shuffle else torch.arange(n)
        self._pos = 0

    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, dict]:
        n = check_nonempty(storage)
        if batch_size > n:
            raise ValueError(
                f"Cannot sample {batch_size} items without replacement from a buffer holding "
                f"{n}: lower the batch size or use a sampler with replacement."
            )
        # A new epoch starts when the last one ran out or the buffer grew/shrank.
        if self._perm is None or self._perm.numel() != n or self._pos >= n or (
            self.drop_last and n - self._pos < batch_size
        ):
            self._new_epoch(n)
        index = self._perm[self._pos: self._pos + batch_size]
        self._pos += index.numel()
        remaining = n - self._pos
        self._ran_out = remaining == 0 or (self.drop_last and remaining < batch_size)
        return index, {}

    @property
    def ran_out(self) -> bool:
        return self._ran_out

    def empty(self) -> None:
        self._perm, self._pos, self._ran_out = None, 0, False

    def state_dict(self) -> dict:
        return {"perm": self._perm, "pos": self._pos, "ran_out": self._ran_out}

    def load_state_dict(self, state: dict) -> None:
        self._perm, self._pos, self._ran_out = state["perm"], int(state["pos"]), bool(state["ran_out"])
