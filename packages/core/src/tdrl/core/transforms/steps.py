"""Transforms that change how the base env is stepped or reset: ``FrameSkipTransform``
(repeat an action), ``NoopResetEnv`` (random no-op steps after a reset) and ``ActionMask``
(the env's allowed-action mask kept in its action spec, illegal actions refused)."""

from __future__ import annotations

import torch
from tensordict import TensorDictBase

from ..keys import ACTION, NEXT
from .base import Transform

__all__ = ["FrameSkipTransform", "NoopResetEnv", "ActionMask"]


def _base_env(transform: Transform, name: str):
    env = transform.parent
    if env is None:
        raise RuntimeError(f"{name} steps the base env: put it in a TransformedEnv.")
    return env


class FrameSkipTransform(Transform):
    """Repeat each action ``frame_skip`` times on the base env and sum the rewards.

    The repeat stops at the first done step (on a batched env: as soon as any sub-env is
    done, so no sub-env is stepped past its end). Put it first in a ``Compose``: it reads the
    base env's raw outputs.

    Args:
        frame_skip: number of base-env steps per step (>= 1).
    """

    def __init__(self, frame_skip: int = 1) -> None:
        if frame_skip < 1:
            raise ValueError(f"frame_skip must be >= 1, got {frame_skip}.")
        super().__init__()
        self.frame_skip = int(frame_skip)

    def _step(self, td, next_td):
        if self.frame_skip == 1:
            return next_td
        env = _base_env(self, "FrameSkipTransform")
        base = env.base_env
        reward_keys, done_key = base.reward_keys, base.done_key
        action = env.transform.inv(td.copy()) if env.transform.has_inv else td
        action_keys = base.full_action_spec.keys(True, True)
        rewards = [next_td.get(k) for k in reward_keys]
        for _ in range(self.frame_skip - 1):
            if bool(next_td.get(done_key).any()):
                break
            inp = next_td.exclude(*reward_keys, *base.full_done_spec.keys(True, True))
            for k in action_keys:
                inp.set(k, action.get(k))
            next_td = base.step(inp).get(NEXT)
            rewards = [r + next_td.get(k) for r, k in zip(rewards, reward_keys, strict=True)]
        for r, k in zip(rewards, reward_keys, strict=True):
            next_td.set(k, r)
        return next_td

    def _call(self, td):
        return td

    def extra_repr(self) -> str:
        return f"frame_skip={self.frame_skip}"


class NoopResetEnv(Transform):
    """After a reset, step the base env with the zero action ``noops`` times (a uniform number
    in ``[1, noops]`` with ``random=True``): Atari's random starts (Mnih et al. 2015).

    Applied when the whole batch resets (a partial reset of some sub-envs takes no no-ops, as
    stepping would move the others too). Put it first in a ``Compose``.

    Args:
        noops: the (maximum) number of no-op steps.
        random: draw the number uniformly in ``[1, noops]`` at each reset.
    """

    def __init__(self, noops: int = 30, random: bool = True) -> None:
        if noops < 0:
            raise ValueError(f"noops must be >= 0, got {noops}.")
        super().__init__()
        self.noops = int(noops)
        self.random = random

    def _reset(self, td, td_reset):
        mask = None if td is None else td.get("_reset", None)
        if self.noops == 0 or (mask is not None and not bool(mask.all())):
            return td_reset
        base = _base_env(self, "NoopResetEnv").base_env
        n = int(torch.randint(1, self.noops + 1, ())) if self.random else self.noops
        obs_keys = base.observation_spec.keys(True, True)
        cur = td_reset
        for _ in range(n):
            inp = cur.select(*obs_keys, strict=False)
            inp.update(base.full_action_spec.zero())
            nxt = base.step(inp).get(NEXT)
            if bool(nxt.get(base.done_key).any()):  # an episode ended during the no-ops
                cur = base._reset_unmerged(None)
                continue
            cur = nxt
        for k in obs_keys:
            if k in cur.keys(True):
                td_reset.set(k, cur.get(k))
        return td_reset

    def _call(self, td):
        return td

    def extra_repr(self) -> str:
        return f"noops={self.noops}, random={self.random}"


class ActionMask(Transform):
    """Keep the env's allowed-action mask in its (categorical / one-hot) action spec, so that
    ``rand_action`` and spec checks see it, and refuse masked actions.

    Args:
        action_key: the action entry (default ``"action"``).
        mask_key: the bool mask the env writes (default ``"action_mask"``).
    """

    def __init__(self, action_key=ACTION, mask_key="action_mask") -> None:
        super().__init__([action_key, mask_key], None, [action_key], None)
        self.action_key, self.mask_key = action_key, mask_key

    def _spec(self):
        env = self.parent
        if env is None:
            return None
        spec = env.full_action_spec[self.action_key]
        if not hasattr(spec, "update_mask"):
            raise TypeError(f"ActionMask needs a Categorical or OneHot action spec, got {spec!r}.")
        return spec

    def _call(self, td):
        mask = td.get(self.mask_key, None)
        spec = self._spec()
        if mask is not None and spec is not None:
            spec.update_mask(mask.clone())
        return td

    def inv(self, td: TensorDictBase) -> TensorDictBase:
        mask = td.get(self.mask_key, None)
        action = td.get(self.action_key, None)
        if mask is None or action is None:
            return td
        spec = self._spec()
        if spec is not None:
            spec.update_mask(mask.clone())
            if not spec.is_in(action):
                raise RuntimeError(f"ActionMask: the action {self.action_key!r} holds an action "
                                   f"that {self.mask_key!r} forbids.")
        return td

    def extra_repr(self) -> str:
        return f"action_key={self.action_key!r}, mask_key={self.mask_key!r}"
