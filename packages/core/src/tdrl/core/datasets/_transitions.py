"""Episodes as numpy arrays <-> flat transition TensorDicts with the tdrl keys, and the
write of a stream of transition chunks into a replay storage.

A transition TensorDict has batch ``[N]`` (one row per step, episodes one after the other)::

    <obs keys>                 step t; "observation", or a Dict space's entries at the root
    "action"                   [N, *action_shape]
    ("next", <obs keys>)       step t+1
    ("next", "reward")         [N, 1] float32
    ("next", "done")           [N, 1] bool (terminated | truncated)
    ("next", "terminated")     [N, 1] bool
    ("next", "truncated")      [N, 1] bool
    "episode"                  [N] int64, the episode id (constant within an episode)

as in docs/ARCHITECTURE.md ("Data contract"); a Dict observation space lives at the root as
TorchRL's and tdrl's ``GymWrapper`` put it (``"observation"``, ``"achieved_goal"``, ...).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from tdrl.core import keys as K
from tdrl.core.replay.storages import Storage, TensorStorage

__all__ = ["EPISODE", "DatasetFormatError", "episode_to_td", "obs_keys", "split_episodes",
           "check_transitions",
           "fill_storage"]

EPISODE = "episode"
"""Key of the episode id of each transition (TorchRL's offline datasets use the same name)."""

_FLAGS = (K.REWARD, K.DONE, K.TERMINATED, K.TRUNCATED)


class DatasetFormatError(ValueError):
    """A dataset file or object does not have the layout its reader expects."""


def _tensor(x: Any) -> torch.Tensor:
    arr = np.asarray(x)
    if not arr.flags.writeable or not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr).copy()
    return torch.from_numpy(arr)


def _column(x: Any, n: int, name: str) -> torch.Tensor:
    """A flag / reward column of ``n`` entries as ``[n, 1]``."""
    t = _tensor(x)
    if t.numel() != n:
        raise DatasetFormatError(f"{name} has {t.numel()} entries, expected {n} (one per step).")
    return t.reshape(n, 1)


def episode_to_td(
    observations: np.ndarray | Mapping[str, np.ndarray],
    next_observations: np.ndarray | Mapping[str, np.ndarray],
    actions: np.ndarray,
    rewards: np.ndarray,
    terminations: np.ndarray,
    truncations: np.ndarray,
    episode: int | np.ndarray,
) -> TensorDict:
    """Steps ``[T]`` of numpy arrays -> a transition TensorDict ``[T]`` (see module doc).

    Args:
        observations, next_observations: ``[T, *obs_shape]`` arrays, or dicts of them
            (a Dict space: each entry becomes a root key).
        actions: ``[T, *action_shape]``. rewards, terminations, truncations: ``[T]``.
        episode: the episode id (an int for all steps, or ``[T]``).

    Returns:
        The TensorDict; rewards are float32, flags bool, ``done = terminated | truncated``.
    """
    act = _tensor(actions)
    n = act.shape[0]

    def obs_entries(obs, where: str) -> dict[str, torch.Tensor]:
        items = obs.items() if isinstance(obs, Mapping) else [(K.OBSERVATION, obs)]
        out = {}
        for key, value in items:
            t = _tensor(value)
            if t.shape[:1] != (n,):
                raise DatasetFormatError(
                    f"{where} {key!r} has {t.shape[0] if t.dim() else 0} steps, the actions "
                    f"have {n}: every array of an episode needs one row per step."
                )
            out[key] = t
        return out

    term = _column(terminations, n, "terminations").bool()
    trunc = _column(truncations, n, "truncations").bool()
    nxt = {
        **obs_entries(next_observations, "next observation"),
        K.REWARD: _column(rewards, n, "rewards").to(torch.float32),
        K.DONE: term | trunc,
        K.TERMINATED: term,
        K.TRUNCATED: trunc,
    }
    ep = torch.as_tensor(episode, dtype=torch.int64)
    return TensorDict(
        {**obs_entries(observations, "observation"), K.ACTION: act,
         EPISODE: ep.expand(n).clone() if ep.dim() == 0 else ep.reshape(n),
         K.NEXT: TensorDict(nxt, batch_size=[n])},
        batch_size=[n],
    )


def obs_keys(td: TensorDictBase) -> list[str]:
    """The observation keys of a transition TensorDict: the root keys also found under
    ``"next"``, other than reward and done flags."""
    nxt = td.get(K.NEXT, None)
    if nxt is None:
        raise DatasetFormatError(
            f"A transition TensorDict needs a 'next' entry (keys: {list(td.keys())})."
        )
    keys = [k for k in nxt.keys() if k not in _FLAGS and k in td.keys()]
    if not keys:
        raise DatasetFormatError(
            f"No observation key is both at the root and under 'next' "
            f"(root: {list(td.keys())}, next: {list(nxt.keys())})."
        )
    return keys


def check_transitions(td: TensorDictBase, episode_key: str = EPISODE) -> None:
    """Raise :class:`DatasetFormatError` naming what is missing for the writers."""
    if td.batch_dims != 1:
        raise DatasetFormatError(
            f"Expected a flat transition TensorDict of batch [N], got batch "
            f"{tuple(td.batch_size)}: reshape(-1) a rollout first (each episode's steps "
            "consecutive)."
        )
    needed = [K.ACTION, episode_key, (K.NEXT, K.REWARD), (K.NEXT, K.TERMINATED),
              (K.NEXT, K.TRUNCATED)]
    have = set(td.keys(include_nested=True))
    missing = [k for k in needed if k not in have]
    if missing:
        raise DatasetFormatError(
            f"The transitions lack {missing}; a dataset needs {needed} and the observations "
            "at the root and under 'next'."
        )
    obs_keys(td)


def split_episodes(episode: torch.Tensor) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` of the runs of equal ids in ``episode`` ``[N]``.

    Raises:
        DatasetFormatError: an id appears in two separate runs (an episode's steps must
            be consecutive).
    """
    episode = episode.reshape(-1)
    if episode.numel() == 0:
        return []
    change = torch.nonzero(episode[1:] != episode[:-1]).reshape(-1) + 1
    bounds = [0, *change.tolist(), episode.numel()]
    runs = list(zip(bounds[:-1], bounds[1:]))
    ids = episode[torch.as_tensor(bounds[:-1])]
    if ids.unique().numel() != ids.numel():
        raise DatasetFormatError(
            "An episode id appears in two separate runs of steps: the steps of each episode "
            "must be consecutive (sort the transitions by episode first)."
        )
    return runs


def fill_storage(chunks: Iterable[TensorDictBase], total: int,
                 storage: Storage | None) -> TensorStorage:
    """Write transition chunks into ``storage`` (default a ``LazyTensorStorage(total)``)
    from slot 0, one chunk at a time (so a :class:`~tdrl.core.replay.MemmapStorage` never
    needs the whole dataset in memory).

    Args:
        chunks: transition TensorDicts ``[n_i]`` with ``sum(n_i) == total``.
        total: the number of transitions.
        storage: an empty tensor storage with ``max_size >= total``, or ``None``.

    Returns:
        The storage, ``len == total`` and its write cursor after the last item (so a
        ``ReplayBuffer`` over it appends after the dataset).
    """
    if storage is None:
        storage = TensorStorage(max(total, 1))
    if not isinstance(storage, TensorStorage):
        raise TypeError(
            f"Datasets load into a TensorStorage / MemmapStorage, got {type(storage).__name__}."
        )
    if len(storage):
        raise ValueError(
            f"The storage already holds {len(storage)} items; load a dataset into an empty one."
        )
    if storage.max_size < total:
        raise ValueError(
            f"The dataset has {total} transitions but the storage has max_size "
            f"{storage.max_size}: make the storage at least that large."
        )
    storage.cursor = total % storage.max_size  # committed by each write (MemmapStorage)
    start = 0
    for chunk in chunks:
        n = chunk.shape[0]
        if n:
            storage.set(slice(start, start + n), chunk)
            start += n
    if start != total:
        raise DatasetFormatError(f"The dataset announced {total} transitions but held {start}.")
    return storage
