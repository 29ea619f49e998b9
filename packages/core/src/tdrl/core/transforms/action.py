"""``ActionScaling``: the policy acts in ``[low, high]`` (default ``[-1, 1]``), the env gets
actions rescaled to its own bounds."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..keys import ACTION
from ..specs import Bounded, Composite
from .base import Transform

__all__ = ["ActionScaling"]


class ActionScaling(Transform):
    """Affinely map actions from ``[low, high]`` to the base env's action bounds.

    The transformed env's action spec is ``Bounded(low, high)``; ``step`` maps
    ``a -> base_low + (a - low) / (high - low) * (base_high - base_low)``.

    Args:
        low, high: the user-facing bounds (default ``-1``, ``1``).
        in_keys_inv: action keys (default ``["action"]``).
        clip: clamp user actions to ``[low, high]`` before mapping (default True).

    Raises:
        TypeError: the base action spec is not ``Bounded`` (with finite bounds).
    """

    def __init__(
        self,
        low: float = -1.0,
        high: float = 1.0,
        in_keys_inv: Sequence | str | None = None,
        clip: bool = True,
    ) -> None:
        if not high > low:
            raise ValueError(f"ActionScaling needs high > low, got low={low}, high={high}.")
        super().__init__([], [], in_keys_inv or [ACTION])
        self.low, self.high, self.clip = float(low), float(high), clip
        self._base: dict = {}

    def _inv_apply_transform(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError  # per key: see inv()

    def inv(self, td):
        for k_in, k_out in zip(self.in_keys_inv, self.out_keys_inv, strict=True):
            a = td.get(k_out, None)
            if a is None:
                continue
            if self.clip:
                a = a.clamp(self.low, self.high)
            b_low, b_high = self._base[k_in]
            frac = (a - self.low) / (self.high - self.low)
            b_low, b_high = b_low.to(a.device, a.dtype), b_high.to(a.device, a.dtype)
            td.set(k_in, b_low + frac * (b_high - b_low))
        return td

    def transform_action_spec(self, spec: Composite) -> Composite:
        for k_in, k_out in zip(self.in_keys_inv, self.out_keys_inv, strict=True):
            if k_in not in spec:
                continue
            leaf = spec[k_in]
            if not isinstance(leaf, Bounded) or not (
                torch.isfinite(leaf.low).all() and torch.isfinite(leaf.high).all()
            ):
                raise TypeError(
                    f"ActionScaling needs a Bounded action spec with finite bounds at {k_in!r}, "
                    f"got {leaf!r}."
                )
            self._base[k_in] = (leaf.low.clone(), leaf.high.clone())
            spec[k_out] = Bounded(self.low, self.high, leaf.shape, leaf.device, leaf.dtype)
        return spec

    def extra_repr(self) -> str:
        return f"low={self.low}, high={self.high}, keys={self.in_keys_inv}"
