"""Episode bookkeeping: ``RewardSum`` (episode return), ``StepCounter`` (with a time limit
that sets ``truncated``), ``InitTracker`` (``is_init`` flags the first step) and ``TrajCounter``
(an id per trajectory)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..keys import DONE, EPISODE_REWARD, IS_INIT, REWARD, STEP_COUNT, TRUNCATED
from ..specs import Bounded, Categorical, Composite, Unbounded
from .base import DictReset, DictStep, Transform

__all__ = ["RewardSum", "StepCounter", "InitTracker", "TrajCounter"]


def _fill_writer(key, batch_size, device, dtype: torch.dtype, value) -> DictReset:
    """``fn(root, out)`` writing ``out[key]``, a fresh ``(*batch, 1)`` tensor of ``value``
    (``out`` a TensorDict or a plain dict): a count's restart, an init flag."""
    shape = (*batch_size, 1)

    def fn(root, out) -> None:
        out[key] = torch.full(shape, value, dtype=dtype, device=device)

    return fn


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
        self._sum_writer()(td, next_td)
        return next_td

    def dict_step(self, batch_size, device) -> DictStep | None:
        """``_step`` on plain dicts: ``next[out] = root[out] + next[in]``."""
        fn = self._own_hook(RewardSum, "_step", [*self.in_keys, *self.out_keys], self._sum_writer())
        return (fn, True) if fn else Transform.dict_step(self, batch_size, device)

    def _reset(self, td, td_reset):
        self._zero_writer()(td, td_reset)
        return td_reset

    def dict_reset(self, batch_size, device) -> DictReset | None:
        """``_reset`` on plain dicts: ``out[out_key] = 0``."""
        fn = self._own_hook(RewardSum, "_reset", [*self.in_keys, *self.out_keys], self._zero_writer())
        return fn or Transform.dict_reset(self, batch_size, device)

    def _sum_writer(self) -> DictReset:
        """``fn(root, nxt)``: ``nxt[out] = root[out] + nxt[in]`` (the reward alone where the root
        has no sum yet), the one body of ``_step`` (TensorDicts) and of the dict hook."""
        pairs = list(zip(self.in_keys, self.out_keys, strict=True))

        def fn(root, nxt) -> None:
            for k_in, k_out in pairs:
                r = nxt[k_in]
                prev = root.get(k_out, None)
                nxt[k_out] = r if prev is None else prev + r

        return fn

    def _zero_writer(self) -> DictReset:
        """``fn(root, out)``: ``out[out_key] = 0`` in the reward spec's shape and dtype (for the
        rewards the base env's spec has), the one body of ``_reset`` and of the dict hook."""
        env = self.parent
        zeros = [] if env is None else [
            (k_out, env.base_env.full_reward_spec[k_in])
            for k_in, k_out in zip(self.in_keys, self.out_keys, strict=True)
            if env.base_env.full_reward_spec.get(k_in, None) is not None]

        def fn(root, out) -> None:
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

    def _reset(self, td, td_reset):
        start = _fill_writer(self.step_count_key, td_reset.batch_size, td_reset.device, torch.int64, 0)
        start(td, td_reset)
        return td_reset

    def dict_reset(self, batch_size, device) -> DictReset | None:
        """``_reset`` on plain dicts: the count restarts at 0."""
        start = _fill_writer(self.step_count_key, batch_size, device, torch.int64, 0)
        fn = self._own_hook(StepCounter, "_reset", [self.step_count_key], start)
        return fn or Transform.dict_reset(self, batch_size, device)

    def _step(self, td, next_td):
        self._count_step(next_td.batch_size, next_td.device)(td, next_td)
        return next_td

    def dict_step(self, batch_size, device) -> DictStep | None:
        """``_step`` on plain dicts; with ``max_steps`` it may set the done flags."""
        keys = [self.step_count_key, self.truncated_key, self.done_key]
        fn = self._own_hook(StepCounter, "_step", keys, self._count_step(batch_size, device))
        return (fn, self.max_steps is None) if fn else Transform.dict_step(self, batch_size, device)

    def _count_step(self, batch_size, device) -> DictReset:
        """``fn(root, nxt)``: ``nxt[step_count_key] = root's count + 1`` (1 where the root has
        none) and, at ``max_steps``, the truncated and done flags set: the one body of
        ``_step`` (TensorDicts) and of the dict hook."""
        key, trunc_key, done_key, limit = (self.step_count_key, self.truncated_key, self.done_key,
                                           self.max_steps)
        shape = (*batch_size, 1)

        def fn(root, nxt) -> None:
            prev = root.get(key, None)
            if prev is None:
                prev = torch.zeros(shape, dtype=torch.int64, device=device)
            count = prev + 1
            nxt[key] = count
            if limit is not None:
                hit = count >= limit
                nxt[trunc_key] = nxt[trunc_key] | hit
                nxt[done_key] = nxt[done_key] | hit

        return fn

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
        flag = _fill_writer(self.init_key, td_reset.batch_size, td_reset.device, torch.bool, True)
        flag(td, td_reset)
        return td_reset

    def _step(self, td, next_td):
        flag = _fill_writer(self.init_key, next_td.batch_size, next_td.device, torch.bool, False)
        flag(td, next_td)
        return next_td

    def dict_step(self, batch_size, device) -> DictStep | None:
        """``_step`` on plain dicts: ``next[init_key]`` all False."""
        body = _fill_writer(self.init_key, batch_size, device, torch.bool, False)
        fn = self._own_hook(InitTracker, "_step", [self.init_key], body)
        return (fn, True) if fn else Transform.dict_step(self, batch_size, device)

    def dict_reset(self, batch_size, device) -> DictReset | None:
        """``_reset`` on plain dicts: ``out[init_key]`` all True."""
        body = _fill_writer(self.init_key, batch_size, device, torch.bool, True)
        fn = self._own_hook(InitTracker, "_reset", [self.init_key], body)
        return fn or Transform.dict_reset(self, batch_size, device)

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
