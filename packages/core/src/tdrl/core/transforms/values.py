"""Element-wise and shape rewrites of entries: ``ClipTransform``, ``RewardClipping``,
``SignTransform``, ``UnsqueezeTransform``, ``SqueezeTransform``, ``PermuteTransform``,
``FlattenObservation``, ``BinarizeReward``."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..keys import OBSERVATION, REWARD
from ..specs import Bounded, Composite, Unbounded
from ..specs._base import TensorSpec
from .base import Transform

__all__ = ["ClipTransform", "RewardClipping", "SignTransform", "UnsqueezeTransform", "SqueezeTransform",
           "PermuteTransform", "BinarizeReward", "LineariseRewards",
           "FlattenObservation"]


def _bounded_like(leaf: TensorSpec, low, high) -> TensorSpec:
    if isinstance(leaf, Bounded):
        low = leaf.low.clamp_min(low) if low is not None else leaf.low
        high = leaf.high.clamp_max(high) if high is not None else leaf.high
        return Bounded(low, high, leaf.shape, leaf.device, leaf.dtype)
    if low is None or high is None:
        return leaf
    return Bounded(low, high, leaf.shape, leaf.device, leaf.dtype)


class ClipTransform(Transform):
    """Clamp entries to ``[low, high]`` (either may be ``None``); inverse keys are clamped on
    their way into the base env.

    Args:
        in_keys, out_keys: keys clamped in the outputs (observations or rewards).
        in_keys_inv, out_keys_inv: input keys (actions) clamped before the base env.
        low, high: the bounds (a number; ``None``: no bound on that side).
    """

    def __init__(self, in_keys: Sequence | str | None = None, out_keys: Sequence | str | None = None,
                 in_keys_inv: Sequence | str | None = None, out_keys_inv: Sequence | str | None = None,
                 *, low: float | None = None, high: float | None = None) -> None:
        if low is None and high is None:
            raise ValueError("ClipTransform needs low, high or both.")
        if low is not None and high is not None and low > high:
            raise ValueError(f"ClipTransform: low {low} > high {high}.")
        super().__init__(in_keys, out_keys, in_keys_inv, out_keys_inv)
        self.low, self.high = low, high

    def _apply_transform(self, x):
        return x.clamp(self.low, self.high)

    _inv_apply_transform = _apply_transform

    def _spec(self, spec: Composite, pairs) -> Composite:
        for k_in, k_out in pairs:
            if k_in in spec:
                spec[k_out] = _bounded_like(spec[k_in], self.low, self.high)
        return spec

    def transform_observation_spec(self, spec):
        return self._spec(spec, zip(self.in_keys, self.out_keys, strict=True))

    def transform_reward_spec(self, spec):
        return self._spec(spec, zip(self.in_keys, self.out_keys, strict=True))

    def transform_action_spec(self, spec):
        return self._spec(spec, zip(self.in_keys_inv, self.out_keys_inv, strict=True))

    def extra_repr(self) -> str:
        return f"in_keys={self.in_keys}, low={self.low}, high={self.high}"


class RewardClipping(ClipTransform):
    """Clamp the reward to ``[clamp_min, clamp_max]`` (as TorchRL's ``RewardClipping``).

    Args:
        clamp_min, clamp_max: the bounds (``None``: no bound on that side).
        in_keys, out_keys: reward keys (default ``["reward"]``).
    """

    def __init__(self, clamp_min: float | None = None, clamp_max: float | None = None,
                 in_keys: Sequence | str | None = None, out_keys: Sequence | str | None = None) -> None:
        super().__init__(in_keys or [REWARD], out_keys, low=clamp_min, high=clamp_max)

    @property
    def clamp_min(self):
        return self.low

    @property
    def clamp_max(self):
        return self.high

    def transform_observation_spec(self, spec):
        return spec


class SignTransform(Transform):
    """Replace entries by their sign (-1, 0 or 1), e.g. Atari reward clipping.

    Args:
        in_keys, out_keys: the keys (default ``["reward"]``).
    """

    def __init__(self, in_keys: Sequence | str | None = None, out_keys: Sequence | str | None = None) -> None:
        super().__init__(in_keys or [REWARD], out_keys)

    def _apply_transform(self, x):
        return torch.sign(x)

    def _spec(self, spec: Composite) -> Composite:
        for k_in, k_out in zip(self.in_keys, self.out_keys, strict=True):
            if k_in in spec:
                leaf = spec[k_in]
                spec[k_out] = Bounded(-1, 1, leaf.shape, leaf.device, leaf.dtype)
        return spec

    transform_observation_spec = _spec
    transform_reward_spec = _spec


def _reshaped(leaf: TensorSpec, fn) -> TensorSpec:
    shape = fn(torch.empty(leaf.shape, device="meta")).shape
    if isinstance(leaf, Bounded):
        return Bounded(fn(leaf.low), fn(leaf.high), shape, leaf.device, leaf.dtype)
    if isinstance(leaf, Unbounded):
        return Unbounded(shape, leaf.device, leaf.dtype)
    raise TypeError(f"Cannot reshape a {type(leaf).__name__} spec; expected Bounded or Unbounded.")


class _Reshape(Transform):
    """Shared by the shape transforms: ``_apply_transform`` on data and on each spec leaf."""

    def _spec(self, spec: Composite) -> Composite:
        for k_in, k_out in zip(self.in_keys, self.out_keys, strict=True):
            if k_in in spec:
                spec[k_out] = _reshaped(spec[k_in], self._apply_transform)
        return spec

    transform_observation_spec = _spec
    transform_reward_spec = _spec


class UnsqueezeTransform(_Reshape):
    """Insert a dim of size 1 at ``dim`` (negative: counted from the end of each entry, so
    batch dims never move).

    Args:
        dim: a negative dim.
        in_keys, out_keys: keys (default ``["observation"]``).
    """

    def __init__(self, dim: int, in_keys: Sequence | str | None = None,
                 out_keys: Sequence | str | None = None) -> None:
        if dim >= 0:
            raise ValueError(f"UnsqueezeTransform needs a negative dim (from the end), got {dim}; "
                             "a positive dim would depend on the batch size.")
        super().__init__(in_keys or [OBSERVATION], out_keys)
        self.dim = dim

    def _apply_transform(self, x):
        return x.unsqueeze(self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, in_keys={self.in_keys}"


class FlattenObservation(_Reshape):
    """Flatten the dims ``first_dim .. last_dim`` (negative, from the end) into one.

    Args:
        first_dim, last_dim: negative dims (e.g. ``-3, -1`` flattens a ``C, H, W`` image).
        in_keys, out_keys: keys (default ``["observation"]``).
    """

    def __init__(self, first_dim: int, last_dim: int, in_keys: Sequence | str | None = None,
                 out_keys: Sequence | str | None = None) -> None:
        if first_dim >= 0 or last_dim >= 0 or first_dim > last_dim:
            raise ValueError(f"FlattenObservation needs negative first_dim <= last_dim, got "
                             f"{first_dim}, {last_dim}.")
        super().__init__(in_keys or [OBSERVATION], out_keys)
        self.first_dim, self.last_dim = first_dim, last_dim

    def _apply_transform(self, x):
        return x.flatten(self.first_dim, self.last_dim)

    def extra_repr(self) -> str:
        return f"first_dim={self.first_dim}, last_dim={self.last_dim}, in_keys={self.in_keys}"


class SqueezeTransform(_Reshape):
    """Remove a dim of size 1 at ``dim`` (negative, from the end of each entry): the inverse of
    :class:`UnsqueezeTransform` (TorchRL's name).

    Args:
        dim: a negative dim whose size is 1.
        in_keys, out_keys: keys (default ``["observation"]``).
    """

    def __init__(self, dim: int, in_keys: Sequence | str | None = None,
                 out_keys: Sequence | str | None = None) -> None:
        if dim >= 0:
            raise ValueError(f"SqueezeTransform needs a negative dim (from the end), got {dim}.")
        super().__init__(in_keys or [OBSERVATION], out_keys)
        self.dim = dim

    def _apply_transform(self, x):
        if x.shape[self.dim] != 1:
            raise ValueError(f"SqueezeTransform(dim={self.dim}): that dim has size {x.shape[self.dim]}, not 1 "
                             f"(entry of shape {tuple(x.shape)})")
        return x.squeeze(self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, in_keys={self.in_keys}"


class PermuteTransform(_Reshape):
    """Reorder the last ``len(dims)`` dims of each entry: ``dims`` is a permutation of
    ``-len(dims) .. -1`` (TorchRL's convention, so batch dims never move), e.g. ``(-1, -3, -2)``
    turns ``H, W, C`` into ``C, H, W``.

    Args:
        dims: negative dims, a permutation of ``range(-len(dims), 0)``.
        in_keys, out_keys: keys (default ``["observation"]``).
    """

    def __init__(self, dims: Sequence[int], in_keys: Sequence | str | None = None,
                 out_keys: Sequence | str | None = None) -> None:
        dims = tuple(int(d) for d in dims)
        if sorted(dims) != list(range(-len(dims), 0)):
            raise ValueError(f"PermuteTransform needs a permutation of the last dims, -{len(dims)}..-1, got {dims}.")
        super().__init__(in_keys or [OBSERVATION], out_keys)
        self.dims = dims

    def _apply_transform(self, x):
        lead = list(range(x.ndim - len(self.dims)))
        return x.permute(*lead, *(x.ndim + d for d in self.dims))

    def extra_repr(self) -> str:
        return f"dims={self.dims}, in_keys={self.in_keys}"


class BinarizeReward(Transform):
    """Rewards become 1 where positive and 0 elsewhere (TorchRL's ``BinarizeReward``).

    Args:
        in_keys, out_keys: the keys (default ``["reward"]``).
    """

    def __init__(self, in_keys: Sequence | str | None = None, out_keys: Sequence | str | None = None) -> None:
        super().__init__(in_keys or [REWARD], out_keys)

    def _apply_transform(self, x):
        return (x > 0).to(x.dtype)

    def transform_reward_spec(self, spec: Composite) -> Composite:
        for k_in, k_out in zip(self.in_keys, self.out_keys, strict=True):
            if k_in in spec:
                leaf = spec[k_in]
                spec[k_out] = Bounded(0, 1, leaf.shape, leaf.device, leaf.dtype)
        return spec


class LineariseRewards(Transform):
    """A vector of rewards (multi-objective, ``[..., k]``) as one scalar reward ``[..., 1]``: the
    weighted sum with ``weights`` (default all ones; TorchRL's ``LineariseRewards``).

    Args:
        in_keys, out_keys: the reward keys (default ``["reward"]``, in place).
        weights: ``k`` weights (a sequence or tensor).
    """

    def __init__(self, in_keys: Sequence | str | None = None, out_keys: Sequence | str | None = None,
                 weights: Sequence[float] | torch.Tensor | None = None) -> None:
        super().__init__(in_keys or [REWARD], out_keys)
        self.weights = None if weights is None else torch.as_tensor(weights, dtype=torch.float32).flatten()

    def _apply_transform(self, x):
        w = torch.ones(x.shape[-1], dtype=x.dtype, device=x.device) if self.weights is None else self.weights
        if w.numel() != x.shape[-1]:
            raise ValueError(f"LineariseRewards: {w.numel()} weights for a reward of {x.shape[-1]} entries")
        return (x * w.to(x.device, x.dtype)).sum(-1, keepdim=True)

    def transform_reward_spec(self, spec: Composite) -> Composite:
        for k_in, k_out in zip(self.in_keys, self.out_keys, strict=True):
            if k_in in spec:
                leaf = spec[k_in]
                spec[k_out] = Unbounded((*leaf.shape[:-1], 1), leaf.device, leaf.dtype)
        return spec
