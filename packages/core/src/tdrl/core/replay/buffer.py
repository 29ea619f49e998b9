"""The replay buffer: a storage, a sampler and a writer, plus an optional transform on sample.

Example::

    from tdrl.core.replay import ReplayBuffer, TensorStorage, PrioritizedSampler

    rb = ReplayBuffer(TensorStorage(100_000), PrioritizedSampler(100_000, alpha=0.6, beta=0.4),
                      batch_size=256)
    rb.extend(batch.reshape(-1))          # a collector batch (*env_batch, T), flattened
    sample = rb.sample()                  # TensorDict [256] with "index" and "_weight"
    sample["td_error"] = td_error         # written by a loss
    rb.update_priority(sample)            # or rb.update_priority(sample["index"], td_error)
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Iterator
from typing import Any

import torch
from tensordict import TensorDictBase

from ..diskio import ChecksumError, sha256_file, verify_sha256
from ..keys import INDEX
from ..torchrl_names import accept_torchrl_names
from ._files import (ReplayFormatError, build_td, create_leaves, fsync_dir, fsync_file,
                     leaf_specs, load_state, open_leaves, read_json, save_state, write_json)
from .prioritized import PrioritizedSampler
from .samplers import RandomSampler, Sampler
from .storages import ListStorage, Storage, TensorStorage
from .writers import RoundRobinWriter, Writer

__all__ = ["ReplayBuffer", "TensorDictReplayBuffer", "PrioritizedReplayBuffer",
           "TensorDictPrioritizedReplayBuffer"]


def _default_collate(items: list) -> Any:
    if items and all(isinstance(x, TensorDictBase) for x in items):
        return torch.stack(items, 0)
    if items and all(isinstance(x, torch.Tensor) for x in items):
        return torch.stack(items, 0)
    return items


@accept_torchrl_names
class ReplayBuffer:
    """A replay buffer = storage + sampler + writer (+ transform applied on sample).

    Args:
        storage: where items live (default ``ListStorage(1000)``).
        sampler: how batches are drawn (default :class:`RandomSampler`).
        writer: where new items go (default :class:`RoundRobinWriter`).
        batch_size: default size of :meth:`sample`.
        transform: callable applied to every sampled batch (e.g. a tdrl transform or any
            ``td -> td`` function); a tdrl transform with an inverse also rewrites what
            :meth:`extend` stores (TorchRL's order: ``MultiStepTransform``).
        collate_fn: turns the list a :class:`ListStorage` returns into a batch (default:
            stack TensorDicts/tensors, else keep the list).
        priority_key: key :meth:`update_priority` reads from a TensorDict (TorchRL's
            default ``"td_error"``).
        pin_memory: sampled TensorDicts are put in pinned memory (TorchRL's keyword; only
            where CUDA is available, for fast non-blocking copies to the GPU).

    Sampled TensorDicts carry the storage slots under ``"index"`` (shape = batch shape) and
    the sampler's extra entries (``"_weight"`` for a prioritized sampler).
    """

    def __init__(self, storage: Storage | None = None, sampler: Sampler | None = None,
                 writer: Writer | None = None, batch_size: int | None = None,
                 transform: Callable | None = None, collate_fn: Callable | None = None,
                 priority_key: str | tuple = "td_error", pin_memory: bool = False) -> None:
        self.storage = storage if storage is not None else ListStorage(1000)
        self.sampler = sampler if sampler is not None else RandomSampler()
        self.writer = writer if writer is not None else RoundRobinWriter()
        self.batch_size = batch_size
        self.transform = transform
        self.collate_fn = collate_fn or _default_collate
        self.priority_key = priority_key
        self.pin_memory = bool(pin_memory)
        if len(self.storage):  # e.g. a reopened MemmapStorage: the sampler learns its items
            self.sampler.mark_update(torch.arange(len(self.storage)), self.storage)

    def __len__(self) -> int:
        return len(self.storage)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(storage={type(self.storage).__name__}"
                f"(max_size={self.storage.max_size}), sampler={type(self.sampler).__name__}, "
                f"writer={type(self.writer).__name__}, len={len(self)})")

    # ------------------------------------------------------------------ writes
    def add(self, item) -> int:
        """Store one item; returns its slot (``-1`` if the writer dropped it)."""
        if isinstance(item, (torch.Tensor, TensorDictBase)) and not isinstance(
            self.storage, ListStorage
        ):
            return int(self.extend(item.unsqueeze(0))[0])
        return int(self.extend([item])[0])

    def extend(self, data) -> torch.Tensor:
        """Store a batch of items.

        Args:
            data: a TensorDict / tensor whose leading dims are the items (a TensorDict
                with several batch dims, e.g. a rollout ``(n_envs, T)``, is flattened to
                ``n_envs * T`` items, each env's steps staying consecutive), or a list of
                arbitrary objects for a :class:`ListStorage`.

        Returns:
            int64 tensor ``[N]`` of the slots written (``-1`` for items not kept).
        """
        if isinstance(data, TensorDictBase) and getattr(self.transform, "has_inv", False):
            # TorchRL's order: the transform's inverse on write (e.g. MultiStepTransform, which
            # may hold the steps back until their successors arrive), its forward on sample
            data = self.transform.inv(data.copy())
            if data is None:
                return torch.empty(0, dtype=torch.long)
        if isinstance(data, TensorDictBase) and data.batch_dims > 1:
            data = data.reshape(-1)
        index = self.writer.extend(self.storage, data)
        self.sampler.mark_update(index, self.storage)
        return index

    # ------------------------------------------------------------------ reads
    def sample(self, batch_size: int | None = None, return_info: bool = False):
        """Draw a batch.

        Args:
            batch_size: number of items (default: the buffer's ``batch_size``).
            return_info: also return a dict with ``"index"`` and the sampler's extras.

        Returns:
            The batch (TensorDict of shape ``[batch_size]``, or ``[num_slices, slice_len]``
            for a slice sampler), or ``(batch, info)`` with ``return_info=True``.
        """
        if batch_size is None:
            batch_size = self.batch_size
        if batch_size is None:
            raise ValueError("sample() needs a batch_size (here or in the ReplayBuffer).")
        index, info = self.sampler.sample(self.storage, batch_size)
        data = self.storage.get(index)
        if isinstance(data, list):
            data = self.collate_fn(data)
        if isinstance(data, TensorDictBase):
            data.set(INDEX, index.to(data.device) if data.device is not None else index)
            for key, value in info.items():
                data.set(key, value.to(data.device) if data.device is not None else value)
        if self.transform is not None:
            data = self.transform(data)
        if self.pin_memory and isinstance(data, TensorDictBase) and torch.cuda.is_available():
            data = data.pin_memory()
        if return_info:
            return data, {INDEX: index, **info}
        return data

    def __getitem__(self, index):
        """The stored items at ``index`` (TorchRL's ``rb[:]``, ``rb[i]``, ``rb[tensor]``), with
        the buffer's transform applied; no sampler is involved.

        Args:
            index: an int, a slice or an int64 tensor / list of slots, counted over the
                ``len(self)`` items stored (negative values count from the end; storage
                order, which is insertion order until a ring storage wraps).

        Returns:
            One item for an int; a batch (TensorDict ``[n]`` or collated list) otherwise,
            a copy of the storage's entries.

        Raises:
            IndexError: a slot outside ``[-len(self), len(self))``.
        """
        n = len(self)
        if isinstance(index, int):
            if not -n <= index < n:
                raise IndexError(f"ReplayBuffer index {index} is out of range: {n} items stored.")
            data = self.storage.get(index % n)
        else:
            slots = torch.arange(n)[index] if isinstance(index, slice) else torch.as_tensor(index)
            if slots.is_floating_point() or slots.dtype == torch.bool:
                raise IndexError(f"ReplayBuffer index must be an int, a slice or int slots, got {slots.dtype}.")
            if slots.numel() and bool(((slots < -n) | (slots >= n)).any()):
                raise IndexError(f"ReplayBuffer slots {slots.tolist() if slots.numel() <= 8 else '...'} "
                                 f"out of range: {n} items stored.")
            data = self.storage.get(slots.long() % max(n, 1))
            if isinstance(data, list):
                data = self.collate_fn(data)
        if self.transform is not None:
            data = self.transform(data)
        return data

    def __iter__(self) -> Iterator:
        """Yield batches until a without-replacement sampler completes an epoch (forever
        for samplers with replacement)."""
        while True:
            yield self.sample()
            if self.sampler.ran_out:
                return

    def update_priority(self, index, priority=None) -> None:
        """Set new priorities (only a prioritized sampler uses them).

        Args:
            index: int64 tensor of slots (any shape), or a sampled TensorDict holding
                ``"index"`` and the priority under ``priority_key``.
            priority: tensor with one value per index (trailing singleton dims allowed),
                or a float for all of them.
        """
        index, priority = self._priority_args(index, priority)
        self.sampler.update_priority(index.reshape(-1), priority)

    def _priority_args(self, index, priority):
        """``(index, priority)`` of an :meth:`update_priority` call, checked."""
        if isinstance(index, TensorDictBase):
            td = index
            if priority is None:
                if self.priority_key not in td.keys(include_nested=True):
                    raise KeyError(
                        f"update_priority: the TensorDict has no {self.priority_key!r} entry "
                        "(set priority_key= on the buffer, or pass the priorities)."
                    )
                priority = td.get(self.priority_key)
            index = td.get(INDEX)
        if isinstance(priority, torch.Tensor) and priority.numel() > 1:
            if priority.numel() != index.numel():
                raise ValueError(
                    f"update_priority: {index.numel()} indices (shape {tuple(index.shape)}) but "
                    f"{priority.numel()} priorities (shape {tuple(priority.shape)})."
                )
            priority = priority.reshape(-1)
        return index, priority

    # ------------------------------------------------------------------ state
    def empty(self) -> None:
        """Remove every item and reset the sampler and writer."""
        self.storage.empty()
        self.sampler.empty()
        self.writer.empty()

    def state_dict(self) -> dict:
        return {"storage": self.storage.state_dict(), "sampler": self.sampler.state_dict(),
                "writer": self.writer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.storage.load_state_dict(state["storage"])
        self.sampler.load_state_dict(state["sampler"])
        self.writer.load_state_dict(state["writer"])

    def dumps(self, path: str | os.PathLike, *, checksum: bool = False) -> None:
        """Save the buffer's content and state to the directory ``path``, atomically.

        Layout: ``path/dump_<n>/state.pt`` (cursor, priorities, writer state, list items;
        loads with ``torch.load(weights_only=True)``), ``path/dump_<n>/storage/`` (tensor
        data as raw arrays described by ``leaves.json``) and the pointer
        ``path/CURRENT.json`` naming the complete dump. A new dump is written beside the
        previous one, fsync'ed, then the pointer is replaced atomically (``os.replace``) and
        only then are older dumps deleted: a process killed at any point leaves ``path``
        loading either the previous state or the new one, complete.

        Args:
            path: the dump directory.
            checksum: also write ``dump_<n>/checksums.json``, the SHA-256 of ``state.pt`` and
                of every leaf file; :meth:`loads` then verifies them before reading
                (:class:`~tdrl.core.diskio.ChecksumError` naming the file on a mismatch).
                Off by default: it reads every byte written once more.
        """
        path = os.fspath(path)
        os.makedirs(path, exist_ok=True)
        state = self.state_dict()
        _remove_stale_dumps(path)  # left by a dump killed mid-way: at most current + new exist
        existing = [int(m.group(1)) for n in os.listdir(path) if (m := _DUMP.fullmatch(n))]
        name = f"dump_{max(existing, default=0) + 1}"
        folder = os.path.join(path, name)
        os.makedirs(folder)
        try:
            data = state["storage"].get("data")
            if isinstance(data, TensorDictBase):
                _write_leaves(os.path.join(folder, "storage"), data)
                state["storage"] = {**state["storage"], "data": _FILES}
            save_state(os.path.join(folder, "state.pt"), state)
            if checksum:
                write_json(os.path.join(folder, _SUMS),
                           {"format": _SUMS_FORMAT,
                            "sha256": {f: sha256_file(os.path.join(folder, f))
                                       for f in _dump_files(folder)}})
        except OSError:  # e.g. a full disk (named by tdrl.core.diskio): the previous dump stays current
            shutil.rmtree(folder, ignore_errors=True)
            raise
        fsync_dir(folder)
        fsync_dir(path)
        write_json(os.path.join(path, _POINTER), {"format": _DUMP_FORMAT, "dump": name})
        for n in os.listdir(path):
            if _DUMP.fullmatch(n) and n != name:
                shutil.rmtree(os.path.join(path, n), ignore_errors=True)

    def loads(self, path: str | os.PathLike) -> None:
        """Load what :meth:`dumps` saved in ``path`` into this buffer (same component types).

        Only data is read: the JSON pointer and leaf descriptions tdrl wrote, raw arrays of
        the dtypes and shapes they name, and ``state.pt`` with ``weights_only=True``.

        Raises:
            ReplayFormatError: ``path`` holds something else (e.g. a pickle, or a dump of
                an older tdrl whose loading needed pickle).
            ChecksumError: the dump was written with ``checksum=True`` and a file's bytes
                differ from its recorded SHA-256 (the file is named).
            FileNotFoundError: ``path`` holds no dump.
        """
        path = os.fspath(path)
        pointer = os.path.join(path, _POINTER)
        if not os.path.exists(pointer):
            if os.path.exists(os.path.join(path, "state.pt")):
                raise ReplayFormatError(
                    f"{path} holds a replay dump of an older tdrl (state.pt without "
                    f"{_POINTER}), which loads only through pickle; it is not loaded. "
                    "Dump the buffer again with this version."
                )
            raise FileNotFoundError(f"No replay dump in {path} ({_POINTER} is missing).")
        name = read_json(pointer, _DUMP_FORMAT).get("dump")
        if not isinstance(name, str) or not _DUMP.fullmatch(name):
            raise ReplayFormatError(f"{pointer}: dump={name!r}, expected 'dump_<n>'.")
        folder = os.path.join(path, name)
        _verify_dump(folder)
        state = load_state(os.path.join(folder, "state.pt"))
        storage = state.get("storage") if isinstance(state, dict) else None
        if not isinstance(storage, dict):
            raise ReplayFormatError(f"{folder}/state.pt does not hold a replay buffer state.")
        if storage.get("data") == _FILES:
            storage["data"] = _read_leaves(os.path.join(folder, "storage"))
        self.load_state_dict(state)


_DUMP = re.compile(r"dump_(\d+)")
_POINTER = "CURRENT.json"


_SUMS = "checksums.json"
_SUMS_FORMAT = "tdrl-checksums-1"


def _dump_files(folder: str) -> list[str]:
    """``state.pt`` and the leaf files of a dump folder, relative to it."""
    storage = os.path.join(folder, "storage")
    leaves = sorted(f"storage/{n}" for n in (os.listdir(storage) if os.path.isdir(storage) else ())
                    if n.startswith("leaf_"))
    return ["state.pt", *leaves]


def _verify_dump(folder: str) -> bool:
    """Check a dump's files against ``checksums.json`` (``False``: the dump has none)."""
    path = os.path.join(folder, _SUMS)
    if not os.path.exists(path):
        return False
    sums = read_json(path, _SUMS_FORMAT).get("sha256")
    files = _dump_files(folder)
    if not isinstance(sums, dict) or sorted(sums) != sorted(files) or not all(
            isinstance(v, str) for v in sums.values()):
        listed = sorted(sums) if isinstance(sums, dict) else sums
        raise ChecksumError(f"{path} lists {listed!r} but the dump holds {files}: the folder "
                            "was changed after it was written.")
    for name in files:
        verify_sha256(os.path.join(folder, name), sums[name], path,
                      "Load an earlier dump, or delete checksums.json to load it anyway.")
    return True


def _remove_stale_dumps(path: str) -> None:
    """Delete the ``dump_<n>`` folders ``CURRENT.json`` does not name (incomplete dumps, or
    older ones whose deletion a kill interrupted); with no readable pointer none is loadable."""
    current = None
    pointer = os.path.join(path, _POINTER)
    if os.path.exists(pointer):
        try:
            current = read_json(pointer, _DUMP_FORMAT).get("dump")
        except ReplayFormatError:
            return  # not ours to clean: loads() will say what is wrong
    for n in os.listdir(path):
        if _DUMP.fullmatch(n) and n != current:
            shutil.rmtree(os.path.join(path, n), ignore_errors=True)
_DUMP_FORMAT = "tdrl-replay-dump-1"
_LEAVES_FORMAT = "tdrl-leaves-1"
_FILES = "files"


def _write_leaves(folder: str, data: TensorDictBase) -> None:
    specs = leaf_specs(data)
    rows = data.shape[0]
    leaves = create_leaves(folder, specs, rows)
    for (key, leaf), spec in zip(leaves.items(), specs, strict=True):
        leaf.copy_(data.get(key if len(key) > 1 else key[0]))
        fsync_file(os.path.join(folder, spec["file"]))
    write_json(os.path.join(folder, "leaves.json"),
               {"format": _LEAVES_FORMAT, "rows": rows, "leaves": specs})


def _read_leaves(folder: str) -> TensorDictBase:
    path = os.path.join(folder, "leaves.json")
    meta = read_json(path, _LEAVES_FORMAT)
    rows = meta.get("rows")
    if not isinstance(rows, int) or isinstance(rows, bool) or rows < 0:
        raise ReplayFormatError(f"{path}: rows={rows!r}, expected an integer >= 0.")
    leaves = open_leaves(folder, meta.get("leaves"), rows, shared=False)
    return build_td({k: v.clone() for k, v in leaves.items()}, rows)


TensorDictReplayBuffer = ReplayBuffer
"""Alias: :class:`ReplayBuffer` already handles TensorDicts (TorchRL's name)."""


class PrioritizedReplayBuffer(ReplayBuffer):
    """A :class:`ReplayBuffer` with a :class:`PrioritizedSampler` over its storage.

    Args:
        alpha: priority exponent. beta: importance-weight exponent. eps: priority offset.
        storage: default ``TensorStorage(1_000_000)``; other arguments as in
            :class:`ReplayBuffer`.
    """

    def __init__(self, alpha: float, beta: float, storage: Storage | None = None,
                 eps: float = 1e-8, **kwargs) -> None:
        storage = storage if storage is not None else TensorStorage(1_000_000)
        sampler = PrioritizedSampler(storage.max_size, alpha=alpha, beta=beta, eps=eps)
        super().__init__(storage=storage, sampler=sampler, **kwargs)


TensorDictPrioritizedReplayBuffer = PrioritizedReplayBuffer
