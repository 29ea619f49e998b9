"""Discrete specs: :class:`Categorical`, :class:`OneHot`, :class:`Binary`, :class:`MultiCategorical`."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ._base import DEVICE_TYPING, TensorSpec, as_shape
from .continuous import sort_device_dtype

__all__ = ["Categorical", "OneHot", "Binary", "MultiCategorical"]


def _sample_index(n: int, batch: torch.Size, mask: torch.Tensor | None, device) -> torch.Tensor:
    """Uniform integer in ``[0, n)`` of shape ``batch``; only where ``mask`` (..., n) is True."""
    if mask is None:
        return torch.randint(0, n, batch, device=device)
    mask = mask.expand(*batch, n)
    probs = mask.reshape(-1, n).float()
    if bool((probs.sum(-1) == 0).any()):
        raise ValueError("Cannot sample from a mask that allows no value in some row.")
    return torch.multinomial(probs, 1).reshape(batch)


class _OneOfN(TensorSpec):
    """What :class:`Categorical` and :class:`OneHot` share: one of ``n`` categories, an optional
    mask of the allowed ones (set by the subclass's ``update_mask``), ``space`` (TorchRL
    compatibility: ``spec.space.n``), ``to`` and equality on ``n``. A subclass sets its
    ``_default_dtype`` and its ``_full_shape(n, shape)`` (the spec's shape, checked)."""

    _default_dtype: torch.dtype

    def __init__(
        self,
        n: int,
        shape: int | Sequence[int] | torch.Size | None = None,
        device: DEVICE_TYPING = None,
        dtype: torch.dtype | None = None,
        mask: torch.Tensor | None = None,
    ) -> None:
        device, dtype = sort_device_dtype(device, dtype)
        super().__init__(self._full_shape(n, shape), dtype or self._default_dtype, device)
        self.n = int(n)
        self.mask = None
        if mask is not None:
            self.update_mask(mask)

    def update_mask(self, mask: torch.Tensor | None) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def space(self):
        return self

    def to(self, device: DEVICE_TYPING):
        mask = None if self.mask is None else self.mask.to(device)
        return type(self)(self.n, self.shape, device, self.dtype, mask)

    def _extra_eq(self, other) -> bool:
        return self.n == other.n

    def _repr_extra(self) -> str:
        return f"n={self.n}"


class Categorical(_OneOfN):
    """An integer index in ``[0, n)``; the tensor has no trailing ``n`` dim.

    Args:
        n: number of categories.
        shape: full shape (default ``()``).
        device: device of the tensors.
        dtype: default ``torch.int64``.
        mask: optional bool tensor ``(*shape, n)``: allowed categories (action masking).
    """

    _default_dtype = torch.int64

    @staticmethod
    def _full_shape(n: int, shape) -> torch.Size:
        return as_shape(shape)

    def update_mask(self, mask: torch.Tensor | None) -> None:
        """Set the allowed categories: a bool tensor broadcastable to ``(*shape, n)``."""
        if mask is not None:
            mask = torch.as_tensor(mask, dtype=torch.bool, device=self.device)
            if mask.shape[-1:] != (self.n,):
                raise ValueError(f"mask must end with n={self.n}, got shape {tuple(mask.shape)}.")
            mask = mask.expand(*self.shape, self.n)
        self.mask = mask

    def rand(self, shape=()) -> torch.Tensor:
        full = torch.Size((*as_shape(shape), *self.shape))
        return _sample_index(self.n, full, self.mask, self.device).to(self.dtype)

    def _values_in(self, val: torch.Tensor) -> bool:
        ok = bool(((val >= 0) & (val < self.n)).all())
        if ok and self.mask is not None:
            allowed = self.mask.expand(*val.shape, self.n).gather(-1, val.long().unsqueeze(-1))
            ok = bool(allowed.all())
        return ok

    def _values_repr(self) -> str:
        return f"integers in [0, {self.n})" + (" allowed by the mask" if self.mask is not None else "")

    def project(self, val: torch.Tensor) -> torch.Tensor:
        if val.is_floating_point():
            val = val.round()
        return val.clamp(0, self.n - 1).to(self.dtype)

    def to_one_hot(self, val: torch.Tensor) -> torch.Tensor:
        """``val`` (..., ) -> one-hot (..., n) bool."""
        return torch.nn.functional.one_hot(val.long(), self.n).bool()

    def to_one_hot_spec(self) -> OneHot:
        return OneHot(self.n, (*self.shape, self.n), self.device, mask=self.mask)

    def _expanded(self, shape: torch.Size) -> Categorical:
        mask = None if self.mask is None else self.mask.expand(*shape, self.n)
        return Categorical(self.n, shape, self.device, self.dtype, mask)


class OneHot(_OneOfN):
    """A one-hot vector over ``n`` categories in the last dim.

    Args:
        n: number of categories.
        shape: full shape, ending with ``n`` (default ``(n,)``).
        device: device of the tensors.
        dtype: default ``torch.bool`` (TorchRL's default).
        mask: optional bool tensor broadcastable to ``shape``: allowed categories.
    """

    _default_dtype = torch.bool

    @staticmethod
    def _full_shape(n: int, shape) -> torch.Size:
        shape = as_shape((n,) if shape is None else shape)
        if not shape or shape[-1] != n:
            raise ValueError(f"OneHot: the last dim of shape must be n={n}, got {tuple(shape)}.")
        return shape

    def update_mask(self, mask: torch.Tensor | None) -> None:
        """Set the allowed categories: a bool tensor broadcastable to ``shape``."""
        if mask is not None:
            mask = torch.as_tensor(mask, dtype=torch.bool, device=self.device).expand(self.shape)
        self.mask = mask

    def rand(self, shape=()) -> torch.Tensor:
        batch = torch.Size((*as_shape(shape), *self.shape[:-1]))
        mask = None if self.mask is None else self.mask.expand(*as_shape(shape), *self.shape)
        idx = _sample_index(self.n, batch, mask, self.device)
        return torch.nn.functional.one_hot(idx, self.n).to(self.dtype)

    def _values_in(self, val: torch.Tensor) -> bool:
        v = val.long() if val.dtype == torch.bool else val
        ok = bool((((v == 0) | (v == 1)).all()) and bool((v.sum(-1) == 1).all()))
        if ok and self.mask is not None:
            ok = bool((~(val.bool() & ~self.mask.expand(val.shape))).all())
        return ok

    def _values_repr(self) -> str:
        return f"one-hot over the last dim of size {self.n}"

    def project(self, val: torch.Tensor) -> torch.Tensor:
        v = val.float()
        if self.mask is not None:
            v = v.masked_fill(~self.mask.expand(val.shape), float("-inf"))
        return torch.nn.functional.one_hot(v.argmax(-1), self.n).to(self.dtype)

    def encode(self, val, ignore_device: bool = False) -> torch.Tensor:
        """An index (or array of indices) -> a one-hot tensor of this spec's dtype, as in TorchRL.

        ``OneHot(4).encode(2)`` is ``[0, 0, 1, 0]``; indices of shape ``shape[:-1]`` (a vector
        env's ``(num_envs,)``), or any shape not ending in ``n``, are one-hot encoded (extra
        leading dims are kept). A value ending in ``n`` is taken as already one-hot and only
        cast (for a batch of exactly ``n`` indices, call ``torch.nn.functional.one_hot``).

        Raises:
            ValueError: an index outside ``[0, n)``, or a fractional one.
        """
        out = val if isinstance(val, torch.Tensor) else torch.as_tensor(val)
        if out.shape == self.shape[:-1] or out.shape[-1:] != (self.n,):
            if out.dtype == torch.bool or (out.is_floating_point() and bool((out != out.round()).any())):
                raise ValueError(f"OneHot(n={self.n}).encode: expected integer indices in [0, {self.n}) "
                                 f"or a one-hot of shape (..., {self.n}), got {out.dtype} of shape "
                                 f"{tuple(out.shape)}.")
            if out.numel() and bool(((out < 0) | (out >= self.n)).any()):
                raise ValueError(f"OneHot(n={self.n}).encode: indices must lie in [0, {self.n}), got "
                                 f"{self._summary(out)}.")
            out = torch.nn.functional.one_hot(out.long(), self.n)
        return super().encode(out, ignore_device)

    def to_categorical(self, val: torch.Tensor) -> torch.Tensor:
        """``val`` (..., n) -> index (...,) int64."""
        return val.long().argmax(-1)

    def to_categorical_spec(self) -> Categorical:
        return Categorical(self.n, self.shape[:-1], self.device, mask=self.mask)

    def _expanded(self, shape: torch.Size) -> OneHot:
        mask = None if self.mask is None else self.mask.expand(shape)
        return OneHot(self.n, shape, self.device, self.dtype, mask)


class Binary(TensorSpec):
    """A vector of ``n`` independent 0/1 values in the last dim.

    Args:
        n: size of the last dim (default: ``shape[-1]``).
        shape: full shape, ending with ``n`` (default ``(n,)``).
        device: device of the tensors.
        dtype: default ``torch.int8`` (TorchRL's default).
    """

    def __init__(
        self,
        n: int | None = None,
        shape: int | Sequence[int] | torch.Size | None = None,
        device: DEVICE_TYPING = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        device, dtype = sort_device_dtype(device, dtype)
        if shape is None and n is None:
            raise ValueError("Binary: give n or shape.")
        shape = as_shape((n,) if shape is None else shape)
        if n is None:
            n = shape[-1]
        if not shape or shape[-1] != n:
            raise ValueError(f"Binary: the last dim of shape must be n={n}, got {tuple(shape)}.")
        super().__init__(shape, dtype or torch.int8, device)
        self.n = int(n)

    def rand(self, shape=()) -> torch.Tensor:
        full = (*as_shape(shape), *self.shape)
        return torch.randint(0, 2, full, device=self.device).to(self.dtype)

    def _values_in(self, val: torch.Tensor) -> bool:
        return bool(((val == 0) | (val == 1)).all())

    def _values_repr(self) -> str:
        return "values in {0, 1}"

    def project(self, val: torch.Tensor) -> torch.Tensor:
        return (val > 0.5).to(self.dtype) if val.dtype != torch.bool else val.to(self.dtype)

    def _expanded(self, shape: torch.Size) -> Binary:
        return Binary(self.n, shape, self.device, self.dtype)

    def to(self, device: DEVICE_TYPING) -> Binary:
        return Binary(self.n, self.shape, device, self.dtype)

    def _repr_extra(self) -> str:
        return f"n={self.n}"


class MultiCategorical(TensorSpec):
    """Several categorical indices side by side: entry ``i`` lies in ``[0, nvec[i])``.

    Args:
        nvec: number of categories of each entry (a sequence or tensor).
        shape: full shape; default ``nvec``'s shape; ``nvec`` is broadcast to it.
        device: device of the tensors.
        dtype: default ``torch.int64``.
    """

    def __init__(
        self,
        nvec: Sequence[int] | torch.Tensor,
        shape: int | Sequence[int] | torch.Size | None = None,
        device: DEVICE_TYPING = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        device, dtype = sort_device_dtype(device, dtype)
        nvec = torch.as_tensor(nvec, dtype=torch.int64, device=device)
        shape = as_shape(nvec.shape if shape is None else shape)
        try:
            nvec = nvec.expand(shape).clone()
        except RuntimeError as err:
            raise ValueError(
                f"MultiCategorical: nvec of shape {tuple(nvec.shape)} does not broadcast to {tuple(shape)}."
            ) from err
        super().__init__(shape, dtype or torch.int64, device)
        self.nvec = nvec

    def rand(self, shape=()) -> torch.Tensor:
        full = (*as_shape(shape), *self.shape)
        u = torch.rand(full, device=self.device, dtype=torch.float64)
        return (u * self.nvec).floor().long().clamp_max(self.nvec - 1).to(self.dtype)

    def _values_in(self, val: torch.Tensor) -> bool:
        return bool(((val >= 0) & (val < self.nvec)).all())

    def _values_repr(self) -> str:
        return f"integers in [0, nvec) with nvec={self.nvec.tolist() if self.nvec.numel() <= 8 else '...'}"

    def project(self, val: torch.Tensor) -> torch.Tensor:
        if val.is_floating_point():
            val = val.round()
        return torch.minimum(val.clamp_min(0), self.nvec - 1).to(self.dtype)

    def _expanded(self, shape: torch.Size) -> MultiCategorical:
        return MultiCategorical(self.nvec.expand(shape), shape, self.device, self.dtype)

    def to(self, device: DEVICE_TYPING) -> MultiCategorical:
        return MultiCategorical(self.nvec.to(device), self.shape, device, self.dtype)

    def _extra_eq(self, other) -> bool:
        return torch.equal(self.nvec, other.nvec)

    def _repr_extra(self) -> str:
        return f"nvec={self.nvec.tolist() if self.nvec.numel() <= 8 else '...'}"


class MultiOneHot(TensorSpec):
    """Several one-hot vectors side by side in the last dim: segment ``i`` has ``nvec[i]``
    entries, exactly one of which is set (TorchRL's ``MultiOneHot``, e.g. a Gymnasium
    ``MultiDiscrete`` space in one-hot form).

    Args:
        nvec: the size of each one-hot segment.
        shape: full shape, ending with ``sum(nvec)`` (default ``(sum(nvec),)``).
        device: device of the tensors.
        dtype: default ``torch.bool`` (TorchRL's default).
    """

    def __init__(
        self,
        nvec: Sequence[int],
        shape: int | Sequence[int] | torch.Size | None = None,
        device: DEVICE_TYPING = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        device, dtype = sort_device_dtype(device, dtype)
        self.nvec = [int(n) for n in nvec]
        if not self.nvec or min(self.nvec) < 1:
            raise ValueError(f"MultiOneHot: nvec must be sizes >= 1, got {list(nvec)}.")
        total = sum(self.nvec)
        shape = as_shape((total,) if shape is None else shape)
        if not shape or shape[-1] != total:
            raise ValueError(f"MultiOneHot: the last dim of shape must be sum(nvec)={total}, got {tuple(shape)}.")
        super().__init__(shape, dtype or torch.bool, device)

    def _segments(self, val: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.split(val, self.nvec, dim=-1)

    def rand(self, shape=()) -> torch.Tensor:
        batch = torch.Size((*as_shape(shape), *self.shape[:-1]))
        parts = [torch.nn.functional.one_hot(_sample_index(n, batch, None, self.device), n) for n in self.nvec]
        return torch.cat(parts, -1).to(self.dtype)

    def _values_in(self, val: torch.Tensor) -> bool:
        v = val.long()
        return bool(((v == 0) | (v == 1)).all()) and all(bool((s.sum(-1) == 1).all()) for s in self._segments(v))

    def _values_repr(self) -> str:
        return f"one one-hot per segment of sizes {self.nvec} in the last dim"

    def project(self, val: torch.Tensor) -> torch.Tensor:
        parts = [torch.nn.functional.one_hot(s.float().argmax(-1), n) for s, n in zip(self._segments(val), self.nvec)]
        return torch.cat(parts, -1).to(self.dtype)

    def to_categorical(self, val: torch.Tensor) -> torch.Tensor:
        """``val`` (..., sum(nvec)) -> indices (..., len(nvec)) int64."""
        return torch.stack([s.long().argmax(-1) for s in self._segments(val)], -1)

    def to_categorical_spec(self) -> MultiCategorical:
        return MultiCategorical(self.nvec, (*self.shape[:-1], len(self.nvec)), self.device)

    def encode(self, val, ignore_device: bool = False) -> torch.Tensor:
        """Indices (..., len(nvec)) -> the concatenated one-hots (..., sum(nvec))."""
        out = val if isinstance(val, torch.Tensor) else torch.as_tensor(val)
        if out.shape[-1:] != (sum(self.nvec),):
            if out.shape[-1:] != (len(self.nvec),):
                raise ValueError(f"MultiOneHot(nvec={self.nvec}).encode: expected indices (..., {len(self.nvec)}) "
                                 f"or one-hots (..., {sum(self.nvec)}), got shape {tuple(out.shape)}.")
            bad = [i for i, n in enumerate(self.nvec) if bool(((out[..., i] < 0) | (out[..., i] >= n)).any())]
            if bad:
                raise ValueError(f"MultiOneHot(nvec={self.nvec}).encode: index {bad[0]} out of [0, {self.nvec[bad[0]]})")
            out = torch.cat([torch.nn.functional.one_hot(out[..., i].long(), n) for i, n in enumerate(self.nvec)], -1)
        return super().encode(out, ignore_device)

    def _expanded(self, shape: torch.Size) -> MultiOneHot:
        return MultiOneHot(self.nvec, shape, self.device, self.dtype)

    def to(self, device: DEVICE_TYPING) -> MultiOneHot:
        return MultiOneHot(self.nvec, self.shape, device, self.dtype)

    def _extra_eq(self, other) -> bool:
        return self.nvec == other.nvec

    def _repr_extra(self) -> str:
        return f"nvec={self.nvec}"
