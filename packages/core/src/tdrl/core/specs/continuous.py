"""Box-like specs: :class:`Unbounded` and :class:`Bounded`."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ._base import DEVICE_TYPING, TensorSpec, as_shape

__all__ = ["Unbounded", "Bounded"]


def sort_device_dtype(device, dtype):
    """Accept ``(dtype, device)`` given positionally in either order."""
    if isinstance(device, torch.dtype) and not isinstance(dtype, torch.dtype):
        device, dtype = dtype, device
    return device, dtype


def _rand_like_dtype(shape: torch.Size, dtype: torch.dtype, device) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, device=device).bool()
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(shape, dtype=dtype, device=device)
    return torch.randint(-10, 11, shape, device=device).to(dtype)


class Unbounded(TensorSpec):
    """Any value of the given shape and dtype.

    Args:
        shape: full shape (batch dims first). Default ``()``.
        device: device of the tensors.
        dtype: default ``torch.float32``.

    ``rand`` draws from a standard normal (random integers / bools for integer dtypes).
    """

    def __init__(
        self,
        shape: int | Sequence[int] | torch.Size = (),
        device: DEVICE_TYPING = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        device, dtype = sort_device_dtype(device, dtype)
        super().__init__(shape, dtype or torch.float32, device)

    def rand(self, shape=()) -> torch.Tensor:
        return _rand_like_dtype((*as_shape(shape), *self.shape), self.dtype, self.device)

    def _expanded(self, shape: torch.Size) -> Unbounded:
        return Unbounded(shape, self.device, self.dtype)

    def to(self, device: DEVICE_TYPING) -> Unbounded:
        return Unbounded(self.shape, device, self.dtype)


class Bounded(TensorSpec):
    """Values in the closed box ``[low, high]`` (element-wise).

    Args:
        low: lower bound, a number or a tensor broadcastable to ``shape``.
        high: upper bound, idem.
        shape: full shape; default: the broadcast shape of ``low`` and ``high``.
        device: device of the tensors.
        dtype: default ``torch.float32``. Integer dtypes sample integers in ``[low, high]``.

    Attributes:
        low, high: the bounds, expanded to ``shape``.
    """

    def __init__(
        self,
        low: float | torch.Tensor,
        high: float | torch.Tensor,
        shape: int | Sequence[int] | torch.Size | None = None,
        device: DEVICE_TYPING = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        device, dtype = sort_device_dtype(device, dtype)
        dtype = dtype or torch.float32
        low = torch.as_tensor(low, device=device)
        high = torch.as_tensor(high, device=device)
        if shape is None:
            shape = torch.broadcast_shapes(low.shape, high.shape)
        shape = as_shape(shape)
        try:
            low = low.to(dtype).expand(shape).clone()
            high = high.to(dtype).expand(shape).clone()
        except RuntimeError as err:
            raise ValueError(
                f"Bounded: low {tuple(low.shape)} and high {tuple(high.shape)} cannot be "
                f"broadcast to shape {tuple(shape)}."
            ) from err
        if (low > high).any():
            raise ValueError(f"Bounded: low must be <= high everywhere, got low={low}, high={high}.")
        super().__init__(shape, dtype, device if device is not None else None)
        self.low = low
        self.high = high

    @property
    def space(self):  # TorchRL compatibility: spec.space.low / spec.space.high
        return self

    def rand(self, shape=()) -> torch.Tensor:
        full = (*as_shape(shape), *self.shape)
        low, high = self.low, self.high
        if not self.dtype.is_floating_point:
            u = torch.rand(full, device=self.device, dtype=torch.float64)
            span = (high.double() - low.double() + 1)
            return (low.double() + (u * span).floor()).clamp_max(high.double()).to(self.dtype)
        finite = torch.isfinite(low) & torch.isfinite(high)
        u = torch.rand(full, dtype=self.dtype, device=self.device)
        if bool(finite.all()):
            return low + (high - low) * u
        uni = torch.where(finite, low + (high - low).nan_to_num(0.0) * u, 0.0)
        gauss = torch.randn(full, dtype=self.dtype, device=self.device)
        gauss = torch.maximum(torch.minimum(gauss, high), low)
        return torch.where(finite, uni, gauss)

    def _values_in(self, val: torch.Tensor) -> bool:
        return bool(((val >= self.low) & (val <= self.high)).all())

    def _values_repr(self) -> str:
        lo, hi = self.low, self.high
        if lo.numel() and bool((lo == lo.flatten()[0]).all()) and bool((hi == hi.flatten()[0]).all()):
            return f"[{lo.flatten()[0].item():.4g}, {hi.flatten()[0].item():.4g}]"
        return "[low, high]"

    def project(self, val: torch.Tensor) -> torch.Tensor:
        val = val.to(self.dtype)
        return torch.maximum(torch.minimum(val, self.high), self.low)

    def _expanded(self, shape: torch.Size) -> Bounded:
        return Bounded(self.low.expand(shape), self.high.expand(shape), shape, self.device, self.dtype)

    def to(self, device: DEVICE_TYPING) -> Bounded:
        return Bounded(self.low.to(device), self.high.to(device), self.shape, device, self.dtype)

    def _extra_eq(self, other) -> bool:
        return torch.equal(self.low, other.low) and torch.equal(self.high, other.high)

    def _repr_extra(self) -> str:
        lo, hi = self.low, self.high
        if lo.numel() and bool((lo == lo.flatten()[0]).all()) and bool((hi == hi.flatten()[0]).all()):
            return f"low={lo.flatten()[0].item():.4g}, high={hi.flatten()[0].item():.4g}"
        return f"low={lo.tolist()}, high={hi.tolist()}" if lo.numel() <= 8 else "low=<tensor>, high=<tensor>"
