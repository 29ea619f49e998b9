""":class:`MemmapStorage`: a tensor storage in memory-mapped raw files, crash-safe.

On-disk layout of ``scratch_dir``::

    tdrl_replay_meta.json     {"format": "tdrl-memmap-2", "max_size", "len", "cursor",
                               "is_tensor", "generation": g, "dirty", "order_start",
                               "leaves": [{"key", "dtype", "shape", "file"}, ...]}
    gen_<g>/leaf_<i>.bin      one raw array [max_size, *shape] per leaf

Every change of the on-disk state is one atomic ``os.replace`` of the metadata:

* an append writes rows beyond ``len`` first, then commits the new ``len`` and ``cursor``;
* an overwrite first commits the slots it is about to overwrite as ``dirty`` (they stop
  counting as items), writes them, then commits them clean;
* reopening after a crash that left dirty slots compacts the surviving items, oldest
  first, into a *new* generation folder, fsyncs it, commits metadata pointing at it, and
  only then deletes the old generation; :meth:`MemmapStorage.load_state_dict` swaps in a
  new generation the same way.

So a process killed at any point (``kill -9``) leaves metadata that points at complete
items only: every counted row was written whole by exactly one write. Rewrites of the
files (compaction, ``load_state_dict``) are always fsync'ed; per-write commits are
fsync'ed with ``sync=True`` (needed to survive a power cut, not a process death).

Opening reads only JSON written by tdrl and raw arrays whose dtype and shape that JSON
names (no pickle, no ``TensorDict.load_memmap``); anything else raises
:class:`~tdrl.core.replay._files.ReplayFormatError`.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile

import torch
from tensordict import TensorDictBase

from ._files import (ReplayFormatError, build_td, create_leaves, fsync_file,
                     leaf_specs, open_leaves, read_json, write_json)
from .storages import TensorStorage

__all__ = ["MemmapStorage", "LazyMemmapStorage", "META_FILE", "FORMAT"]

META_FILE = "tdrl_replay_meta.json"
FORMAT = "tdrl-memmap-2"
_GEN = re.compile(r"gen_(\d+)")


def _int(meta: dict, name: str, path: str, low: int, high: int | None = None) -> int:
    value = meta.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < low or (
            high is not None and value > high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ReplayFormatError(f"{path}: {name}={value!r}, expected an integer {bound}.")
    return value


class MemmapStorage(TensorStorage):
    """A :class:`~tdrl.core.replay.TensorStorage` in memory-mapped files, crash-safe.

    See the module docstring for the layout and the commit protocol: after a ``kill -9``
    at any point, reopening gives every committed item whole, none twice; an overwrite
    that was in flight loses only the slots it was overwriting.

    Args:
        max_size: number of slots.
        scratch_dir: directory of the files. If it already holds a storage (metadata file
            present) that storage is reopened (its ``max_size`` must match); if ``None`` a
            temporary directory is used.
        device: must be CPU (memory maps live in host memory).
        sync: fsync data and metadata at every write (survives power cuts; slower).

    Raises:
        ReplayFormatError: the directory holds metadata that tdrl did not write in this
            format, or that is inconsistent (e.g. ``len > max_size``, truncated files).
    """

    def __init__(self, max_size: int, scratch_dir: str | os.PathLike | None = None,
                 device: torch.device | str | None = "cpu", sync: bool = False) -> None:
        if device is not None and torch.device(device).type != "cpu":
            raise ValueError(f"MemmapStorage lives on the CPU; got device={device!r}.")
        super().__init__(max_size, device="cpu")
        if scratch_dir is None:
            scratch_dir = tempfile.mkdtemp(prefix="tdrl_memmap_")
        self.scratch_dir = os.fspath(scratch_dir)
        self.sync = bool(sync)
        self._generation = 0
        self._specs: list[dict] | None = None
        os.makedirs(self.scratch_dir, exist_ok=True)
        if os.path.exists(self._meta_path):
            self._reopen()
        self._remove_stale_generations()

    # ------------------------------------------------------------------ files
    @property
    def _meta_path(self) -> str:
        return os.path.join(self.scratch_dir, META_FILE)

    def _gen_dir(self, generation: int) -> str:
        return os.path.join(self.scratch_dir, f"gen_{generation}")

    def _remove_stale_generations(self) -> None:
        """Delete generation folders the metadata does not point at, and a half-written
        metadata file (both left by a crash)."""
        if os.path.exists(self._meta_path + ".tmp"):
            os.unlink(self._meta_path + ".tmp")
        current = self._generation if self._specs is not None else None
        for name in os.listdir(self.scratch_dir):
            m = _GEN.fullmatch(name)
            if m and int(m.group(1)) != current:
                shutil.rmtree(os.path.join(self.scratch_dir, name), ignore_errors=True)

    def _write_meta(self, dirty: list[int] | None = None, order_start: int | None = None,
                    sync: bool | None = None) -> None:
        meta = {"format": FORMAT, "max_size": self.max_size, "len": self._len,
                "cursor": self.cursor, "is_tensor": self._is_tensor,
                "generation": self._generation, "dirty": dirty, "order_start": order_start,
                "leaves": self._specs}
        write_json(self._meta_path, meta, sync=self.sync if sync is None else sync)

    def _sync_data(self) -> None:
        folder = self._gen_dir(self._generation)
        for spec in self._specs or ():
            fsync_file(os.path.join(folder, spec["file"]))

    def _allocate(self, template: TensorDictBase) -> TensorDictBase:
        self._specs = leaf_specs(template)
        self._generation += 1
        leaves = create_leaves(self._gen_dir(self._generation), self._specs, self.max_size)
        return build_td(leaves, self.max_size)

    def _use(self, leaves: dict) -> None:
        self._data = build_td(leaves, self.max_size)
        self._index_leaves()

    def _swap_generation(self, fill) -> None:
        """Write a new generation with ``fill(new_leaves) -> (len, cursor)``, fsync it,
        commit metadata pointing at it, then delete the old generation."""
        old = self._generation
        self._generation = new = old + 1
        folder = self._gen_dir(new)
        shutil.rmtree(folder, ignore_errors=True)
        leaves = create_leaves(folder, self._specs, self.max_size)
        self._len, self.cursor = fill(leaves)
        self._use(leaves)
        self._sync_data()
        self._write_meta(sync=True)
        shutil.rmtree(self._gen_dir(old), ignore_errors=True)

    # ------------------------------------------------------------------ writes
    def set(self, index, data) -> None:
        index, pairs = self._prepare_write(index, data, on_allocate=lambda: self._write_meta(sync=True))
        # Slots that already hold items are about to be overwritten: uncount them first.
        if isinstance(index, slice):
            slots = list(range(index.start, min(index.stop, self._len)))
            start = index.start
        else:
            slots = index[index < self._len].tolist()
            start = int(index[0]) if index.numel() else 0
        if slots:
            self._write_meta(dirty=slots, order_start=start)
        self._write(index, pairs)
        self._advance_len(index)
        if self.sync:
            self._sync_data()
        self._write_meta()

    def empty(self) -> None:
        super().empty()
        if self._data is not None:
            self._write_meta(sync=True)

    def load_state_dict(self, state: dict) -> None:
        data = state["data"]
        is_tensor = bool(state.get("is_tensor", False))
        if data is None or self._data is None:
            self._is_tensor = is_tensor
            if data is not None:
                super().load_state_dict(state)  # allocates a first generation
                self._sync_data()
            else:
                self._len, self.cursor = int(state["len"]), int(state["cursor"])
            if self._data is not None:
                self._write_meta(sync=True)
            return
        if isinstance(data, torch.Tensor):
            data = self._as_td(data)
        pairs = self._check_and_pair(data, data.shape[0])
        keys = list(self._leaves)

        def fill(leaves):
            for key, (_, src) in zip(keys, pairs, strict=True):
                leaves[key][: src.shape[0]].copy_(src)
            return int(state["len"]), int(state["cursor"])

        self._is_tensor = is_tensor
        self._swap_generation(fill)

    # ------------------------------------------------------------------ reopen
    def _reopen(self) -> None:
        path = self._meta_path
        meta = read_json(path, FORMAT)
        max_size = _int(meta, "max_size", path, 1)
        if max_size != self.max_size:
            raise ValueError(
                f"{self.scratch_dir} holds a storage of max_size {max_size}, "
                f"but max_size={self.max_size} was asked for."
            )
        length = _int(meta, "len", path, 0, self.max_size)
        cursor = _int(meta, "cursor", path, 0, self.max_size - 1)
        generation = _int(meta, "generation", path, 1)
        dirty = meta.get("dirty") or []
        if not isinstance(dirty, list) or not all(
                isinstance(s, int) and 0 <= s < self.max_size for s in dirty):
            raise ReplayFormatError(f"{path}: dirty={dirty!r}, expected slots in [0, max_size).")
        self._is_tensor = bool(meta.get("is_tensor", False))
        self._specs = meta.get("leaves")
        self._generation = generation
        leaves = open_leaves(self._gen_dir(generation), self._specs, self.max_size)
        self._use(leaves)
        self._len, self.cursor = length, cursor
        if dirty:
            self._compact(dirty, meta.get("order_start"))

    def _compact(self, dirty: list[int], order_start) -> None:
        """Drop the slots of the write a crash interrupted; keep the rest oldest first."""
        slots = torch.arange(self._len)
        if self._len == self.max_size and isinstance(order_start, int):
            slots = torch.roll(slots, -(order_start % self.max_size))  # ring: oldest first
        keep = slots[~torch.isin(slots, torch.as_tensor(dirty, dtype=torch.long))]
        old = dict(self._leaves)

        def fill(leaves):
            for key, leaf in leaves.items():
                leaf[: keep.numel()] = old[key].index_select(0, keep)
            k = keep.numel()
            return k, k % self.max_size

        self._swap_generation(fill)


LazyMemmapStorage = MemmapStorage
"""Alias (TorchRL's name): a :class:`MemmapStorage` allocates its files on the first write."""
