"""Replay storages: where the items live.

- :class:`ListStorage` keeps any Python objects in a list.
- :class:`TensorStorage` keeps a TensorDict (or a tensor) of ``max_size`` rows, allocated
  lazily on the first write from the first batch's keys, shapes and dtypes, on any device.
- :class:`~tdrl.core.replay.memmap.MemmapStorage` (in ``memmap.py``) is a
  :class:`TensorStorage` whose leaves are memory-mapped raw files, crash-safe.

Storages index items by their slot in ``[0, max_size)``; the writer decides which slots
a batch goes to and keeps its cursor in :attr:`Storage.cursor` (so it persists with the
storage). ``len(storage)`` counts the filled slots, which are always ``0 .. len-1``.
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDictBase

from tdrl.core.td_access import new_td

__all__ = ["StatelessPart", "Storage", "ListStorage", "TensorStorage", "LazyTensorStorage"]

_TENSOR_KEY = "_data"  # key under which a storage of plain tensors keeps them


class StatelessPart:
    """Base of the buffer's samplers and writers: no state unless a subclass keeps some
    (``empty``, ``state_dict`` and ``load_state_dict`` are no-ops; the buffer calls them on
    every part)."""

    def empty(self) -> None:
        return None

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        return None


def _key_str(key) -> str:
    return repr(key if isinstance(key, str) or len(key) > 1 else key[0])


def _keys_str(keys) -> str:
    return ", ".join(sorted(map(_key_str, keys)))


class StorageKeyError(KeyError):
    """A KeyError whose message prints as written (no extra quoting)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class Storage:
    """Base class of storages.

    Args:
        max_size: number of slots.
    """

    def __init__(self, max_size: int) -> None:
        if int(max_size) < 1:
            raise ValueError(f"A storage needs max_size >= 1, got {max_size}.")
        self.max_size = int(max_size)
        self.cursor = 0  # next slot of a round-robin writer
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def set(self, index, data) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def get(self, index):  # pragma: no cover - abstract
        raise NotImplementedError

    def _advance_len(self, index) -> None:
        if isinstance(index, slice):
            top = index.stop
        elif isinstance(index, int):
            top = index + 1
        else:
            top = int(index.max()) + 1 if index.numel() else 0
        if top > self._len:
            self._len = top

    def empty(self) -> None:
        """Forget every item (slots stay allocated)."""
        self._len = 0
        self.cursor = 0

    def state_dict(self) -> dict:
        return {"len": self._len, "cursor": self.cursor}

    def load_state_dict(self, state: dict) -> None:
        self._len = int(state["len"])
        self.cursor = int(state["cursor"])


class ListStorage(Storage):
    """Storage of arbitrary Python objects in a list.

    ``extend`` with a TensorDict or a tensor stores its rows (dim 0) as separate items;
    ``get`` returns a list of items, which the buffer stacks when they are tensors or
    TensorDicts.
    """

    def __init__(self, max_size: int) -> None:
        super().__init__(max_size)
        self._items: list[Any] = []

    def set(self, index, data) -> None:
        if isinstance(index, int):
            index, data = [index], [data]
        elif isinstance(index, slice):
            index = range(index.start, index.stop)
        else:
            index = index.tolist()
        if isinstance(data, (torch.Tensor, TensorDictBase)):
            data = data.unbind(0)
        if len(data) != len(index):
            raise ValueError(f"ListStorage.set: {len(index)} slots for {len(data)} items.")
        for i, item in zip(index, data):
            if i < len(self._items):
                self._items[i] = item
            elif i == len(self._items):
                self._items.append(item)
            else:
                raise IndexError(f"ListStorage: slot {i} written before slot {len(self._items)}.")
        self._len = len(self._items)

    def get(self, index) -> list:
        if isinstance(index, int):
            return self._items[index]
        if isinstance(index, slice):
            return self._items[index]
        return [self._items[i] for i in index.reshape(-1).tolist()]

    def empty(self) -> None:
        super().empty()
        self._items = []

    def state_dict(self) -> dict:
        return {**super().state_dict(), "items": list(self._items)}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self._items = list(state["items"])


class TensorStorage(Storage):
    """Contiguous storage of ``max_size`` rows of a TensorDict (or of a tensor).

    Nothing is allocated until the first write; then every leaf gets a buffer of shape
    ``[max_size, *leaf.shape[1:]]`` with the leaf's dtype, on ``device``. Later writes must
    have exactly the same keys and per-item shapes; a mismatch raises an error naming the key.

    Args:
        max_size: number of slots (items).
        device: where the data lives (default: the device of the first batch written).
    """

    def __init__(self, max_size: int, device: torch.device | str | None = None) -> None:
        super().__init__(max_size)
        self.device = torch.device(device) if device is not None else None
        self._data: TensorDictBase | None = None
        self._leaves: dict[Any, torch.Tensor] = {}
        self._tree: dict = {}
        self._is_tensor = False

    # ------------------------------------------------------------------ allocation
    @property
    def initialized(self) -> bool:
        return self._data is not None

    def _allocate(self, template: TensorDictBase) -> TensorDictBase:
        """Create the storage TensorDict ``[max_size, *item_shape]`` like ``template[0]``."""
        device = self.device if self.device is not None else template.device
        out = template[0].to(device) if device is not None else template[0]
        return out.expand(self.max_size).clone().zero_()

    def _init_from(self, data: TensorDictBase) -> None:
        self._data = self._allocate(data)
        if self.device is None:
            self.device = self._data.device or torch.device("cpu")
        self._index_leaves()

    def _index_leaves(self) -> None:
        self._leaves = {}
        self._tree = {}
        for key, leaf in self._data.items(include_nested=True, leaves_only=True):
            key = (key,) if isinstance(key, str) else key
            self._leaves[key] = leaf
            node = self._tree
            for part in key[:-1]:
                node = node.setdefault(part, {})
            node[key[-1]] = leaf

    # ------------------------------------------------------------------ writes
    def _as_td(self, data) -> TensorDictBase:
        if isinstance(data, torch.Tensor):
            if self._data is not None and not self._is_tensor:
                raise TypeError("This storage holds TensorDicts; got a plain tensor.")
            self._is_tensor = True
            return new_td({_TENSOR_KEY: data}, data.shape[:1])
        if not isinstance(data, TensorDictBase):
            raise TypeError(
                f"TensorStorage stores TensorDicts or tensors, got {type(data).__name__}; "
                "use ListStorage for other Python objects."
            )
        if self._is_tensor:
            raise TypeError("This storage holds plain tensors; got a TensorDict.")
        return data

    def _check_and_pair(self, data: TensorDictBase, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        if data.batch_dims < 1 or data.batch_size[0] != n:
            raise ValueError(
                f"Expected a batch of {n} items (batch_size[0] == {n}), "
                f"got batch_size {tuple(data.batch_size)}."
            )
        src = {((k,) if isinstance(k, str) else k): v
               for k, v in data.items(include_nested=True, leaves_only=True)}
        pairs = []
        for key, dest in self._leaves.items():
            leaf = src.pop(key, None)
            if leaf is None:
                raise StorageKeyError(
                    f"Key {_key_str(key)} is missing from the data: the storage holds keys "
                    f"{_keys_str(self._leaves)}."
                )
            if leaf.shape[1:] != dest.shape[1:]:
                raise ValueError(
                    f"Shape mismatch for key {_key_str(key)}: the storage holds items of shape "
                    f"{tuple(dest.shape[1:])}, got items of shape {tuple(leaf.shape[1:])} "
                    f"(batch of {n})."
                )
            pairs.append((dest, leaf))
        if src:
            raise StorageKeyError(
                f"Unexpected key(s) {_keys_str(src)} in the data: the storage holds "
                f"keys {_keys_str(self._leaves)}."
            )
        return pairs

    def set(self, index, data) -> None:
        """Write a batch into the slots ``index``.

        Args:
            index: a ``slice`` of slots, an int, or an int64 tensor ``[N]``.
            data: TensorDict (or tensor) with leading batch dim ``N``.
        """
        index, pairs = self._prepare_write(index, data)
        self._write(index, pairs)
        self._advance_len(index)

    def _prepare_write(self, index, data, on_allocate=None):
        """``(index, pairs)`` of a write: an int index as a one-slot slice, the storage
        allocated from the first data (then ``on_allocate()``), and the ``(destination, leaf)``
        pairs of ``data``'s leaves, checked against the storage's keys and ``N``."""
        data = self._as_td(data)
        if isinstance(index, int):
            index = slice(index, index + 1)
            data = data.unsqueeze(0)
        if self._data is None:
            self._init_from(data)
            if on_allocate is not None:
                on_allocate()
        n = index.stop - index.start if isinstance(index, slice) else index.numel()
        return index, self._check_and_pair(data, n)

    def _write(self, index, pairs) -> None:
        if isinstance(index, slice):
            for dest, leaf in pairs:
                dest[index].copy_(leaf, non_blocking=True)
        else:
            index = index.to(self.device)
            for dest, leaf in pairs:
                dest.index_copy_(0, index, leaf.to(dest.device, non_blocking=True))

    # ------------------------------------------------------------------ reads
    def get(self, index):
        """Read the items at ``index`` (slice, int or int64 tensor of any shape ``S``).

        Returns:
            TensorDict (or tensor) of batch shape ``S`` (``[n]`` for a slice). A slice
            returns views into the storage, a tensor index returns copies.
        """
        if self._data is None:
            raise RuntimeError("The storage is empty: nothing has been written yet.")
        if isinstance(index, int):
            out = self._data[index]
            return out[_TENSOR_KEY] if self._is_tensor else out
        if isinstance(index, slice):
            shape = torch.Size([len(range(*index.indices(self.max_size)))])

            def take(t):
                return t[index]
        else:
            shape = index.shape
            flat = index.reshape(-1).to(self.device)

            def take(t):
                return t.index_select(0, flat).reshape(*shape, *t.shape[1:])

        if self._is_tensor:
            return take(self._leaves[(_TENSOR_KEY,)])
        return _build(self._tree, take, shape, self.device)

    # ------------------------------------------------------------------ state
    def empty(self) -> None:
        super().empty()

    def state_dict(self) -> dict:
        state = super().state_dict()
        state["is_tensor"] = self._is_tensor
        state["data"] = None if self._data is None else self._data[: self._len].clone()
        return state

    def load_state_dict(self, state: dict) -> None:
        self._is_tensor = bool(state.get("is_tensor", False))
        data = state["data"]
        if data is not None:
            if self._data is None:
                self._init_from(data)
            self._data[: data.shape[0]].update_(data)
        super().load_state_dict(state)


def _build(tree: dict, take, shape: torch.Size, device) -> TensorDictBase:
    source = {}
    for name, node in tree.items():
        source[name] = _build(node, take, shape, device) if isinstance(node, dict) else take(node)
    return new_td(source, shape, device)


LazyTensorStorage = TensorStorage
"""Alias: every :class:`TensorStorage` is lazy (allocated on the first write), as in TorchRL."""
