"""Key bookkeeping: ``RenameTransform``, ``ExcludeTransform``, ``SelectTransform`` and
``TensorDictPrimer`` (entries an env does not produce, e.g. a recurrent hidden state)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tensordict import TensorDictBase

from ..envs.common import RESET_KEY
from ..specs import Composite
from ..specs._base import TensorSpec
from .base import Transform

__all__ = ["RenameTransform", "ExcludeTransform", "SelectTransform", "TensorDictPrimer"]


def _move_spec(spec: Composite, pairs, keep: bool) -> Composite:
    for k_in, k_out in pairs:
        if k_in in spec:
            spec[k_out] = spec[k_in].clone()
            if not keep and k_out != k_in:
                del spec[k_in]
    return spec


def _move_entries(td: TensorDictBase, pairs, keep: bool) -> TensorDictBase:
    """``td`` with the entry ``src`` of each ``(src, dst)`` pair set under ``dst`` (``src``
    removed unless ``keep``); missing entries are skipped."""
    for src, dst in pairs:
        val = td.get(src, None)
        if val is not None:
            td.set(dst, val)
            if not keep and dst != src:
                del td[src]
    return td


class RenameTransform(Transform):
    """Rename entries: ``in_keys[i]`` becomes ``out_keys[i]`` (observations or rewards), and
    the user's ``out_keys_inv[i]`` becomes the base env's ``in_keys_inv[i]`` (actions).

    Args:
        in_keys: keys produced by the base env.
        out_keys: their new names.
        in_keys_inv: keys the base env reads (e.g. ``["action"]``).
        out_keys_inv: the names the user writes them under.
        create_copy: keep the old entries beside the new ones.
    """

    def __init__(self, in_keys: Sequence, out_keys: Sequence, in_keys_inv: Sequence | None = None,
                 out_keys_inv: Sequence | None = None, create_copy: bool = False) -> None:
        super().__init__(in_keys, out_keys, in_keys_inv, out_keys_inv)
        if len(self.in_keys_inv) != len(self.out_keys_inv):
            raise ValueError(f"RenameTransform: in_keys_inv {self.in_keys_inv} and out_keys_inv "
                             f"{self.out_keys_inv} must have the same length.")
        self.create_copy = create_copy

    def _call(self, td: TensorDictBase) -> TensorDictBase:
        return _move_entries(td, self._pairs(), self.create_copy)

    def inv(self, td: TensorDictBase) -> TensorDictBase:
        # the user's out_keys_inv[i] goes back to the base env's in_keys_inv[i]
        return _move_entries(td, zip(self.out_keys_inv, self.in_keys_inv, strict=True), self.create_copy)

    def _pairs(self):
        return list(zip(self.in_keys, self.out_keys, strict=True))

    def transform_observation_spec(self, spec):
        return _move_spec(spec, self._pairs(), self.create_copy)

    def transform_reward_spec(self, spec):
        return _move_spec(spec, self._pairs(), self.create_copy)

    def transform_action_spec(self, spec):
        return _move_spec(spec, zip(self.in_keys_inv, self.out_keys_inv, strict=True), self.create_copy)


class ExcludeTransform(Transform):
    """Remove entries from every output (reset and step) and from the observation spec.

    Args:
        *excluded_keys: the keys to drop.
    """

    def __init__(self, *excluded_keys) -> None:
        if len(excluded_keys) == 1 and isinstance(excluded_keys[0], list):
            excluded_keys = tuple(excluded_keys[0])
        super().__init__()
        self.excluded_keys = list(excluded_keys)

    def _call(self, td: TensorDictBase) -> TensorDictBase:
        for k in self.excluded_keys:
            if k in td.keys(True):
                del td[k]
        return td

    def transform_observation_spec(self, spec):
        for k in self.excluded_keys:
            if k in spec:
                del spec[k]
        return spec

    def extra_repr(self) -> str:
        return f"excluded_keys={self.excluded_keys}"


class SelectTransform(Transform):
    """Keep only the listed entries in every output (and in the observation spec).

    Rewards, done flags (``keep_rewards`` / ``keep_dones``) and the env's state and action
    entries are always kept, so the env can still be stepped (as TorchRL).

    Args:
        *selected_keys: the observation keys to keep.
        keep_rewards, keep_dones: also keep the reward / done entries.
    """

    def __init__(self, *selected_keys, keep_rewards: bool = True, keep_dones: bool = True) -> None:
        if len(selected_keys) == 1 and isinstance(selected_keys[0], list):
            selected_keys = tuple(selected_keys[0])
        super().__init__()
        self.selected_keys = list(selected_keys)
        self.keep_rewards = keep_rewards
        self.keep_dones = keep_dones

    def _kept(self) -> list:
        keep = [*self.selected_keys, RESET_KEY]
        env = self.parent
        if env is not None:
            base = env.base_env
            keep += base.full_state_spec.keys(True, True) + base.full_action_spec.keys(True, True)
            if self.keep_rewards:
                keep += base.full_reward_spec.keys(True, True)
            if self.keep_dones:
                keep += base.full_done_spec.keys(True, True)
        return keep

    def _call(self, td: TensorDictBase) -> TensorDictBase:
        return td.select(*self._kept(), strict=False)

    def transform_observation_spec(self, spec):
        kept = self._kept()  # the state entries stay in the data, so in the spec
        for k in list(spec.keys()):
            if k not in kept:
                del spec[k]
        return spec

    def extra_repr(self) -> str:
        return f"selected_keys={self.selected_keys}"


def _batched(spec: TensorSpec | Composite, batch: torch.Size):
    """``spec`` with the env's batch dims in front (unless it already has them)."""
    n = len(batch)
    if isinstance(spec, Composite):
        if tuple(spec.shape[:n]) == tuple(batch):
            return spec
        out = Composite(shape=batch, device=spec.device)
        for k, v in spec.items():
            out[k] = _batched(v, batch)
        return out
    if n and tuple(spec.shape[:n]) == tuple(batch):
        return spec
    return spec.expand(*batch, *spec.shape)


class TensorDictPrimer(Transform):
    """Add entries the env does not produce (a recurrent state, a goal) to the data.

    After a reset each entry is ``default_value`` (or a sample of its spec with
    ``random=True``); a step carries the root's value to ``"next"`` unless something (a
    policy) wrote a new one there. The entries are added to the observation and state specs,
    with the env's batch dims in front of the given shapes.

    Args:
        primers: a ``Composite`` (or a dict) of specs; or give them as keyword arguments.
        random: sample each reset value from its spec.
        default_value: the reset value: a float, or a dict key -> float.
        **kwargs: specs, by key.
    """

    def __init__(self, primers: Composite | dict | None = None, random: bool | None = None,
                 default_value: float | dict = 0.0, **kwargs) -> None:
        specs = dict(primers.items() if primers is not None else ())
        specs.update(kwargs)
        if not specs:
            raise ValueError("TensorDictPrimer needs at least one spec (primers= or key=spec).")
        if random and isinstance(default_value, dict):
            raise ValueError("TensorDictPrimer: give random=True or a default_value dict, not both.")
        super().__init__()
        self.out_keys = list(specs)
        self.primers = specs
        self.random = bool(random)
        self.default_value = default_value

    def _spec(self, key, batch):
        return _batched(self.primers[key], torch.Size(batch))

    def _value(self, key, batch, device):
        spec = self._spec(key, batch)
        if self.random:
            val = spec.rand()
        else:
            fill = (self.default_value.get(key, 0.0) if isinstance(self.default_value, dict)
                    else self.default_value)
            val = spec.zero()
            val = val.fill_(fill) if isinstance(val, torch.Tensor) else val.apply(lambda x: x.fill_(fill))
        return val.to(device) if device is not None else val

    def _reset(self, td, td_reset):
        for k in self.out_keys:
            td_reset.set(k, self._value(k, td_reset.batch_size, td_reset.device))
        return td_reset

    def _step(self, td, next_td):
        for k in self.out_keys:
            if k not in next_td.keys(True):
                prev = td.get(k, None)
                next_td.set(k, prev if prev is not None
                            else self._value(k, next_td.batch_size, next_td.device))
        return next_td

    def _call(self, td):
        return td

    def transform_observation_spec(self, spec):
        for k in self.out_keys:
            spec[k] = self._spec(k, spec.shape).clone()
        return spec

    def transform_state_spec(self, spec):
        return self.transform_observation_spec(spec)

    def extra_repr(self) -> str:
        return f"primers={list(self.primers)}, default_value={self.default_value}"
