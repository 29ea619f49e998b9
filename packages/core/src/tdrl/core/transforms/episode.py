"""Episode bookkeeping: ``RewardSum`` (episode return), ``StepCounter`` (with a time limit
that sets ``truncated``), ``InitTracker`` (``is_init`` flags the first step) and ``TrajCounter``
(an id per trajectory)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tensordict import TensorDictBase

from ..keys import DONE, EPISODE_REWARD, IS_INIT, REWARD, STEP_COUNT, TRUNCATED
from ..specs import Bounded, Categorical, Composite, Unbounded
from .base import DictReset, DictStep, Transform, overrides, str_keys

__all__ = ["RewardSum", "StepCounter", "InitTracker", "TrajCounter"]


def _batch(spec: Composite) -> tuple:
    return tuple(spec.shape)


class RewardSum(Transform):
    """Running sum of the reward over the current episode.

    ``reset`` writes ``episode_reward = 0``; each step writes
    ``next.episode_reward = episode_reward + next.reward``. Partial resets zero only the
    sub-envs that reset.

    Args:
        in_keys: reward keys (default ``["reward"]``).
        out_keys: sum keys (default ``["episode_reward"]``).
    """

    def __init__(self, in_keys: Sequence | str | None = None,
                 out_keys: Sequence | str | None = None) -> None:
        in_keys = in_keys or [REWARD]
        if out_keys is None:
            out_keys = [EPISODE_REWARD] if in_keys == [REWARD] else [
                (*k[:-1], EPISODE_REWARD) if isinstance(k, tuple) else f"episode_{k}"
                for k in ([in_keys] if isinstance(in_keys, str | tuple) else in_keys)
            ]
        super().__init__(in_keys, out_keys)

    def _step(self, td, next_td):
        for k_in, k_out in zip(self.in_keys, self.out_keys, strict=True):
            r = next_td.get(k_in)
            prev = td.get(k_out, None)
            next_td.set(k_out, r if prev is None else prev + r)
        return next_td

    def dict_step(self, batch_size, device) -> DictStep | None:
        """``_step`` on plain dicts: ``next[out] = root[out] + next[in]``."""
        if overrides(self, RewardSum, "_step") or not str_keys(self.in_keys, self.out_keys):
            return Transform.dict_step(self, batch_size, device)  # the ordinary body, adapted
        pairs = list(zip(self.in_keys, self.out_keys, strict=True))

        def fn(root: dict, nxt: dict) -> None:
            for k_in, k_out in pairs:
                r = nxt[k_in]
                prev = root.get(k_out)
                nxt[k_out] = r if prev is None else prev + r

        return fn, True

    def _reset(self, td, td_reset):
        env = self.parent
        for k_in, k_out in zip(self.in_keys, self.out_keys, strict=True):
            spec = env.base_env.full_reward_spec[k_in] if env is not None else None
            if spec is not None:
                td_reset.set(k_out, torch.zeros(spec.shape, dtype=spec.dtype, device=spec.device))
        return td_reset

    def dict_reset(self, batch_size, device) -> DictReset | None:
        """``_reset`` on plain dicts: ``out[out_key] = 0``."""
        if overrides(self, RewardSum, "_reset") or not str_keys(self.in_keys, self.out_keys):
            return Transform.dict_reset(self, batch_size, device)  # the ordinary body, adapted
        env = self.parent
        zeros = [] if env is None else [
            (k_out, env.base_env.full_reward_spec[k_in])
            for k_in, k_out in zip(self.in_keys, self.out_keys, strict=True)
            if env.base_env.full_reward_spec.get(k_in, None) is not None]

        def fn(root: dict, out: dict) -> None:
            for k_out, spec in zeros:
                out[k_out] = torch.zeros(spec.shape, dtype=spec.dtype, device=spec.device)

        return fn

    def _call(self, td):
        return td

    def transform_observation_spec(self, spec: Composite) -> Composite:
        env = self.parent
        for k_in, k_out in zip(self.in_keys, self.out_keys, strict=True):
            shape = (*_batch(spec), 1)
            dtype = torch.float32
            if env is not None and k_in in env.base_env.full_reward_spec:
                leaf = env.base_env.full_reward_spec[k_in]
                shape, dtype = leaf.shape, leaf.dtype
            spec[k_out] = Unbounded(shape, spec.device, dtype)
        return spec


class StepCounter(Transform):
    """Count steps since the last reset; optionally truncate episodes at ``max_steps``.

    ``step_count`` is int64 ``(*batch, 1)``: 0 after reset, +1 per step. When it reaches
    ``max_steps``, ``truncated`` and ``done`` are set (``terminated`` is left alone).

    Args:
        max_steps: time limit (``None``: only count).
        step_count_key: where to write the count.
        truncated_key, done_key: flags to set at the limit.
    """

    def __init__(
        self,
        max_steps: int | None = None,
        step_count_key: str = STEP_COUNT,
        truncated_key: str = TRUNCATED,
        done_key: str = DONE,
    ) -> None:
        if max_steps is not None and max_steps < 1:
            raise ValueError(f"max_steps must be >= 1 or None, got {max_steps}.")
        super().__init__([], [])
        self.max_steps = max_steps
        self.step_count_key = step_count_key
        self.truncated_key = truncated_key
        self.done_key = done_key

    def _zeros(self, td_reset: TensorDictBase) -> torch.Tensor:
        return torch.zeros((*td_reset.batch_size, 1), dtype=torch.int64, device=td_reset.device)

    def _reset(self, td, td_reset):
        td_reset.set(self.step_count_key, self._zeros(td_reset))
        return td_reset

    def dict_reset(self, batch_size, device) -> DictReset | None:
        """``_reset`` on plain dicts: the count restarts at 0."""
        if overrides(self, StepCounter, "_reset", "_zeros") or not isinstance(self.step_count_key, str):
            return Transform.dict_reset(self, batch_size, device)  # the ordinary body, adapted
        key, shape = self.step_count_key, (*batch_size, 1)

        def fn(root: dict, out: dict) -> None:
            out[key] = torch.zeros(shape, dtype=torch.int64, device=device)

        return fn

    def _step(self, td, next_td):
        prev = td.get(self.step_count_key, None)
        if prev is None:
            prev = self._zeros(next_td)
        count = prev + 1
        next_td.set(self.step_count_key, count)
        if self.max_steps is not None:
            hit = count >= self.max_steps
            next_td.set(self.truncated_key, next_td.get(self.truncated_key) | hit)
            next_td.set(self.done_key, next_td.get(self.done_key) | hit)
        return next_td

    def dict_step(self, batch_size, device) -> DictStep | None:
        """``_step`` on plain dicts; with ``max_steps`` it may set the done flags."""
        if overrides(self, StepCounter, "_step", "_zeros") or not str_keys(
                [self.step_count_key, self.truncated_key, self.done_key]):
            return Transform.dict_step(self, batch_size, device)  # the ordinary body, adapted
        key, trunc_key, done_key, limit = (self.step_count_key, self.truncated_key, self.done_key,
                                           self.max_steps)
        shape = (*batch_size, 1)

        def fn(root: dict, nxt: dict) -> None:
            prev = root.get(key)
            if prev is None:
                prev = torch.zeros(shape, dtype=torch.int64, device=device)
            count = prev + 1
            nxt[key] = count
            if limit is not None:
                hit = count >= limit
                nxt[trunc_key] = nxt[trunc_key] | hit
                nxt[done_key] = nxt[done_key] | hit

        return fn, limit is None

    def _call(self, td):
        return td

    def transform_observation_spec(self, spec: Composite) -> Composite:
        high = self.max_steps if self.max_steps is not None else torch.iinfo(torch.int64).max
        spec[self.step_count_key] = Bounded(0, high, (*_batch(spec), 1), spec.device, torch.int64)
        return spec

    def transform_state_spec(self, spec: Composite) -> Composite:
        return self.transform_observation_spec(spec)

    def extra_repr(self) -> str:
        return f"max_steps={self.max_steps}"


class InitTracker(Transform):
    """Write a bool ``is_init`` ``(*batch, 1)``: True on the reset step, False after.

    Recurrent modules read it to reset their hidden state at episode starts.

    Args:
        init_key: the key to write (default ``"is_init"``).
    """

    def __init__(self, init_key: str = IS_INIT) -> None:
        super().__init__([], [])
        self.init_key = init_key

    def _reset(self, td, td_reset):
        self._flag_writer(True, td_reset.batch_size, td_reset.device)(td, td_reset)
        return td_reset

    def _step(self, td, next_td):
        self._flag_writer(False, next_td.batch_size, next_td.device)(td, next_td)
        return next_td

    def dict_step(self, batch_size, device) -> DictStep | None:
        """``_step`` on plain dicts: ``next[init_key]`` all False."""
        if overrides(self, InitTracker, "_step") or not isinstance(self.init_key, str):
            return Transform.dict_step(self, batch_size, device)  # the ordinary body, adapted
        return self._flag_writer(False, batch_size, device), True

    def dict_reset(self, batch_size, device) -> DictReset | None:
        """``_reset`` on plain dicts: ``out[init_key]`` all True."""
        if overrides(self, InitTracker, "_reset") or not isinstance(self.init_key, str):
            return Transform.dict_reset(self, batch_size, device)  # the ordinary body, adapted
        return self._flag_writer(True, batch_size, device)

    def _flag_writer(self, value: bool, batch_size, device) -> DictReset:
        """``fn(root, out)`` writing ``out[init_key]``, a fresh ``(*batch, 1)`` bool tensor of
        ``value``: the one body of ``_step`` / ``_reset`` (``out`` a TensorDict) and of the dict
        hooks (``out`` a plain dict)."""
        key, shape, fill = self.init_key, (*batch_size, 1), torch.ones if value else torch.zeros

        def fn(root: dict, out: dict) -> None:
            out[key] = fill(shape, dtype=torch.bool, device=device)

        return fn

    def _call(self, td):
        return td

    def transform_observation_spec(self, spec: Composite) -> Composite:
        spec[self.init_key] = Categorical(2, (*_batch(spec), 1), spec.device, torch.bool)
        return spec


class TrajCounter(Transform):
    """Number each trajectory: ``traj_count`` (int64 ``(*batch, 1)``) is a new id, counted over
    every sub-env, at each reset, and carried along the steps of the episode.

    The next id lives in a buffer (``state_dict()``), so a resumed run goes on numbering.

    Args:
        out_key: the key to write (default ``"traj_count"``).
    """

    def __init__(self, out_key: str = "traj_count") -> None:
        super().__init__()
        self.out_keys = [out_key]
        self.out_key = out_key
        self.register_buffer("_next_id", torch.zeros((), dtype=torch.int64))

    def _reset(self, td, td_reset):
        shape = (*td_reset.batch_size, 1)
        mask = None if td is None else td.get("_reset", None)
        mask = (torch.ones(shape, dtype=torch.bool, device=td_reset.device) if mask is None
                else mask.reshape(shape).to(td_reset.device))
        start = int(self._next_id)
        ids = start - 1 + mask.flatten().long().cumsum(0)
        ids = torch.where(mask.flatten(), ids, -1).reshape(shape)
        if td is not None and td.get(self.out_key, None) is not None:  # keep the others' ids
            ids = torch.where(mask, ids, td.get(self.out_key).to(td_reset.device))
        self._next_id.fill_(start + int(mask.sum()))
        td_reset.set(self.out_key, ids)
        return td_reset

    def _step(self, td, next_td):
        prev = td.get(self.out_key, None)
        if prev is None:
            raise KeyError(f"TrajCounter: the step input has no {self.out_key!r}; start from reset().")
        next_td.set(self.out_key, prev)
        return next_td

    def _call(self, td):
        return td

    def transform_observation_spec(self, spec: Composite) -> Composite:
        spec[self.out_key] = Unbounded((*_batch(spec), 1), spec.device, torch.int64)
        return spec
