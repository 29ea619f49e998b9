"""Normalisation transforms: ``ObservationNorm`` (fixed statistics), ``VecNorm`` (running
statistics) and ``RewardScaling``."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tensordict import TensorDictBase

from ..keys import OBSERVATION, REWARD
from ..specs import Bounded, Composite, Unbounded
from .base import DictReset, DictStep, Transform, overrides, str_keys

__all__ = ["ObservationNorm", "VecNorm", "RewardScaling"]


def _reset_mask(td: TensorDictBase | None, n_batch: int) -> torch.Tensor | None:
    """The ``"_reset"`` mask reshaped to the batch shape, or ``None`` (full reset)."""
    if td is None:
        return None
    mask = td.get("_reset", None)
    if mask is None:
        return None
    return mask.reshape(mask.shape[:n_batch]).bool()


class _ResizingBuffers:
    """Let ``load_state_dict`` replace buffers whose shape is not known until data is seen."""

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        for name, buf in list(self._buffers.items()):
            key = prefix + name
            if key in state_dict and (buf is None or buf.shape != state_dict[key].shape):
                self._buffers[name] = torch.empty_like(state_dict[key])
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


class ObservationNorm(_ResizingBuffers, Transform):
    """Affine normalisation with fixed statistics (TorchRL semantics).

    ``standard_normal=False`` (TorchRL's default): ``obs * scale + loc``;
    ``standard_normal=True``: ``(obs - loc) / scale``.

    Args:
        loc: location, broadcastable to the observation (``None``: set by ``init_stats``).
        scale: scale, idem.
        in_keys: keys to normalise (default ``["observation"]``).
        out_keys: where to write (default: in place).
        standard_normal: see above.
        eps: added to ``scale`` when dividing.

    Until ``loc``/``scale`` are set the transform is the identity. ``loc`` and ``scale`` are
    buffers, saved in ``state_dict``.
    """

    def __init__(
        self,
        loc: float | torch.Tensor | None = None,
        scale: float | torch.Tensor | None = None,
        in_keys: Sequence | str | None = None,
        out_keys: Sequence | str | None = None,
        standard_normal: bool = False,
        eps: float = 1e-6,
    ) -> None:
        super().__init__(in_keys or [OBSERVATION], out_keys)
        self.standard_normal = standard_normal
        self.eps = eps
        self.register_buffer("loc", torch.as_tensor(loc, dtype=torch.float32) if loc is not None
                             else torch.empty(0))
        self.register_buffer("scale", torch.as_tensor(scale, dtype=torch.float32)
                             if scale is not None else torch.empty(0))

    @property
    def initialized(self) -> bool:
        return self.loc.numel() > 0 and self.scale.numel() > 0

    def _apply_transform(self, x: torch.Tensor) -> torch.Tensor:
        if not self.initialized:
            return x
        loc = self.loc.to(device=x.device, dtype=x.dtype)
        scale = self.scale.to(device=x.device, dtype=x.dtype)
        if self.standard_normal:
            return (x - loc) / (scale + self.eps)
        return x * scale + loc

    def init_stats(self, num_iter: int, reduce_dim: int | Sequence[int] = 0,
                   key=None) -> None:
        """Set ``loc``/``scale`` from ``num_iter`` random steps of the parent env.

        The statistics are taken over the rollout's batch and time dims (``reduce_dim``
        counts from the rollout's first dim, after flattening batch and time into one), so
        that after the transform the observations have mean 0 and std 1.
        """
        env = self.parent
        if env is None:
            raise RuntimeError("init_stats needs the transform to be inside a TransformedEnv.")
        key = key or self.in_keys[0]
        self.loc, self.scale = torch.empty(0), torch.empty(0)
        data = env.rollout(num_iter, break_when_any_done=False).get(key)
        flat = data.reshape(-1, *data.shape[len(env.batch_size) + 1 :]).float()
        mean, std = flat.mean(0), flat.std(0).clamp_min(self.eps)
        if self.standard_normal:
            self.loc, self.scale = mean, std
        else:
            self.loc, self.scale = -mean / std, 1.0 / std
        env._refresh_specs()

    def transform_observation_spec(self, spec: Composite) -> Composite:
        for k_in, k_out in zip(self.in_keys, self.out_keys, strict=True):
            if k_in not in spec:
                continue
            leaf = spec[k_in]
            if self.initialized and isinstance(leaf, Bounded):
                a = self._apply_transform(leaf.low)
                b = self._apply_transform(leaf.high)
                spec[k_out] = Bounded(torch.minimum(a, b), torch.maximum(a, b), leaf.shape,
                                      leaf.device, leaf.dtype)
            elif self.initialized:
                spec[k_out] = Unbounded(leaf.shape, leaf.device, leaf.dtype)
            else:
                spec[k_out] = leaf.clone()
        return spec


class VecNorm(_ResizingBuffers, Transform):
    """Normalise keys with running mean and variance: ``(x - mean) / sqrt(var + eps)``.

    Statistics are updated with every step output and every reset output (only the rows
    that reset), by exact parallel (Chan et al.) mean/variance updates in float64; they are
    buffers (``mean_i``, ``var_i``, ``count_i`` for the ``i``-th key) saved in ``state_dict``.
    ``freeze()`` stops the updates (evaluation), ``unfreeze()`` resumes them; so does evaluation
    mode (``.eval()`` / ``.train()``, also through ``env.eval()`` on the ``TransformedEnv``, as
    TorchRL's ``VecNormV2``): the statistics are updated only when unfrozen and training.

    Args:
        in_keys: keys to normalise (default ``["observation"]``); a reward key works too.
        out_keys: where to write (default: in place).
        eps: added to the variance (TorchRL's ``eps`` is a floor on the standard deviation
            instead: ``eps=1e-2`` there is ``std >= 0.01``, here ``sqrt(var + 0.01)``).
        clip: clip normalised values to ``[-clip, clip]`` (``None``: no clipping).
        decay: the weight the statistics so far keep at each update (TorchRL's ``decay``:
            sums and counts decay geometrically); ``1.0`` (default) keeps exact running statistics.
    """

    def __init__(
        self,
        in_keys: Sequence | str | None = None,
        out_keys: Sequence | str | None = None,
        eps: float = 1e-8,
        clip: float | None = None,
        decay: float = 1.0,
    ) -> None:
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"VecNorm: decay must be in (0, 1], got {decay}")
        super().__init__(in_keys or [OBSERVATION], out_keys)
        self.eps = eps
        self.clip = clip
        self.decay = float(decay)
        self.frozen = False
        for i in range(len(self.in_keys)):
            self.register_buffer(f"mean_{i}", torch.empty(0, dtype=torch.float64))
            self.register_buffer(f"var_{i}", torch.empty(0, dtype=torch.float64))
            self.register_buffer(f"count_{i}", torch.zeros((), dtype=torch.float64))

    def freeze(self) -> VecNorm:
        self.frozen = True
        return self

    def unfreeze(self) -> VecNorm:
        self.frozen = False
        return self

    def _n_batch(self, x: torch.Tensor, i: int) -> int:
        mean = getattr(self, f"mean_{i}")
        if mean.numel():
            return x.ndim - mean.ndim
        env = self.parent
        return len(env.batch_size) if env is not None else x.ndim - 1

    def _update(self, i: int, x: torch.Tensor, n_batch: int) -> None:
        flat = x.detach().reshape(-1, *x.shape[n_batch:]).double()
        m = flat.shape[0]
        if m == 0:
            return
        mean, var, count = (getattr(self, f"{n}_{i}") for n in ("mean", "var", "count"))
        if mean.numel() and mean.device != flat.device:
            flat = flat.to(mean.device)
        b_mean = flat.mean(0)
        b_var = flat.var(0, unbiased=False)
        if mean.numel() == 0:
            new_mean, new_var, new_count = b_mean, b_var, torch.tensor(float(m), dtype=torch.float64)
        else:
            count = count * self.decay  # the old statistics' weight (1.0: exact running statistics)
            tot = count + m
            delta = b_mean - mean
            new_mean = mean + delta * (m / tot)
            new_var = (var * count + b_var * m + delta.pow(2) * count * m / tot) / tot
            new_count = tot
        # statistics live where the data first came from (CPU or GPU)
        setattr(self, f"mean_{i}", new_mean)
        setattr(self, f"var_{i}", new_var)
        setattr(self, f"count_{i}", new_count.to(new_mean.device))

    def _normalize(self, i: int, x: torch.Tensor) -> torch.Tensor:
        mean, var = getattr(self, f"mean_{i}"), getattr(self, f"var_{i}")
        if mean.numel() == 0:
            return x
        out = (x - mean.to(x.device, x.dtype)) / (var + self.eps).sqrt().to(x.device, x.dtype)
        if self.clip is not None:
            out = out.clamp(-self.clip, self.clip)
        return out

    def _process(self, td: TensorDictBase | dict, rows: torch.Tensor | None, update: bool):
        """Update (unless frozen) and normalise ``td``'s entries in place; ``rows`` limits
        the update to reset rows. ``td`` is a TensorDict or a plain dict (the dict hooks)."""
        for i, (k_in, k_out) in enumerate(zip(self.in_keys, self.out_keys, strict=True)):
            x = td.get(k_in, None)
            if x is None:
                continue
            if update and not self.frozen and self.training:
                n_batch = self._n_batch(x, i)
                self._update(i, x if rows is None else x[rows], n_batch if rows is None
                             else 1)
            td[k_out] = self._normalize(i, x)
        return td

    def _call(self, td):
        return self._process(td, None, update=False)

    def _step(self, td, next_td):
        return self._process(next_td, None, update=True)

    def _reset(self, td, td_reset):
        env = self.parent
        rows = _reset_mask(td, len(env.batch_size)) if env is not None else None
        return self._process(td_reset, rows, update=True)

    def dict_step(self, batch_size, device) -> DictStep | None:
        """``_step`` (update the statistics unless frozen, then normalise) on plain dicts."""
        if (overrides(self, VecNorm, "_step", "_process", "_update", "_normalize")
                or not str_keys(self.in_keys, self.out_keys)):
            return Transform.dict_step(self, batch_size, device)  # the ordinary body, adapted

        def fn(root: dict, nxt: dict) -> None:
            self._process(nxt, None, update=True)

        return fn, True

    def dict_reset(self, batch_size, device) -> DictReset | None:
        """``_reset`` (update on the reset rows unless frozen, then normalise) on plain dicts."""
        if (overrides(self, VecNorm, "_reset", "_process", "_update", "_normalize")
                or not str_keys(self.in_keys, self.out_keys)):
            return Transform.dict_reset(self, batch_size, device)  # the ordinary body, adapted
        n = len(batch_size)

        def fn(root: dict, out: dict) -> None:
            self._process(out, _reset_mask(root, n), update=True)

        return fn

    def _spec(self, spec: Composite) -> Composite:
        for k_in, k_out in zip(self.in_keys, self.out_keys, strict=True):
            if k_in in spec:
                leaf = spec[k_in]
                spec[k_out] = Unbounded(leaf.shape, leaf.device, leaf.dtype)
        return spec

    transform_observation_spec = _spec
    transform_reward_spec = _spec

    def extra_repr(self) -> str:
        return f"in_keys={self.in_keys}, frozen={self.frozen}, training={self.training}, clip={self.clip}"


class RewardScaling(Transform):
    """Affine reward transform: ``reward * scale + loc`` (``(reward - loc) / scale`` with
    ``standard_normal=True``), TorchRL semantics.

    Args:
        loc: offset.
        scale: multiplier (divisor with ``standard_normal``).
        in_keys: reward keys (default ``["reward"]``).
        standard_normal: see above.
    """

    def __init__(
        self,
        loc: float | torch.Tensor = 0.0,
        scale: float | torch.Tensor = 1.0,
        in_keys: Sequence | str | None = None,
        standard_normal: bool = False,
    ) -> None:
        super().__init__(in_keys or [REWARD])
        self.register_buffer("loc", torch.as_tensor(loc, dtype=torch.float32))
        self.register_buffer("scale", torch.as_tensor(scale, dtype=torch.float32))
        self.standard_normal = standard_normal

    def _apply_transform(self, r: torch.Tensor) -> torch.Tensor:
        loc = self.loc.to(device=r.device, dtype=r.dtype)
        scale = self.scale.to(device=r.device, dtype=r.dtype)
        if self.standard_normal:
            return (r - loc) / scale
        return r * scale + loc

    def _reset(self, td, td_reset):
        return td_reset

    def transform_reward_spec(self, spec: Composite) -> Composite:
        for k in self.in_keys:
            if k in spec:
                leaf = spec[k]
                spec[k] = Unbounded(leaf.shape, leaf.device, leaf.dtype)
        return spec
