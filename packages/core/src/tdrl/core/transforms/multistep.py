"""``MultiStepTransform``: n-step transitions, written as a replay buffer stores them.

TorchRL's replay-buffer transform of the same name and arguments: ``ReplayBuffer(...,
transform=MultiStepTransform(n_steps=3, gamma=0.99))``. The buffer's ``extend`` runs
:meth:`MultiStepTransform.inv` on each collected rollout ``[*B, T]`` (time last); the transform
keeps the last ``n_steps`` steps of each call and joins them to the next call's rollout, so a
transition is written once its ``n_steps`` successors are known (the first call returns
``T - n_steps`` steps, the later ones ``T``), whatever the collector's ``frames_per_batch``.

For each step ``t`` with ``k = min(n_steps, steps left in its episode)``:

- ``("next", reward)`` becomes ``r_t + gamma r_{t+1} + ... + gamma^{k-1} r_{t+k-1}``, and the
  one-step reward moves to ``("next", "original_reward")``;
- every other entry under ``"next"`` (observations, and the done flags) is step ``t + k - 1``'s:
  the bootstrap observation is ``k`` steps ahead and ``terminated`` says whether the episode
  ended inside the window (TorchRL keeps step ``t``'s done flags: see ``DIFFERENCES`` in
  :mod:`tdrl.core.torchrl_names`);
- ``"steps_to_next_obs"`` (``k``, int64 ``[*B, T]``), ``"gamma"`` (``gamma ** k``) and
  ``"nonterminal"`` (TorchRL's: ``k > 1``) are written at the root.

The losses' one-step targets and :class:`~tdrl.core.values.TD0` then discount by
``gamma ** steps_to_next_obs`` (:func:`tdrl.core.values.nstep.step_discount`).

Compact batches (``Collector(compact_obs=True)``) are refused: their next observations are
rebuilt as ``obs[t + 1]``, which is not the n-step bootstrap observation.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tensordict import TensorDictBase

from ..keys import DONE, DONE_KEYS, NEXT, NEXT_OBS_KNOWN, OBSERVATION, ORIGINAL_REWARD, REWARD, \
    STEPS_TO_NEXT_OBS, next_key
from ..values.nstep import nstep_returns
from .base import Transform

__all__ = ["MultiStepTransform"]

_ENV_ERR = ("MultiStepTransform rewrites stored transitions: use it as a replay buffer's "
            "transform (ReplayBuffer(..., transform=MultiStepTransform(n, gamma))), not in an env.")
# root keys whose ("next", key) a compact batch drops: pixels and the default observation
_OBS_KEYS = (OBSERVATION, "pixels")


def _leaf(key) -> str:
    return key if isinstance(key, str) else key[-1]


class MultiStepTransform(Transform):
    """n-step transitions for a replay buffer (see the module docstring).

    Args:
        n_steps: the look-ahead ``n >= 1`` (may be changed between calls).
        gamma: discount of the reward sums.
        reward_keys: reward keys under ``"next"`` (default ``["reward"]``).
        done_key: the key under ``"next"`` that ends an episode (default ``"done"``).
        done_keys: the done flags (default ``done``, ``terminated``, ``truncated``; shifted
            with the observations).
        mask_key: TorchRL's; accepted for its spelling (tdrl's collectors yield no padding here).
    """

    def __init__(self, n_steps: int, gamma: float, *, reward_keys: Sequence | None = None,
                 done_key=None, done_keys: Sequence | None = None, mask_key=None) -> None:
        super().__init__()
        self.n_steps = n_steps
        self.gamma = float(gamma)
        self.reward_keys = list(reward_keys) if reward_keys is not None else [REWARD]
        self.done_key = done_key if done_key is not None else DONE
        self.done_keys = list(done_keys) if done_keys is not None else list(DONE_KEYS)
        self.mask_key = mask_key
        self._window: TensorDictBase | None = None

    @property
    def n_steps(self) -> int:
        return self._n_steps

    @n_steps.setter
    def n_steps(self, value: int) -> None:
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"MultiStepTransform: n_steps must be an int >= 1, got {value!r}.")
        self._n_steps = value

    @property
    def has_inv(self) -> bool:
        return True

    def set_container(self, container) -> None:
        super().set_container(container)
        if self.parent is not None:
            raise ValueError(_ENV_ERR)

    def transform_observation_spec(self, spec):
        if self.parent is not None:  # an env building its specs (also through a Compose)
            raise ValueError(_ENV_ERR)
        return spec

    def _step(self, td, next_td):
        raise ValueError(_ENV_ERR)

    def _reset(self, td, td_reset):
        raise ValueError(_ENV_ERR)

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        """Sampling side: the stored transitions are already n-step; returned unchanged."""
        return td

    def reset_window(self) -> None:
        """Forget the steps kept from the last call (a new, unrelated stream of rollouts)."""
        self._window = None

    def inv(self, td: TensorDictBase) -> TensorDictBase | None:
        """The n-step transitions of ``td`` ``[*B, T]`` joined to the steps kept from the last
        call, less the last ``n_steps`` (kept for the next call); ``None`` while fewer than
        ``n_steps + 1`` steps have arrived."""
        if self.parent is not None:
            raise ValueError(_ENV_ERR)
        if td.batch_dims < 1:
            raise ValueError("MultiStepTransform needs rollouts with a time dim (the last batch "
                             f"dim); got batch_size {tuple(td.batch_size)}.")
        self._refuse_compact(td)
        n = self.n_steps
        if self._window is None:
            data = td
        else:
            if self._window.batch_size[:-1] != td.batch_size[:-1]:
                raise ValueError(f"MultiStepTransform: a rollout of batch {tuple(td.batch_size)} "
                                 f"follows one of {tuple(self._window.batch_size)}; the env dims "
                                 "must stay the same (reset_window() to start a new stream).")
            data = torch.cat([self._window, td], -1)
        self._window = data[..., -n:].clone()
        if data.shape[-1] <= n:
            return None
        return self.multi_step(data)[..., :-n]

    def multi_step(self, td: TensorDictBase) -> TensorDictBase:
        """The n-step version of every step of ``td`` ``[*B, T]`` (windows cut at ``T``), a new
        TensorDict; no steps are kept or dropped."""
        nxt = td.get(NEXT)
        done = nxt.get(self.done_key)
        if done.shape == (*td.batch_size, 1):
            done = done.squeeze(-1)
        if done.shape != td.batch_size:
            raise ValueError(f"MultiStepTransform: {next_key(self.done_key)!r} has shape "
                             f"{tuple(done.shape)}; expected {tuple(td.batch_size)} (plus a 1).")
        out = td.copy()
        sums, steps = {}, None
        for key in self.reward_keys:
            sums[key], steps = nstep_returns(nxt.get(key), done.bool(), self.n_steps, self.gamma)
        last = torch.arange(td.shape[-1], device=steps.device).expand_as(steps) + steps - 1
        shifted = nxt.exclude(*self.reward_keys).gather(td.batch_dims - 1, last)
        new_next = nxt.copy()
        new_next.update(shifted)
        for key in self.reward_keys:
            orig = ORIGINAL_REWARD if key == REWARD else f"original_{_leaf(key)}"
            new_next.set(orig if isinstance(key, str) else (*key[:-1], orig), nxt.get(key))
            new_next.set(key, sums[key])
        out.set(NEXT, new_next)
        out.set(STEPS_TO_NEXT_OBS, steps)
        out.set("gamma", self.gamma ** steps.to(torch.get_default_dtype()))
        out.set("nonterminal", steps > 1)
        return out

    def _refuse_compact(self, td: TensorDictBase) -> None:
        nxt = td.get(NEXT, None)
        if nxt is None:
            raise KeyError("MultiStepTransform needs transitions with a 'next' entry.")
        missing = [k for k in _OBS_KEYS if k in td.keys() and k not in nxt.keys()]
        if missing or NEXT_OBS_KNOWN in td.keys(True):
            raise ValueError(
                "MultiStepTransform: this is a compact batch (Collector(compact_obs=True): no "
                f"('next', {missing[0] if missing else 'obs'!r}), or next observations rebuilt by "
                "NextStateReconstructor). An n-step transition bootstraps from the observation n "
                "steps ahead, which a compact batch does not hold. Fix: collect with "
                "compact_obs=False for n-step targets.")

    def extra_repr(self) -> str:
        return f"n_steps={self.n_steps}, gamma={self.gamma}"
