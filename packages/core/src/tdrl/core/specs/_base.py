"""The base class of every leaf spec: shape, dtype and device handling.

A spec describes the tensors an environment reads or writes: their full shape (batch dims
first), dtype and device, and the set of values they may take. Names and semantics follow
TorchRL 0.14 so that ported code keeps working.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["TensorSpec", "DEVICE_TYPING", "as_shape"]

DEVICE_TYPING = torch.device | str | int | None


def as_shape(shape: int | Sequence[int] | torch.Size | None) -> torch.Size:
    """Normalise ``shape`` (an int, a sequence of ints or ``None``) to a ``torch.Size``."""
    if shape is None:
        return torch.Size(())
    if isinstance(shape, int):
        return torch.Size((shape,))
    return torch.Size(tuple(int(s) for s in shape))


def as_device(device: DEVICE_TYPING) -> torch.device | None:
    if device is None:
        return None
    return torch.device(device)


def expand_shape_args(shape: tuple) -> torch.Size:
    """``expand(4, 3)`` and ``expand((4, 3))`` both mean ``torch.Size([4, 3])``."""
    if len(shape) == 1 and not isinstance(shape[0], int):
        return as_shape(shape[0])
    return as_shape(shape)


class TensorSpec:
    """A leaf spec: a tensor of fixed ``shape``, ``dtype`` and ``device``.

    Subclasses define the admissible values through ``rand``, ``is_in`` and ``project``.

    Args:
        shape: full shape of the tensor, batch dims first.
        dtype: torch dtype of the tensor.
        device: device of the tensors it produces (``None``: the default device).
    """

    def __init__(
        self,
        shape: int | Sequence[int] | torch.Size,
        dtype: torch.dtype,
        device: DEVICE_TYPING = None,
    ) -> None:
        self.shape = as_shape(shape)
        self.dtype = dtype
        self.device = as_device(device)

    # ------------------------------------------------------------------ properties
    @property
    def ndim(self) -> int:
        """Number of dims of the tensor (``len(shape)``)."""
        return len(self.shape)

    def ndimension(self) -> int:
        return self.ndim

    # ------------------------------------------------------------------ sampling
    def rand(self, shape: int | Sequence[int] | torch.Size = ()) -> torch.Tensor:
        """A random admissible tensor of shape ``(*shape, *self.shape)``."""
        raise NotImplementedError

    def zero(self, shape: int | Sequence[int] | torch.Size = ()) -> torch.Tensor:
        """A tensor of zeros of shape ``(*shape, *self.shape)`` (may be outside the spec)."""
        return torch.zeros(
            (*as_shape(shape), *self.shape), dtype=self.dtype, device=self.device
        )

    def one(self, shape: int | Sequence[int] | torch.Size = ()) -> torch.Tensor:
        """A tensor of ones of shape ``(*shape, *self.shape)``."""
        return torch.ones((*as_shape(shape), *self.shape), dtype=self.dtype, device=self.device)

    # ------------------------------------------------------------------ checking
    def _shape_ok(self, val: torch.Tensor) -> bool:
        n = self.ndim
        return val.shape[val.ndim - n :] == self.shape if n else True

    def is_in(self, val: torch.Tensor) -> bool:
        """Whether ``val`` has this spec's dtype, trailing shape and admissible values.

        Leading dims beyond ``self.shape`` are allowed (e.g. a time dim).
        """
        if not isinstance(val, torch.Tensor):
            return False
        if val.dtype != self.dtype or not self._shape_ok(val):
            return False
        return self._values_in(val)

    def _values_in(self, val: torch.Tensor) -> bool:
        return True

    def describe_mismatch(self, val) -> str | None:
        """A sentence saying why ``val`` is not in the spec, or ``None`` when it is."""
        if not isinstance(val, torch.Tensor):
            return f"expected a torch.Tensor, got {type(val).__name__}"
        if val.dtype != self.dtype:
            return f"expected dtype {self.dtype}, got {val.dtype}"
        if not self._shape_ok(val):
            return f"expected shape (..., {', '.join(map(str, self.shape))}), got {tuple(val.shape)}"
        if not self._values_in(val):
            return f"values outside the spec ({self._values_repr()}): got {self._summary(val)}"
        return None

    def assert_is_in(self, val: torch.Tensor, key: str | tuple = "value") -> None:
        """Raise ``ValueError`` naming ``key``, this spec and what was given if ``val`` is not in it."""
        why = self.describe_mismatch(val)
        if why is not None:
            raise ValueError(f"{key!r} does not match its spec {self!r}: {why}.")

    def type_check(self, val: torch.Tensor, key: str | tuple = "value") -> None:
        """Raise ``TypeError`` if ``val`` has the wrong dtype."""
        if val.dtype != self.dtype:
            raise TypeError(f"{key!r}: expected dtype {self.dtype}, got {val.dtype}.")

    @staticmethod
    def _summary(val: torch.Tensor) -> str:
        if val.numel() == 0:
            return "an empty tensor"
        if val.numel() <= 8:
            return str(val.tolist())
        v = val.float() if not val.is_floating_point() else val
        return f"min {v.min().item():.4g}, max {v.max().item():.4g}"

    def _values_repr(self) -> str:
        return "any value"

    def project(self, val: torch.Tensor) -> torch.Tensor:
        """The closest admissible tensor to ``val`` (a new tensor; identity when unbounded)."""
        return val.to(self.dtype)

    def encode(self, val, ignore_device: bool = False) -> torch.Tensor:
        """Turn an array-like (numpy array, number, list) into a tensor of this spec's dtype."""
        if isinstance(val, torch.Tensor):
            out = val
        else:
            out = torch.as_tensor(val)
        out = out.to(dtype=self.dtype)
        if self.device is not None and not ignore_device:
            out = out.to(self.device)
        if out.shape != self.shape and out.numel() == self.shape.numel():
            out = out.reshape(self.shape)
        return out

    # ------------------------------------------------------------------ reshaping
    def _check_expand(self, shape: torch.Size) -> None:
        n = self.ndim
        if len(shape) < n or (n and shape[len(shape) - n :] != self.shape):
            raise ValueError(
                f"Cannot expand {type(self).__name__} of shape {tuple(self.shape)} to "
                f"{tuple(shape)}: the new shape must end with the current shape."
            )

    def expand(self, *shape) -> TensorSpec:
        """A copy with shape ``shape`` (sizes or one sequence), which must end with the
        current shape."""
        shape = expand_shape_args(shape)
        self._check_expand(shape)
        return self._expanded(shape)

    def _expanded(self, shape: torch.Size) -> TensorSpec:  # pragma: no cover - abstract
        """:meth:`expand` once ``shape`` is checked: a copy of this spec with that shape."""
        raise NotImplementedError

    def clone(self) -> TensorSpec:
        return self.expand(self.shape)

    def to(self, device: DEVICE_TYPING) -> TensorSpec:
        """A copy of this spec on ``device``."""
        raise NotImplementedError

    def cpu(self) -> TensorSpec:
        return self.to("cpu")

    def unsqueeze(self, dim: int) -> TensorSpec:
        """A copy with a new dim of size 1 at ``dim`` (only leading dims for bounded specs)."""
        if dim < 0:
            dim += self.ndim + 1
        if dim != 0:
            raise ValueError(f"{type(self).__name__}.unsqueeze only supports dim=0, got {dim}.")
        return self.expand(1, *self.shape)

    def __eq__(self, other) -> bool:
        if type(self) is not type(other):
            return False
        return (
            self.shape == other.shape
            and self.dtype == other.dtype
            and self.device == other.device
            and self._extra_eq(other)
        )

    def _extra_eq(self, other) -> bool:
        return True

    __hash__ = None  # mutable, compared by value

    def _repr_extra(self) -> str:
        return ""

    def __repr__(self) -> str:
        extra = self._repr_extra()
        extra = f", {extra}" if extra else ""
        return (
            f"{type(self).__name__}(shape={tuple(self.shape)}, dtype={self.dtype}"
            f"{extra}, device={self.device})"
        )
