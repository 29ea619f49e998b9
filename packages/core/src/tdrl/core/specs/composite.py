"""The nested :class:`Composite` spec, which describes a whole TensorDict."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import torch
from tensordict import TensorDict, TensorDictBase

from ._base import DEVICE_TYPING, TensorSpec, as_device, expand_shape_args, as_shape

__all__ = ["Composite", "spec_writes"]

NestedKey = str | tuple[str, ...]


def _unravel(key: NestedKey) -> tuple[str, ...]:
    if isinstance(key, str):
        return (key,)
    out: list[str] = []
    for k in key:
        out.extend(_unravel(k))
    return tuple(out)


def _key_out(key: tuple[str, ...]) -> NestedKey:
    return key[0] if len(key) == 1 else key

# Writes into any composite's entries (keys() caches are valid while this is unchanged).
_MUTATIONS = [0]


def spec_writes() -> int:
    """How many writes any :class:`Composite` has had (set, delete, update) in this process: a
    value read from specs stays valid while this is unchanged (an env's per-step plan caches
    its reward keys on it)."""
    return _MUTATIONS[0]


class Composite:
    """A nested mapping of keys to specs, describing a TensorDict of batch size ``shape``.

    Every entry's shape starts with ``shape``. Nested keys (tuples) get and set through
    sub-composites, which are created on the fly.

    Args:
        mapping: ``{key: spec or nested dict}``; keyword arguments are added to it.
        shape: batch size of the TensorDicts it describes (alias ``batch_size``). Default ``()``.
        device: device of the TensorDicts it describes (``None``: leave leaves as they are).

    Example:
        >>> spec = Composite(observation=Unbounded((4, 3)), shape=(4,))
        >>> spec["next", "reward"] = Unbounded((4, 1))
        >>> spec.rand().batch_size
        torch.Size([4])
    """

    def __init__(
        self,
        mapping: Mapping | None = None,
        *,
        shape: int | Sequence[int] | torch.Size | None = None,
        batch_size: int | Sequence[int] | torch.Size | None = None,
        device: DEVICE_TYPING = None,
        **kwargs: TensorSpec | Composite,
    ) -> None:
        if shape is None:
            shape = batch_size
        self.shape = as_shape(shape)
        self.device = as_device(device)
        self._specs: dict[str, TensorSpec | Composite] = {}
        entries = dict(mapping or {})
        entries.update(kwargs)
        for k, v in entries.items():
            self[k] = v

    # ------------------------------------------------------------------ basic props
    @property
    def batch_size(self) -> torch.Size:
        return self.shape

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def ndimension(self) -> int:
        return self.ndim

    @property
    def dtype(self) -> None:
        return None

    # ------------------------------------------------------------------ mapping access
    def __getitem__(self, key: NestedKey) -> TensorSpec | Composite:
        path = _unravel(key)
        node = self
        for i, k in enumerate(path):
            if not isinstance(node, Composite):
                raise KeyError(f"{_key_out(path[:i])!r} is a leaf spec; cannot index it with {k!r}.")
            try:
                node = node._specs[k]
            except KeyError:
                raise KeyError(
                    f"Key {_key_out(path[: i + 1])!r} not in the spec; available keys: "
                    f"{list(node._specs)}."
                ) from None
        return node

    def get(self, key: NestedKey, default=None):
        try:
            return self[key]
        except KeyError:
            return default

    def __setitem__(self, key: NestedKey, spec: TensorSpec | Composite | Mapping) -> None:
        path = _unravel(key)
        node = self
        for k in path[:-1]:
            child = node._specs.get(k)
            if child is None:
                child = Composite(shape=node.shape, device=node.device)
                node._specs[k] = child
                _MUTATIONS[0] += 1
            elif not isinstance(child, Composite):
                raise KeyError(f"Cannot set {key!r}: {k!r} is a leaf spec.")
            node = child
        if isinstance(spec, Mapping) and not isinstance(spec, Composite):
            spec = Composite(spec, shape=node.shape, device=node.device)
        if not isinstance(spec, TensorSpec | Composite):
            raise TypeError(f"Cannot set {key!r}: expected a spec, got {type(spec).__name__}.")
        n = node.ndim
        if spec.shape[:n] != node.shape:
            raise ValueError(
                f"Cannot set {key!r}: the spec shape {tuple(spec.shape)} must start with the "
                f"composite batch size {tuple(node.shape)}."
            )
        if node.device is not None and spec.device is not None and spec.device != node.device:
            spec = spec.to(node.device)
        node._specs[path[-1]] = spec
        _MUTATIONS[0] += 1

    set = __setitem__

    def __delitem__(self, key: NestedKey) -> None:
        path = _unravel(key)
        parent = self[path[:-1]] if len(path) > 1 else self
        del parent._specs[path[-1]]
        _MUTATIONS[0] += 1

    def pop(self, key: NestedKey, default=...):
        try:
            out = self[key]
        except KeyError:
            if default is ...:
                raise
            return default
        del self[key]
        return out

    def __contains__(self, key: NestedKey) -> bool:
        try:
            self[key]
        except KeyError:
            return False
        return True

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)

    def keys(self, include_nested: bool = False, leaves_only: bool = False) -> list[NestedKey]:
        """The keys, as a list; nested keys are tuples when ``include_nested``.

        Cached until any composite is written to (an env asks for its reward and done keys at
        every step; specs change at set-up)."""
        cache = self.__dict__.get("_keys_cache")
        if cache is None or cache[0] != _MUTATIONS[0]:
            cache = self.__dict__["_keys_cache"] = (_MUTATIONS[0], {})
        found = cache[1].get((include_nested, leaves_only))
        if found is None:
            found = cache[1][include_nested, leaves_only] = [k for k, _ in self.items(include_nested, leaves_only)]
        return list(found)

    def values(self, include_nested: bool = False, leaves_only: bool = False) -> list:
        return [v for _, v in self.items(include_nested, leaves_only)]

    def items(self, include_nested: bool = False, leaves_only: bool = False) -> list[tuple]:
        out = []
        for k, v in self._specs.items():
            is_comp = isinstance(v, Composite)
            if not (leaves_only and is_comp):
                out.append((k, v))
            if include_nested and is_comp:
                for sk, sv in v.items(True, leaves_only):
                    out.append(((k, *_unravel(sk)), sv))
        return out

    def update(self, other: Composite | Mapping) -> Composite:
        """Set every entry of ``other`` into this spec (sub-composites merge); returns self."""
        for k, v in other.items():
            if isinstance(v, Composite) and isinstance(self._specs.get(k), Composite):
                self._specs[k].update(v)  # counts its own writes
            else:
                self[k] = v
        return self

    def select(self, *keys: NestedKey, strict: bool = True) -> Composite:
        """A new composite holding only ``keys`` (nested keys allowed)."""
        out = Composite(shape=self.shape, device=self.device)
        for k in keys:
            if k in self:
                out[k] = self[k].clone()
            elif strict:
                raise KeyError(f"Key {k!r} not in the spec; available: {self.keys(True)}.")
        return out

    def exclude(self, *keys: NestedKey) -> Composite:
        """A copy without ``keys``."""
        out = self.clone()
        for k in keys:
            if k in out:
                del out[k]
        return out

    def empty(self) -> Composite:
        """A composite with the same shape and device and no entries."""
        return Composite(shape=self.shape, device=self.device)

    # ------------------------------------------------------------------ sampling
    def _build(self, fn: str, shape) -> TensorDictBase:
        shape = as_shape(shape)
        source = {k: getattr(v, fn)(shape) for k, v in self._specs.items()}
        return TensorDict(source, batch_size=(*shape, *self.shape), device=self.device)

    def rand(self, shape=()) -> TensorDictBase:
        """A random TensorDict of batch size ``(*shape, *self.shape)``."""
        return self._build("rand", shape)

    def zero(self, shape=()) -> TensorDictBase:
        """A TensorDict of zeros of batch size ``(*shape, *self.shape)``."""
        return self._build("zero", shape)

    def one(self, shape=()) -> TensorDictBase:
        return self._build("one", shape)

    def is_in(self, td: TensorDictBase) -> bool:
        """Whether every leaf of the spec is in ``td`` and admissible there."""
        return self.describe_mismatch(td) is None

    def describe_mismatch(self, td: TensorDictBase) -> str | None:
        """A sentence naming the first key that does not match, or ``None``."""
        for key, spec in self.items(include_nested=True, leaves_only=True):
            val = td.get(key, None)
            if val is None:
                return f"key {key!r} is missing"
            why = spec.describe_mismatch(val)
            if why is not None:
                return f"key {key!r}: {why} (spec {spec!r})"
        return None

    def assert_is_in(self, td: TensorDictBase, key: str = "tensordict") -> None:
        why = self.describe_mismatch(td)
        if why is not None:
            raise ValueError(f"{key} does not match its spec: {why}.")

    def project(self, td: TensorDictBase) -> TensorDictBase:
        """A copy of ``td`` with every spec'd leaf projected into its spec."""
        out = td.copy()
        for key, spec in self.items(include_nested=True, leaves_only=True):
            if key in td.keys(include_nested=True):
                out.set(key, spec.project(td.get(key)))
        return out

    def encode(self, vals: Mapping) -> TensorDictBase:
        """Turn a (nested) dict of array-likes into a TensorDict with this spec's dtypes."""
        source = {}
        for k, v in vals.items():
            if k in self._specs:
                source[k] = self._specs[k].encode(v)
        return TensorDict(source, batch_size=self.shape, device=self.device)

    # ------------------------------------------------------------------ reshaping
    def expand(self, *shape) -> Composite:
        """A copy with batch size ``shape`` (which must end with the current one)."""
        shape = expand_shape_args(shape)
        n = self.ndim
        if len(shape) < n or (n and shape[len(shape) - n :] != self.shape):
            raise ValueError(
                f"Cannot expand a Composite of shape {tuple(self.shape)} to {tuple(shape)}: "
                "the new shape must end with the current shape."
            )
        lead = shape[: len(shape) - n]
        out = Composite(shape=shape, device=self.device)
        for k, v in self._specs.items():
            out._specs[k] = v.expand((*lead, *v.shape))
        return out

    def unsqueeze(self, dim: int) -> Composite:
        if dim not in (0, -self.ndim - 1):
            raise ValueError(f"Composite.unsqueeze only supports dim=0, got {dim}.")
        return self.expand(1, *self.shape)

    def clone(self) -> Composite:
        out = Composite(shape=self.shape, device=self.device)
        for k, v in self._specs.items():
            out._specs[k] = v.clone()
        return out

    def to(self, device: DEVICE_TYPING) -> Composite:
        out = Composite(shape=self.shape, device=device)
        for k, v in self._specs.items():
            out._specs[k] = v.to(device)
        return out

    def cpu(self) -> Composite:
        return self.to("cpu")

    def __eq__(self, other) -> bool:
        return (
            isinstance(other, Composite)
            and self.shape == other.shape
            and self.device == other.device
            and self._specs.keys() == other._specs.keys()
            and all(v == other._specs[k] for k, v in self._specs.items())
        )

    __hash__ = None

    def __repr__(self) -> str:
        inner = ",\n".join(
            f"    {k}: " + repr(v).replace("\n", "\n    ") for k, v in self._specs.items()
        )
        body = f"\n{inner}" if inner else ""
        return f"Composite({body}, shape={tuple(self.shape)}, device={self.device})"
