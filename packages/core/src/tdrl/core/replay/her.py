"""Hindsight experience replay: goal relabelling at sampling time (Andrychowicz et al., 2017,
"Hindsight Experience Replay", arXiv:1707.01495).

Observations are Dict spaces as tdrl's ``GymWrapper`` writes them (root keys
``"observation"``, ``"achieved_goal"``, ``"desired_goal"``, the same under ``"next"``). A
sampled transition ``t`` of an episode of ``T`` stored steps gets, with probability
``relabel_fraction``, a new desired goal: the achieved goal ``("next", "achieved_goal")`` of a
step ``t'`` of its own episode, chosen by a strategy,

* ``future_goal_index``: ``t'`` uniform in ``[t, T - 1]`` (the paper's *future*),
* ``final_goal_index``: ``t' = T - 1`` (*final*),
* ``episode_goal_index``: ``t'`` uniform in ``[0, T - 1]`` (*episode*),

and its reward is recomputed by the user's ``compute_reward(achieved, desired)`` (Gymnasium
Robotics' ``env.unwrapped.compute_reward`` convention, vectorised over a batch). The paper's
``k`` relabelled goals per real one is a fraction ``k / (k + 1)`` (``k = 4`` -> 0.8).

Episodes are found in the storage from an episode-id column (``"episode"`` as the offline
datasets write it, or the collector's ``("collector", "traj_ids")``): a run of equal ids in
slot order is one episode, and the ring buffer's write cursor and slot 0 end runs too (as in
:class:`~tdrl.core.replay.SliceSampler`), so a goal never comes from another episode.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Union

import torch
from tensordict import TensorDictBase

from ..keys import INDEX, NEXT, REWARD
from .storages import TensorStorage

__all__ = ["HERTransform", "her_relabel_fraction", "future_goal_index", "final_goal_index",
           "episode_goal_index", "STRATEGIES"]

NestedKey = Union[str, tuple]
GoalIndex = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def her_relabel_fraction(k: int) -> float:
    """The share of relabelled transitions for ``k`` hindsight goals per real goal:
    ``k / (k + 1)`` (``k = 4`` -> 0.8)."""
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}.")
    return k / (k + 1)


def future_goal_index(t: torch.Tensor, start: torch.Tensor, stop: torch.Tensor,
                      u: torch.Tensor) -> torch.Tensor:
    """Slots ``[t, stop - 1]``, uniform: a step at or after ``t`` of the same episode.

    Args:
        t: the sampled slots ``[B]``. start, stop: their episode's slots ``[start, stop)``
            ``[B]``. u: uniform numbers in ``[0, 1)`` ``[B]``.

    Returns:
        int64 ``[B]``: the slots whose ``("next", achieved_goal)`` becomes the goal.
    """
    return t + (u * (stop - t)).long().clamp_max(stop - t - 1)


def final_goal_index(t: torch.Tensor, start: torch.Tensor, stop: torch.Tensor,
                     u: torch.Tensor) -> torch.Tensor:
    """The episode's last stored step ``stop - 1`` (arguments as :func:`future_goal_index`)."""
    return stop - 1


def episode_goal_index(t: torch.Tensor, start: torch.Tensor, stop: torch.Tensor,
                       u: torch.Tensor) -> torch.Tensor:
    """Slots ``[start, stop - 1]``, uniform: any step of the episode."""
    return start + (u * (stop - start)).long().clamp_max(stop - start - 1)


STRATEGIES: dict[str, GoalIndex] = {
    "future": future_goal_index,
    "final": final_goal_index,
    "episode": episode_goal_index,
}


def _key(key: NestedKey) -> tuple:
    return (key,) if isinstance(key, str) else tuple(key)


class HERTransform:
    """Relabel the goals of sampled transitions; pass it as a ``ReplayBuffer`` transform.

    Example::

        storage = LazyTensorStorage(1_000_000)
        her = HERTransform(storage, env.unwrapped.compute_reward_torch, strategy="future", k=4)
        rb = ReplayBuffer(storage, batch_size=256, transform=her)

    Args:
        storage: the buffer's :class:`~tdrl.core.replay.TensorStorage` (read for the
            episode bounds and the achieved goals of other steps).
        compute_reward: ``(achieved [B, *G], desired [B, *G]) -> reward [B]`` or ``[B, 1]``.
        strategy: ``"future"``, ``"final"``, ``"episode"``, or a function with the signature
            of :func:`future_goal_index`.
        k: hindsight goals per real goal (fraction ``k / (k + 1)``); or give
            ``relabel_fraction`` in ``[0, 1]`` directly (not both).
        episode_key: key of the episode ids in the storage.
        achieved_goal_key, desired_goal_key: the goal keys (at the root and under ``"next"``).
        generator: a ``torch.Generator`` for the draws (reproducible relabelling).

    A batch gets exactly ``round(relabel_fraction * B)`` relabelled transitions, chosen at
    random; the others are returned as stored. The sampled batch needs ``"index"`` (the
    buffer sets it). Done flags are kept: goal tasks in Gymnasium Robotics never terminate.
    """

    def __init__(self, storage: TensorStorage, compute_reward: Callable, *,
                 strategy: str | GoalIndex = "future", k: int | None = None,
                 relabel_fraction: float | None = None, episode_key: NestedKey = "episode",
                 achieved_goal_key: NestedKey = "achieved_goal",
                 desired_goal_key: NestedKey = "desired_goal",
                 generator: torch.Generator | None = None) -> None:
        if not isinstance(storage, TensorStorage):
            raise TypeError(
                f"HERTransform reads a TensorStorage / MemmapStorage, got {type(storage).__name__}."
            )
        if isinstance(strategy, str):
            if strategy not in STRATEGIES:
                raise ValueError(
                    f"Unknown HER strategy {strategy!r}: use one of {sorted(STRATEGIES)} "
                    "or a goal-index function."
                )
            strategy = STRATEGIES[strategy]
        if k is not None and relabel_fraction is not None:
            raise ValueError("Give k or relabel_fraction, not both.")
        fraction = her_relabel_fraction(4 if k is None else k) if relabel_fraction is None \
            else float(relabel_fraction)
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"relabel_fraction must be in [0, 1], got {relabel_fraction}.")
        self.storage, self.compute_reward, self.strategy = storage, compute_reward, strategy
        self.relabel_fraction = fraction
        self.episode_key = _key(episode_key)
        self.achieved_key, self.desired_key = _key(achieved_goal_key), _key(desired_goal_key)
        self.generator = generator

    def episode_bounds(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(run_of_slot [n], start [R], stop [R])``: each stored slot's episode run and the
        runs' slot ranges ``[start, stop)``."""
        n = len(self.storage)
        if n == 0:
            raise RuntimeError("HERTransform: the storage is empty.")
        stored = self.storage.get(slice(0, n))
        if self.episode_key not in stored.keys(include_nested=True):
            raise KeyError(
                f"HERTransform: no episode ids {self.episode_key!r} in the storage (keys: "
                f"{sorted(map(str, stored.keys(include_nested=True, leaves_only=True)))}); "
                "set episode_key= (e.g. ('collector', 'traj_ids'))."
            )
        ep = stored.get(self.episode_key).reshape(n)
        new = torch.ones(n, dtype=torch.bool)
        new[1:] = ep[1:] != ep[:-1]
        if n == self.storage.max_size and 0 < self.storage.cursor < n:
            new[self.storage.cursor] = True  # newest | oldest of a full ring
        run = torch.cumsum(new.long(), 0) - 1
        start = torch.nonzero(new).reshape(-1)
        stop = torch.cat([start[1:], torch.tensor([n])])
        return run, start, stop

    def __call__(self, batch: TensorDictBase) -> TensorDictBase:
        index = batch.get(INDEX, None)
        if index is None:
            raise KeyError("HERTransform needs the sampled slots under 'index' (the "
                           "ReplayBuffer sets them): use it as the buffer's transform.")
        shape = batch.shape
        flat = batch.reshape(-1)
        t = index.reshape(-1).long().cpu()
        b = t.numel()
        n_relabel = int(round(self.relabel_fraction * b))
        if n_relabel == 0:
            return batch
        pick = torch.randperm(b, generator=self.generator)[:n_relabel]
        run, start, stop = self.episode_bounds()
        tp = t[pick]
        r = run[tp]
        u = torch.rand(n_relabel, generator=self.generator)
        goal_slot = self.strategy(tp, start[r], stop[r], u)
        stored = self.storage.get(slice(0, len(self.storage)))
        goals = stored.get((NEXT, *self.achieved_key)).index_select(0, goal_slot)
        dev = flat.device
        pick_d = pick.to(dev) if dev is not None else pick
        goals = goals.to(dev) if dev is not None else goals
        for where in (self.desired_key, (NEXT, *self.desired_key)):
            value = flat.get(where).clone()
            value[pick_d] = goals.to(value.dtype)
            flat.set(where, value)
        achieved = flat.get((NEXT, *self.achieved_key))[pick_d]
        reward = flat.get((NEXT, REWARD)).clone()
        new_reward = torch.as_tensor(self.compute_reward(achieved, goals))
        reward[pick_d] = new_reward.to(reward).reshape(reward[pick_d].shape)
        flat.set((NEXT, REWARD), reward)
        return flat.reshape(shape)
