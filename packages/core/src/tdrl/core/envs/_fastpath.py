"""Hot-path helpers of the env wrappers: row slabs, partial-reset merges and a paused GC.

Per env step, every torch / tensordict call costs a few microseconds, and the first one
after the simulator ran costs more (its code is no longer in the CPU caches). The
Gymnasium wrapper therefore writes each step's outputs into *row slabs*: a preallocated
tensor of ``rows`` steps, with its numpy view for the writes and one precomputed torch view
per row (made in one ``unbind`` call when the slab is allocated). A step costs one numpy
assignment per output and no torch call; every step gets its own row, so a returned
tensor never changes when a later step runs (a slab is never reused: when its rows are
used up, a fresh one is allocated and the old one lives on as long as some row is
referenced).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch

from ..keys import OBSERVATION

__all__ = ["RowSlab", "merge_reset_rows", "paused_gc"]

# A slab holds at most this many bytes (large observations get few rows per slab, so a
# kept step does not pin much memory) and at most _MAX_ROWS rows.
_SLAB_BYTES = 1 << 16
_MAX_ROWS = 256


class RowSlab:
    """Distinct rows of preallocated CPU tensors, handed out one step at a time.

    Args:
        shapes: one row shape per output (e.g. ``{"observation": (17,), "reward": (1,)}``).
        dtypes: torch dtype per output (same keys as ``shapes``).
        rows: rows per slab; ``None`` picks ``min(256, 64 KiB / bytes per row)`` (>= 1).

    Use ``i = slab.take()``, then write ``slab.np[key][i] = value`` and hand out
    ``slab.views[key][i]`` (a tensor of shape ``shapes[key]``). An output of one element per
    row (a single env's reward) is also in ``slab.scalars[key]``, a ``(rows,)`` numpy view:
    ``slab.scalars[key][i] = x`` is an item write, several times cheaper than a row write.
    """

    def __init__(self, shapes: dict, dtypes: dict, rows: int | None = None) -> None:
        self.shapes = {k: tuple(s) for k, s in shapes.items()}
        self.dtypes = dict(dtypes)
        if rows is None:
            row_bytes = sum(
                int(np.prod(s, dtype=np.int64)) * torch.empty((), dtype=self.dtypes[k]).element_size()
                for k, s in self.shapes.items()
            )
            rows = max(1, min(_MAX_ROWS, _SLAB_BYTES // max(1, row_bytes)))
        self.rows = int(rows)
        self.np: dict[str, np.ndarray] = {}
        self.views: dict[str, tuple] = {}
        self.scalars: dict[str, np.ndarray] = {}
        self._next = self.rows  # allocate on the first take()

    def _refill(self) -> None:
        for key, shape in self.shapes.items():
            buf = torch.zeros((self.rows, *shape), dtype=self.dtypes[key])
            self.np[key] = buf.numpy()
            self.views[key] = buf.unbind(0)
            if buf[0].numel() == 1:
                self.scalars[key] = self.np[key].reshape(self.rows)
        self._next = 0

    def take(self) -> int:
        """The index of a fresh row (allocates a new slab when this one is used up)."""
        i = self._next
        if i == self.rows:
            self._refill()
            i = 0
        self._next = i + 1
        return i


@contextmanager
def paused_gc() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for a rollout (its state is restored on exit).

    A rollout keeps every step's TensorDicts alive until it stacks them: thousands of
    container objects that survive the young generations and, every few batches, trigger
    a full collection that walks the whole heap (torch, gymnasium and MuJoCo hold ~300k
    objects: hundreds of milliseconds, measured at 50-80 us per collected frame). Step
    data has no reference cycles, so reference counting frees it anyway; collection
    resumes as soon as the rollout ends.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def merge_reset_rows(src: dict, keep: np.ndarray, observation: torch.Tensor, false: torch.Tensor,
                     reset_key: str, flags: tuple[str, ...]) -> dict:
    """A partial reset's output, built from the caller's root entries, as
    :meth:`EnvBase.reset <tdrl.core.envs.EnvBase.reset>` builds it with a mask (same values).

    Args:
        src: the root's entries (a plain TensorDict's dict; CPU tensors, no nesting).
        keep: ``[N, 1]`` bool numpy, True for the sub-envs that did not reset.
        observation: ``[N, ...]`` the observation after the reset (reset rows fresh, others kept).
        false: ``[N, 1]`` bool zeros (shared, read-only): a flag the root lacks.
        reset_key: the mask's key (dropped); flags: the done keys (cleared where reset).

    Returns:
        ``{key: tensor}``: every entry of ``src`` but the mask, the new observation, and each
        flag ``flag & keep``.
    """
    out = {k: v for k, v in src.items() if k != reset_key}
    out[OBSERVATION] = observation
    for key in flags:
        flag = out.get(key)
        out[key] = (false if flag is None or flag.shape != false.shape
                    else torch.from_numpy(flag.numpy() & keep))
    return out

