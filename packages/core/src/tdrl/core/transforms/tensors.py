"""Tensor-shaping transforms: dtype casting (``DTypeCastTransform``, ``DoubleToFloat``),
key concatenation (``CatTensors``), frame stacking (``CatFrames``) and the max over recent
values (``TimeMaxPool``)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tensordict import TensorDictBase

from ..keys import OBSERVATION
from ..specs import Bounded, Composite, Unbounded
from ..specs._base import TensorSpec
from .base import DictReset, DictStep, Transform, overrides, str_keys

__all__ = ["DTypeCastTransform", "DoubleToFloat", "CatTensors", "CatFrames", "TimeMaxPool"]


def _with_dtype(leaf: TensorSpec, dtype: torch.dtype) -> TensorSpec:
    if isinstance(leaf, Bounded):
        return Bounded(leaf.low.to(dtype), leaf.high.to(dtype), leaf.shape, leaf.device, dtype)
    if isinstance(leaf, Unbounded):
        return Unbounded(leaf.shape, leaf.device, dtype)
    out = leaf.clone()
    out.dtype = dtype
    return out


class DTypeCastTransform(Transform):
    """Cast entries from ``dtype_in`` to ``dtype_out`` (and actions back on the way in).

    Args:
        dtype_in: the dtype the base env produces / expects.
        dtype_out: the dtype the user sees.
        in_keys: keys to cast in outputs (``None``: every observation and reward leaf of
            dtype ``dtype_in``, found from the specs).
        in_keys_inv: input keys (actions, state) to cast from ``dtype_out`` back to
            ``dtype_in`` (``None``: every action and state leaf of dtype ``dtype_in``).
    """

    def __init__(
        self,
        dtype_in: torch.dtype,
        dtype_out: torch.dtype,
        in_keys: Sequence | str | None = None,
        in_keys_inv: Sequence | str | None = None,
    ) -> None:
        self._auto_keys = in_keys is None
        self._auto_keys_inv = in_keys_inv is None
        super().__init__(in_keys, None, in_keys_inv, None)
        self.dtype_in = dtype_in
        self.dtype_out = dtype_out

    def _apply_transform(self, x):
        return x.to(self.dtype_out) if x.dtype == self.dtype_in else x

    def _inv_apply_transform(self, x):
        return x.to(self.dtype_in) if x.dtype == self.dtype_out else x

    def dict_step(self, batch_size, device) -> DictStep | None:
        """``_step`` (its ``_call``: the cast) on plain dicts, string keys only; it never
        changes the done flags."""
        if (overrides(self, DTypeCastTransform, "_step", "_call", "_apply_transform")
                or not str_keys(self.in_keys, self.out_keys)):
            return Transform.dict_step(self, batch_size, device)  # the ordinary body, adapted
        call = self._call

        def fn(root: dict, nxt: dict) -> None:
            call(nxt)

        return fn, True

    def dict_reset(self, batch_size, device) -> DictReset | None:
        """The cast of ``_reset`` (``_call`` of the reset output) on plain dicts."""
        if (overrides(self, DTypeCastTransform, "_reset", "_step", "_call", "_apply_transform")
                or not str_keys(self.in_keys, self.out_keys)):
            return Transform.dict_reset(self, batch_size, device)  # the ordinary body, adapted
        return self.dict_step(batch_size, device)[0]

    def _cast_spec(self, spec: Composite, keys_attr: str, auto: bool) -> Composite:
        keys = getattr(self, keys_attr)
        if auto:
            found = [k for k, v in spec.items(True, True) if v.dtype == self.dtype_in]
            keys = list(dict.fromkeys([*keys, *found]))
            setattr(self, keys_attr, keys)
            if keys_attr == "in_keys":
                self.out_keys = list(keys)
            else:
                self.out_keys_inv = list(keys)
        for k in keys:
            if k in spec and spec[k].dtype == self.dtype_in:
                spec[k] = _with_dtype(spec[k], self.dtype_out)
        return spec

    def transform_observation_spec(self, spec):
        return self._cast_spec(spec, "in_keys", self._auto_keys)

    def transform_reward_spec(self, spec):
        return self._cast_spec(spec, "in_keys", self._auto_keys)

    def transform_action_spec(self, spec):
        return self._cast_spec(spec, "in_keys_inv", self._auto_keys_inv)

    def transform_state_spec(self, spec):
        # state inputs (e.g. a simulator state carried in the data) are cast for the user
        # and cast back on their way into the base env, like actions
        return self._cast_spec(spec, "in_keys_inv", self._auto_keys_inv)

    def extra_repr(self) -> str:
        return f"{self.dtype_in} -> {self.dtype_out}, in_keys={self.in_keys}"


class DoubleToFloat(DTypeCastTransform):
    """Cast float64 observations/rewards to float32 (and float32 actions back to float64).

    MuJoCo tasks produce float64 observations; most policies run in float32.
    """

    def __init__(self, in_keys=None, in_keys_inv=None) -> None:
        super().__init__(torch.float64, torch.float32, in_keys, in_keys_inv)


class CatTensors(Transform):
    """Concatenate several keys into one along ``dim``.

    Args:
        in_keys: keys to concatenate, in order.
        out_key: the new key (default ``"observation_vector"``, as TorchRL).
        dim: concatenation dim, negative (counted from the end of each entry).
        del_keys: remove the input keys from data and specs.
    """

    def __init__(
        self,
        in_keys: Sequence,
        out_key: str | tuple = "observation_vector",
        dim: int = -1,
        del_keys: bool = True,
    ) -> None:
        if dim >= 0:
            raise ValueError(f"CatTensors needs a negative dim (from the end), got {dim}.")
        super().__init__(list(in_keys))
        self.out_keys = [out_key]
        self.out_key = out_key
        self.dim = dim
        self.del_keys = del_keys

    def _call(self, td: TensorDictBase) -> TensorDictBase:
        vals = [td.get(k, None) for k in self.in_keys]
        if all(v is None for v in vals):
            return td
        missing = [k for k, v in zip(self.in_keys, vals, strict=True) if v is None]
        if missing:
            raise KeyError(f"CatTensors: keys {missing} missing; it concatenates {self.in_keys}.")
        td.set(self.out_key, torch.cat(vals, self.dim))
        if self.del_keys:
            for k in self.in_keys:
                if k != self.out_key:
                    del td[k]
        return td

    def transform_observation_spec(self, spec: Composite) -> Composite:
        leaves = [spec[k] for k in self.in_keys if k in spec]
        if not leaves:
            return spec
        if len(leaves) != len(self.in_keys):
            raise KeyError(f"CatTensors: some of {self.in_keys} are not in the observation spec "
                           f"{spec.keys(True, True)}.")
        shape = list(leaves[0].shape)
        shape[self.dim] = sum(leaf.shape[self.dim] for leaf in leaves)
        dtype = leaves[0].dtype
        if all(isinstance(leaf, Bounded) for leaf in leaves):
            new = Bounded(torch.cat([leaf.low for leaf in leaves], self.dim),
                          torch.cat([leaf.high for leaf in leaves], self.dim), shape,
                          spec.device, dtype)
        else:
            new = Unbounded(shape, spec.device, dtype)
        if self.del_keys:
            for k in self.in_keys:
                del spec[k]
        spec[self.out_key] = new
        return spec

    def extra_repr(self) -> str:
        return f"in_keys={self.in_keys}, out_key={self.out_key!r}, dim={self.dim}"


class CatFrames(Transform):
    """Stack the last ``N`` frames of a key along ``dim`` (frame stacking).

    The stacked value lives in the data itself (at ``out_keys``, in place by default), so
    partial resets, batched envs and replay buffers need no hidden state: a step builds the
    new stack from the previous root value without its oldest frame plus the new frame.
    After a reset the first frame is repeated ``N`` times (``padding="same"``) or padded
    with zeros (``padding="constant"``).

    Args:
        N: number of frames.
        dim: negative dim of each frame along which frames are concatenated
            (``-1`` for vectors, ``-3`` for ``C, H, W`` images).
        in_keys: keys to stack (default ``["observation"]``).
        out_keys: where to write (default: in place).
        padding: ``"same"`` or ``"constant"``.
    """

    def __init__(
        self,
        N: int,
        dim: int = -1,
        in_keys: Sequence | str | None = None,
        out_keys: Sequence | str | None = None,
        padding: str = "same",
    ) -> None:
        if dim >= 0:
            raise ValueError(f"CatFrames needs a negative dim, got {dim}.")
        if padding not in ("same", "constant"):
            raise ValueError(f"padding must be 'same' or 'constant', got {padding!r}.")
        super().__init__(in_keys or [OBSERVATION], out_keys)
        self.N = int(N)
        self.dim = dim
        self.padding = padding

    def _reset(self, td, td_reset):
        for k_in, k_out in zip(self.in_keys, self.out_keys, strict=True):
            x = td_reset.get(k_in, None)
            if x is None:
                continue
            if self.padding == "same":
                frames = [x] * self.N
            else:
                frames = [torch.zeros_like(x)] * (self.N - 1) + [x]
            td_reset.set(k_out, torch.cat(frames, self.dim))
        return td_reset

    def _step(self, td, next_td):
        for k_in, k_out in zip(self.in_keys, self.out_keys, strict=True):
            x = next_td.get(k_in, None)
            if x is None:
                continue
            prev = td.get(k_out, None)
            if prev is None:
                raise KeyError(
                    f"CatFrames: the step input has no stacked {k_out!r}; start from reset()."
                )
            size = x.shape[self.dim]
            kept = prev.narrow(self.dim, size, prev.shape[self.dim] - size)
            next_td.set(k_out, torch.cat([kept, x], self.dim))
        return next_td

    def _call(self, td):
        return td

    def transform_observation_spec(self, spec: Composite) -> Composite:
        for k_in, k_out in zip(self.in_keys, self.out_keys, strict=True):
            if k_in not in spec:
                continue
            leaf = spec[k_in]
            shape = list(leaf.shape)
            shape[self.dim] *= self.N
            if isinstance(leaf, Bounded):
                low = torch.cat([leaf.low] * self.N, self.dim)
                high = torch.cat([leaf.high] * self.N, self.dim)
                if self.padding == "constant":
                    low, high = low.clamp_max(0), high.clamp_min(0)
                spec[k_out] = Bounded(low, high, shape, leaf.device, leaf.dtype)
            else:
                spec[k_out] = Unbounded(shape, leaf.device, leaf.dtype)
        return spec

    def transform_state_spec(self, spec: Composite) -> Composite:
        return spec

    def extra_repr(self) -> str:
        return f"N={self.N}, dim={self.dim}, in_keys={self.in_keys}, padding={self.padding!r}"


class TimeMaxPool(Transform):
    """The element-wise maximum of each key over its last ``T`` values (TorchRL's
    ``TimeMaxPool``; Atari's max over the last two frames against flicker).

    The last ``T`` raw values are held per sub-env; a (partial) reset fills the reset rows'
    history with their first value, so the first output is that value itself.

    Args:
        in_keys, out_keys: keys (default ``["observation"]``; out: in place).
        T: the window (>= 1).
    """

    def __init__(self, in_keys: Sequence | str | None = None, out_keys: Sequence | str | None = None,
                 T: int = 1) -> None:
        if int(T) < 1:
            raise ValueError(f"TimeMaxPool needs T >= 1, got {T}.")
        super().__init__(in_keys or [OBSERVATION], out_keys)
        self.T = int(T)
        self._history: dict = {}  # key -> [T, *batch, *value]

    def _pool(self, key, x, rows):
        hist = self._history.get(key)
        if hist is None or hist.shape[1:] != x.shape or rows is None:
            hist = x.unsqueeze(0).repeat(self.T, *([1] * x.ndim))
        elif rows is not False:  # a partial reset: the reset rows restart their history
            hist[:, rows] = x[rows].unsqueeze(0)
        else:
            hist = torch.cat([hist[1:], x.unsqueeze(0)], 0)
        self._history[key] = hist
        return hist.max(0).values

    def _reset(self, td, td_reset):
        mask = td.get("_reset", None) if td is not None else None
        for k_in, k_out in zip(self.in_keys, self.out_keys, strict=True):
            x = td_reset.get(k_in, None)
            if x is None:
                continue
            rows = None  # a full reset
            if mask is not None and self.parent is not None and len(self.parent.batch_size):
                rows = mask.reshape(mask.shape[:len(self.parent.batch_size)]).bool()
            td_reset.set(k_out, self._pool(k_in, x, rows))
        return td_reset

    def _step(self, td, next_td):
        for k_in, k_out in zip(self.in_keys, self.out_keys, strict=True):
            x = next_td.get(k_in, None)
            if x is not None:
                next_td.set(k_out, self._pool(k_in, x, False))
        return next_td

    def _call(self, td):
        return td

    def extra_repr(self) -> str:
        return f"T={self.T}, in_keys={self.in_keys}"
