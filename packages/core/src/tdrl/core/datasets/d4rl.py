"""D4RL-style HDF5 files (Fu et al., 2020, "D4RL: Datasets for Deep Data-Driven
Reinforcement Learning", arXiv:2004.07219) <-> tdrl transitions.

The file holds one row per step, episodes one after the other::

    observations        [N, *obs_shape]   (or a group of datasets, one per Dict-space entry)
    actions             [N, *action_shape]
    rewards             [N]
    terminals           [N] bool   the episode ended in a terminal state at this step
    timeouts            [N] bool   the episode was cut (time limit) at this step
    next_observations   [N, *obs_shape]   optional (or a group, as observations)

An episode ends after every row with ``terminals`` or ``timeouts`` set; episodes are
numbered 0, 1, ... in file order under ``"episode"``. Without ``next_observations`` the next
observation of row ``i`` is ``observations[i + 1]`` inside an episode, as D4RL's
``qlearning_dataset`` does, with two differences that keep every transition true: a timeout
row (and a last row that ends no episode) has no next observation in the file and is dropped,
the row before it becoming the truncated end of its episode; a terminal row gets its own
observation as next observation (a placeholder: nothing bootstraps from a terminal state).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from tdrl.core import keys as K
from tdrl.core.datasets._transitions import (EPISODE, DatasetFormatError, check_transitions,
                                             episode_to_td, fill_storage, obs_keys,
                                             split_episodes)
from tdrl.core.datasets.hdf5 import (check_stored, dataset, h5py_module, keys, open_file,
                                     read_rows)
from tdrl.core.replay.storages import Storage, TensorStorage

__all__ = ["read_d4rl", "load_d4rl", "write_d4rl"]

_log = logging.getLogger(__name__)
_REQUIRED = ("observations", "actions", "rewards", "terminals", "timeouts")


def _h5py():
    return h5py_module("D4RL HDF5 datasets")


def _open(path: str | os.PathLike):
    return open_file(path, "D4RL HDF5")


def _obs_arrays(node, path: str, name: str) -> dict[str, object]:
    """``{key: h5py dataset}`` of an observation entry (a dataset or a group of them)."""
    h5py = _h5py()
    if isinstance(node, h5py.Dataset):
        return {K.OBSERVATION: node}
    out = {}
    for key in keys(node, path):
        value = dataset(node, key, path)
        if not isinstance(value, h5py.Dataset):
            raise DatasetFormatError(
                f"{path}: {name}/{key} is a group; only one level of Dict observations is read."
            )
        out[key] = value
    return out


class _File:
    """The checked layout of an open D4RL file."""

    def __init__(self, f, path: str) -> None:
        nodes = {k: dataset(f, k, path, required=False)
                 for k in (*_REQUIRED, "next_observations")}
        missing = [k for k in _REQUIRED if nodes[k] is None]
        if missing:
            raise DatasetFormatError(
                f"{path} is not a D4RL dataset: it lacks {missing} (it holds {sorted(keys(f, path))}); "
                f"a D4RL file has {list(_REQUIRED)} and optionally 'next_observations'."
            )
        self.path = path
        self.obs = _obs_arrays(nodes["observations"], path, "observations")
        self.next_obs = (_obs_arrays(nodes["next_observations"], path, "next_observations")
                         if nodes["next_observations"] is not None else None)
        self.actions = nodes["actions"]
        for name in ("actions", "rewards", "terminals", "timeouts"):
            if not isinstance(nodes[name], _h5py().Dataset):
                raise DatasetFormatError(f"{path}: {name} is a group, expected a dataset.")
        self.n = int(self.actions.shape[0]) if self.actions.shape else 0
        for name in ("rewards", "terminals", "timeouts"):
            shape = nodes[name].shape
            if shape[:1] != (self.n,) or int(np.prod(shape)) != self.n:
                raise DatasetFormatError(
                    f"{path}: {name} has shape {shape}, expected ({self.n},) "
                    f"(one entry per row of actions)."
                )
        groups = [("observations", self.obs)] + (
            [("next_observations", self.next_obs)] if self.next_obs is not None else [])
        for name, arrays in groups:
            for key, arr in arrays.items():
                if arr.shape[:1] != (self.n,):
                    raise DatasetFormatError(
                        f"{path}: {name} {key!r} has {arr.shape[0]} rows, actions have {self.n}."
                    )
        if self.next_obs is not None and set(self.next_obs) != set(self.obs):
            raise DatasetFormatError(
                f"{path}: next_observations has keys {sorted(self.next_obs)}, "
                f"observations {sorted(self.obs)}."
            )
        for ds in (self.actions, *[nodes[k] for k in ("rewards", "terminals", "timeouts")],
                   *self.obs.values(), *(self.next_obs or {}).values()):
            check_stored(ds, path)
        self.rewards = read_rows(nodes["rewards"], 0, self.n, path).reshape(-1)
        self.terminals = read_rows(nodes["terminals"], 0, self.n, path).reshape(-1).astype(bool)
        self.timeouts = (read_rows(nodes["timeouts"], 0, self.n, path).reshape(-1).astype(bool)
                         & ~self.terminals)
        ends = self.terminals | self.timeouts
        self.episode = np.concatenate([[0], np.cumsum(ends)[:-1]]).astype(np.int64)
        if self.next_obs is None:
            last_open = np.zeros(self.n, dtype=bool)
            if self.n:
                last_open[-1] = not ends[-1]
            self.keep = ~(self.timeouts | last_open)
            dropped = self.n - int(self.keep.sum())
            if dropped:
                _log.info("%s has no next_observations: %d timeout / open-end rows dropped.",
                          path, dropped)
        else:
            self.keep = np.ones(self.n, dtype=bool)

    def chunks(self, chunk_size: int) -> Iterator[TensorDict]:
        for a in range(0, self.n, chunk_size):
            b = min(a + chunk_size, self.n)
            keep = self.keep[a:b]
            obs = {k: read_rows(v, a, b, self.path) for k, v in self.obs.items()}
            term = self.terminals[a:b].copy()
            trunc = self.timeouts[a:b].copy()
            if self.next_obs is not None:
                nxt = {k: read_rows(v, a, b, self.path) for k, v in self.next_obs.items()}
            else:
                top = min(b + 1, self.n)
                nxt = {}
                for k, v in self.obs.items():
                    shifted = read_rows(v, a + 1, top, self.path)
                    if shifted.shape[0] < b - a:  # the file's last row: no successor
                        shifted = np.concatenate([shifted, obs[k][-1:]], 0)
                    shifted[term] = obs[k][term]  # placeholder, never bootstrapped
                    nxt[k] = shifted
                # a kept row followed by a dropped row of its own episode is the new end
                pad = b + 1 - top
                follow = np.concatenate([self.keep[a + 1:top], np.ones(pad, bool)])
                same = np.concatenate([self.episode[a + 1:top] == self.episode[a:top - 1],
                                       np.zeros(pad, bool)])
                trunc |= keep & ~follow & same & ~term
            td = episode_to_td(
                {k: v[keep] for k, v in obs.items()}, {k: v[keep] for k, v in nxt.items()},
                read_rows(self.actions, a, b, self.path)[keep], self.rewards[a:b][keep],
                term[keep], trunc[keep], self.episode[a:b][keep],
            )
            yield td


def read_d4rl(path: str | os.PathLike, *, chunk_size: int = 100_000) -> TensorDict:
    """Read a D4RL-style HDF5 file into one transition TensorDict ``[N]`` (see the module
    docstring for the layout and how a missing ``next_observations`` is handled).

    Args:
        path: the ``.hdf5`` file.
        chunk_size: rows read at a time.

    Returns:
        TensorDict ``[N]`` with the observations at the root and under ``"next"``,
        ``"action"``, ``("next", "reward"|"done"|"terminated"|"truncated")`` ``[N, 1]`` and
        ``"episode"`` ``[N]``.

    Raises:
        FileNotFoundError: no file at ``path``.
        DatasetFormatError: not HDF5, truncated or damaged (naming the file and the key), a
            required dataset missing or misshapen, or a header declaring more rows than the
            file stores (both counts named).
        ModuleNotFoundError: ``h5py`` is not installed (names the extra to install).
    """
    with _open(path) as f:
        parts = list(_File(f, os.fspath(path)).chunks(chunk_size))
    if not parts:
        raise DatasetFormatError(f"{os.fspath(path)} holds no transitions.")
    return torch.cat(parts, 0) if len(parts) > 1 else parts[0]


def load_d4rl(path: str | os.PathLike, storage: Storage | None = None, *,
              chunk_size: int = 100_000) -> TensorStorage:
    """Read a D4RL-style HDF5 file into a replay storage, ``chunk_size`` rows at a time.

    Args:
        path: the ``.hdf5`` file.
        storage: an empty ``LazyTensorStorage`` / ``MemmapStorage`` with ``max_size`` at
            least the number of transitions (default: a ``LazyTensorStorage`` of that size).
            A ``MemmapStorage`` keeps a large dataset on disk.
        chunk_size: rows read and written at a time.

    Returns:
        The filled storage (wrap it in a ``ReplayBuffer`` to sample; use
        ``SliceSampler(traj_key="episode")`` for sequences).

    Raises:
        as :func:`read_d4rl`; ``ValueError`` if ``storage`` is too small or not empty.
    """
    with _open(path) as f:
        layout = _File(f, os.fspath(path))
        return fill_storage(layout.chunks(chunk_size), int(layout.keep.sum()), storage)


def _write_obs(f, name: str, td: TensorDictBase, keys: list[str]) -> None:
    if keys == [K.OBSERVATION]:
        f.create_dataset(name, data=td.get(K.OBSERVATION).numpy())
        return
    group = f.create_group(name)
    for key in keys:
        group.create_dataset(key, data=td.get(key).numpy())


def write_d4rl(td: TensorDictBase, path: str | os.PathLike, *,
               episode_key: str = EPISODE, attrs: Mapping[str, object] | None = None) -> None:
    """Write transitions to a D4RL-style HDF5 file (with ``next_observations``).

    Args:
        td: transition TensorDict ``[N]`` (as :func:`read_d4rl` returns, or a collector's
            batch flattened with each episode's steps consecutive), with ``episode_key``.
        path: the file to create (an existing file is replaced).
        episode_key: key of the episode ids. The file stores no ids: an episode ends at a
            ``terminals`` / ``timeouts`` row, so a run of steps whose episode ends without
            either flag (cut by the end of a batch) is written with ``timeouts`` set at its
            last row, the D4RL convention for a cut episode.
        attrs: extra HDF5 attributes of the file (e.g. ``{"env": "Pendulum-v1"}``).

    Raises:
        DatasetFormatError: ``td`` is not a flat transition TensorDict with the keys above,
            or an episode's steps are not consecutive.
    """
    h5py = _h5py()
    check_transitions(td, episode_key)
    td = td.cpu()
    keys = obs_keys(td)
    runs = split_episodes(td.get(episode_key))
    term = td.get((K.NEXT, K.TERMINATED)).reshape(-1).bool().numpy()
    trunc = td.get((K.NEXT, K.TRUNCATED)).reshape(-1).bool().numpy() & ~term
    for _, stop in runs[:-1]:
        if not (term[stop - 1] or trunc[stop - 1]):
            trunc[stop - 1] = True
    with h5py.File(os.fspath(path), "w") as f:
        _write_obs(f, "observations", td, keys)
        _write_obs(f, "next_observations", td.get(K.NEXT), keys)
        f.create_dataset("actions", data=td.get(K.ACTION).numpy())
        f.create_dataset("rewards", data=td.get((K.NEXT, K.REWARD)).reshape(-1).numpy())
        f.create_dataset("terminals", data=term)
        f.create_dataset("timeouts", data=trunc)
        for name, value in (attrs or {}).items():
            f.attrs[name] = value
