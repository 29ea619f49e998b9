"""The public collector contract: what every collector yielding batches shares.

A collector sets ``frames`` (collected so far), ``total_frames`` (``-1``: never stops),
``frames_per_batch`` and ``split_trajs``, and implements :meth:`BatchCollector.next_batch`
and :meth:`BatchCollector.shutdown`; iteration, ``len`` and ``with`` come from here.
"""

from __future__ import annotations

from collections.abc import Iterator

from tensordict import TensorDictBase

from .utils import split_trajectories

__all__ = ["BatchCollector"]


class BatchCollector:
    """Iterate batches until ``total_frames``, one ``next_batch()`` each (split into
    trajectories with ``split_trajs``); ``len`` is the number of batches; ``with`` shuts down."""

    frames: int
    total_frames: int
    frames_per_batch: int
    split_trajs: bool

    def next_batch(self) -> TensorDictBase:  # pragma: no cover - abstract
        """One batch of ``frames_per_batch`` steps (advances ``frames``)."""
        raise NotImplementedError

    def shutdown(self) -> None:  # pragma: no cover - abstract
        """Release the envs and workers (idempotent)."""
        raise NotImplementedError

    def __iter__(self) -> Iterator[TensorDictBase]:
        while self.total_frames < 0 or self.frames < self.total_frames:
            batch = self.next_batch()
            yield split_trajectories(batch) if self.split_trajs else batch

    def __len__(self) -> int:
        if self.total_frames < 0:
            raise TypeError("A collector with total_frames=-1 has no length.")
        return self.total_frames // self.frames_per_batch

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
