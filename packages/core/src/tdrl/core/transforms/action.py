"""Action rewrites: ``ActionScaling`` (the policy acts in ``[low, high]``, default ``[-1, 1]``,
the env gets actions rescaled to its own bounds) and ``ActionDiscretizer`` (a discrete grid
over a continuous action box) and ``FlattenAction`` (the policy sees flattened action dims)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..keys import ACTION
from ..specs import Bounded, Categorical, Composite, MultiCategorical, MultiOneHot, OneHot, Unbounded
from .base import Transform

__all__ = ["ActionScaling", "ActionDiscretizer", "FlattenAction"]


def _finite_box(leaf, key, who: str) -> Bounded:
    """``leaf`` if it is a ``Bounded`` spec with finite bounds, else a ``TypeError`` naming ``who``."""
    if not isinstance(leaf, Bounded) or not (torch.isfinite(leaf.low).all() and torch.isfinite(leaf.high).all()):
        raise TypeError(f"{who} needs a Bounded action spec with finite bounds at {key!r}, got {leaf!r}.")
    return leaf


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
            leaf = _finite_box(spec[k_in], k_in, "ActionScaling")
            self._base[k_in] = (leaf.low.clone(), leaf.high.clone())
            spec[k_out] = Bounded(self.low, self.high, leaf.shape, leaf.device, leaf.dtype)
        return spec

    def extra_repr(self) -> str:
        return f"low={self.low}, high={self.high}, keys={self.in_keys_inv}"


# where in interval i of n the value sits, as a fraction of the interval (endpoints: linspace)
_OFFSETS = {"median": 0.5, "low": 0.0, "high": 1.0, "endpoints": None}


class ActionDiscretizer(Transform):
    """A continuous action space as a discrete one (TorchRL's ``ActionDiscretizer``): each of
    the ``d`` action dims is cut into ``num_intervals`` equal intervals of ``[low, high]`` and
    index ``i`` takes a value of interval ``i`` -- its centre by default (TorchRL's ``MEDIAN``),
    so a DQN-style policy acts in a box.

    With one action dim the transformed spec is ``Categorical(num_intervals)`` (an index) or,
    with ``categorical=False``, ``OneHot(num_intervals)``; with ``d > 1`` it is
    ``MultiCategorical([num_intervals] * d)`` (or ``MultiOneHot``). ``step`` maps the chosen
    values back to the base env's continuous action.

    Args:
        num_intervals: values per action dim (>= 2).
        action_key: the action key (default ``"action"``).
        categorical: indices (default) or one-hot actions.
        sampling: which value of interval ``i``: ``"median"`` (its centre, TorchRL's default),
            ``"low"`` / ``"high"`` (its edges), or ``"endpoints"`` (tdrl's: ``num_intervals``
            evenly spaced values from ``low`` to ``high``, both included); TorchRL's
            ``ActionDiscretizer.SamplingStrategy`` members are read by name (``RANDOM`` is refused).

    Raises:
        TypeError: the base action spec is not ``Bounded`` with finite bounds.
    """

    def __init__(self, num_intervals: int, action_key: str = ACTION, categorical: bool = True,
                 sampling: str | None = None) -> None:
        if int(num_intervals) < 2:
            raise ValueError(f"ActionDiscretizer needs num_intervals >= 2, got {num_intervals}.")
        sampling = str(getattr(sampling, "name", sampling or "median")).lower()
        if sampling not in _OFFSETS:
            raise ValueError(f"ActionDiscretizer(sampling={sampling!r}): expected one of {sorted(_OFFSETS)} "
                             "(a random value inside the interval is not supported).")
        self.sampling = sampling
        super().__init__([], [], [action_key])
        self.num_intervals, self.categorical = int(num_intervals), bool(categorical)
        self._grid: torch.Tensor | None = None  # [d, num_intervals]: the values of each dim

    def inv(self, td):
        key = self.in_keys_inv[0]
        a = td.get(key, None)
        if a is None:
            return td
        if self._grid is None:
            raise RuntimeError("ActionDiscretizer: attach it to an env first (its grid comes from the action spec).")
        d = self._grid.shape[0]
        if self.categorical:
            idx = a.long() if d > 1 else a.long().unsqueeze(-1)
        else:
            parts = a.split(self.num_intervals, -1) if d > 1 else (a,)
            idx = torch.stack([p.long().argmax(-1) for p in parts], -1)
        if idx.shape[-1] != d or bool(((idx < 0) | (idx >= self.num_intervals)).any()):
            raise ValueError(f"ActionDiscretizer: expected {d} index(es) in [0, {self.num_intervals}) per step, "
                             f"got {a.dtype} of shape {tuple(a.shape)}")
        grid = self._grid.to(idx.device)
        values = grid.gather(1, idx.reshape(-1, d).T).T.reshape(idx.shape)
        td.set(key, values.to(self._dtype))
        return td

    def transform_action_spec(self, spec: Composite) -> Composite:
        key = self.in_keys_inv[0]
        if key not in spec:
            return spec
        leaf = _finite_box(spec[key], key, "ActionDiscretizer")
        low, high = leaf.low.reshape(-1, leaf.shape[-1])[0], leaf.high.reshape(-1, leaf.shape[-1])[0]
        n = self.num_intervals
        steps = (torch.linspace(0.0, 1.0, n, dtype=torch.float64) if self.sampling == "endpoints"
                 else (torch.arange(n, dtype=torch.float64) + _OFFSETS[self.sampling]) / n)
        self._grid = (low.double()[:, None] + steps[None] * (high.double() - low.double())[:, None]).to(leaf.dtype)
        self._dtype = leaf.dtype
        d, batch = leaf.shape[-1], leaf.shape[:-1]
        if d == 1:
            spec[key] = (Categorical(n, batch, leaf.device) if self.categorical
                         else OneHot(n, (*batch, n), leaf.device))
        else:
            spec[key] = (MultiCategorical([n] * d, (*batch, d), leaf.device) if self.categorical
                         else MultiOneHot([n] * d, (*batch, n * d), leaf.device))
        return spec

    def extra_repr(self) -> str:
        return f"num_intervals={self.num_intervals}, categorical={self.categorical}, sampling={self.sampling!r}"


class FlattenAction(Transform):
    """The policy acts in a flattened action space (TorchRL's ``FlattenAction``): the action
    dims ``first_dim .. last_dim`` (negative, from the end) of the base env's action are one
    dim for the policy, and ``step`` restores the base shape before the base env reads it.

    Args:
        first_dim, last_dim: negative dims of the action to flatten (default ``-2, -1``).
        in_keys_inv: action keys (default ``["action"]``).
    """

    def __init__(self, first_dim: int = -2, last_dim: int = -1, in_keys_inv: Sequence | str | None = None) -> None:
        if first_dim >= 0 or last_dim >= 0 or first_dim > last_dim:
            raise ValueError(f"FlattenAction needs negative first_dim <= last_dim, got {first_dim}, {last_dim}.")
        super().__init__([], [], in_keys_inv or [ACTION])
        self.first_dim, self.last_dim = int(first_dim), int(last_dim)
        self._span: dict = {}  # action key -> the base shape of the flattened dims

    def inv(self, td):
        for k_in, k_out in zip(self.in_keys_inv, self.out_keys_inv, strict=True):
            a = td.get(k_out, None)
            if a is None:
                continue
            span = self._span[k_in]
            after = -self.last_dim - 1  # dims after the span
            lead = a.shape[: a.ndim - 1 - after]
            td.set(k_in, a.reshape(*lead, *span, *a.shape[a.ndim - after:]))
        return td

    def transform_action_spec(self, spec: Composite) -> Composite:
        for k_in, k_out in zip(self.in_keys_inv, self.out_keys_inv, strict=True):
            if k_in not in spec:
                continue
            leaf = spec[k_in]
            if -self.first_dim > len(leaf.shape):
                raise ValueError(f"FlattenAction({self.first_dim}, {self.last_dim}) on an action of shape {tuple(leaf.shape)}")
            self._span[k_in] = tuple(leaf.shape[self.first_dim:len(leaf.shape) + self.last_dim + 1])
            flat = lambda x: x.flatten(self.first_dim, self.last_dim)  # noqa: E731
            shape = flat(torch.empty(leaf.shape, device="meta")).shape
            if isinstance(leaf, Bounded):
                spec[k_out] = Bounded(flat(leaf.low), flat(leaf.high), shape, leaf.device, leaf.dtype)
            else:
                spec[k_out] = Unbounded(shape, leaf.device, leaf.dtype)
        return spec

    def extra_repr(self) -> str:
        return f"first_dim={self.first_dim}, last_dim={self.last_dim}"
