"""Minari datasets (Younis et al., 2024, "Minari: A dataset API for Offline Reinforcement
Learning", https://minari.farama.org) <-> tdrl transitions, through the ``minari`` package.

Reading goes through ``minari.MinariDataset`` (either on-disk format minari writes,
HDF5 or Arrow); writing through ``minari.create_dataset_from_buffers``, so the files are
minari's own. A Minari episode of ``T`` steps holds ``T + 1`` observations, ``T`` actions,
rewards, terminations and truncations; it becomes ``T`` transitions with
``("next", obs) = observations[t + 1]`` and ``"episode"`` = the episode's id. A Dict
observation space becomes root keys (``"observation"``, ``"achieved_goal"``, ...).

No hub: datasets come from a local path or the local dataset folder (``MINARI_DATASETS_PATH``,
default ``~/.minari/datasets``); nothing is downloaded.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from tdrl.core import keys as K
from tdrl.core._optional import require
from tdrl.core.datasets._transitions import (EPISODE, DatasetFormatError, check_transitions,
                                             episode_to_td, fill_storage, obs_keys,
                                             split_episodes)
from tdrl.core.datasets.hdf5 import H5_ERRORS, check_stored, dataset, keys, open_file
from tdrl.core.replay.storages import Storage, TensorStorage

__all__ = ["open_minari", "read_minari", "load_minari", "write_minari"]


def _minari():
    return require("minari", extra="offline", what="Minari datasets")


def open_minari(dataset: Any):
    """A ``minari.MinariDataset`` from a dataset object, a local path or a local dataset id.

    Args:
        dataset: a ``MinariDataset``; a directory (the dataset's folder, holding ``data/``,
            or that ``data/`` folder itself); or a dataset id found in the local dataset
            folder (``MINARI_DATASETS_PATH``).

    Raises:
        FileNotFoundError: neither a directory nor a local dataset id.
        DatasetFormatError: the directory holds no Minari metadata, or minari refuses it.
    """
    minari = _minari()
    if isinstance(dataset, minari.MinariDataset):
        return dataset
    if not isinstance(dataset, (str, os.PathLike)):
        raise TypeError(
            f"Expected a MinariDataset, a path or a dataset id, got {type(dataset).__name__}."
        )
    path = os.fspath(dataset)
    if not os.path.isdir(path):
        from minari.storage.datasets_root_dir import get_dataset_path

        local = os.path.join(get_dataset_path(path), "data")
        if not os.path.isdir(local):
            raise FileNotFoundError(
                f"{path!r} is neither a directory nor a dataset id in the local Minari folder "
                f"({get_dataset_path()}; set MINARI_DATASETS_PATH to look elsewhere). tdrl "
                "downloads nothing: create the dataset locally (write_minari or minari's "
                "DataCollector)."
            )
        path = local
    elif os.path.isdir(os.path.join(path, "data")):
        path = os.path.join(path, "data")
    try:
        return minari.MinariDataset(path)
    except (*H5_ERRORS, AssertionError) as err:
        raise DatasetFormatError(f"{path!r} is not a readable Minari dataset: {err}") from err


def _episode_td(ep) -> TensorDict:
    obs = ep.observations
    if isinstance(obs, tuple):
        raise DatasetFormatError(
            "Tuple observation spaces are not supported; use a Box or a Dict space."
        )
    if isinstance(obs, dict):
        nested = [k for k, v in obs.items() if isinstance(v, (dict, tuple))]
        if nested:
            raise DatasetFormatError(f"Nested Dict observation entries {nested} are not supported.")
        first = {k: np.asarray(v)[:-1] for k, v in obs.items()}
        nxt = {k: np.asarray(v)[1:] for k, v in obs.items()}
        n_obs = {k: np.asarray(v).shape[0] for k, v in obs.items()}
    else:
        arr = np.asarray(obs)
        first, nxt, n_obs = arr[:-1], arr[1:], {K.OBSERVATION: arr.shape[0]}
    if isinstance(ep.actions, (dict, tuple)):
        raise DatasetFormatError("Dict / Tuple action spaces are not supported.")
    steps = len(ep.rewards)
    bad = {k: v for k, v in n_obs.items() if v != steps + 1}
    if bad:
        raise DatasetFormatError(
            f"Minari episode {ep.id} has {steps} steps but {bad} observations "
            f"(expected {steps + 1}: the reset observation plus one per step)."
        )
    return episode_to_td(first, nxt, ep.actions, ep.rewards, ep.terminations,
                         ep.truncations, int(ep.id))


_EPISODE_KEYS = ("observations", "actions", "rewards", "terminations", "truncations")


def _check_hdf5(ds, where: str) -> None:
    """Before any data is read, an ``hdf5``-format dataset's headers: every episode's
    entries readable, no header declaring more rows than stored, each episode's
    ``total_steps`` attribute and the metadata's ``total_steps`` equal to the rewards held."""
    steps = 0
    with open_file(where, "Minari HDF5") as f:
        for idx in ds.episode_indices:
            group = dataset(f, f"episode_{int(idx)}", where)
            entries = {k: dataset(group, k, where) for k in _EPISODE_KEYS}
            for node in entries.values():
                leaves = [node] if hasattr(node, "dtype") else [dataset(node, k, where)
                                                                 for k in keys(node, where)]
                for leaf in leaves:
                    if hasattr(leaf, "dtype"):
                        check_stored(leaf, where)
            held = int(entries["rewards"].shape[0]) if entries["rewards"].shape else 0
            declared = group.attrs.get("total_steps")
            if declared is not None and int(declared) != held:
                raise DatasetFormatError(
                    f"{where}: episode_{int(idx)} declares total_steps={int(declared)} but its "
                    f"rewards hold {held} steps.")
            steps += held
    _check_total(ds, steps, where)


def _check_total(ds, held: int, where: str) -> None:
    if held != int(ds.total_steps):
        raise DatasetFormatError(
            f"{where}: the dataset's metadata declares total_steps={int(ds.total_steps)} but "
            f"its episodes hold {held} steps.")


def _episodes(ds) -> Iterator[TensorDict]:
    """The episodes as transition TensorDicts; a damaged file or a step count that differs
    from the metadata's raises :class:`DatasetFormatError` naming the file (and the key)."""
    data = os.fspath(ds.storage.data_path)
    hdf5 = ds.storage.metadata.get("data_format") == "hdf5"
    where = os.path.join(data, "main_data.hdf5") if hdf5 else data
    if hdf5:
        _check_hdf5(ds, where)
    episodes, held = iter(ds.iterate_episodes()), 0
    for idx in ds.episode_indices:
        try:
            ep = next(episodes)
        except StopIteration:
            break
        except (*H5_ERRORS, AssertionError) as err:
            raise DatasetFormatError(f"{where}: cannot read episode {int(idx)} (the data is "
                                     f"damaged): {type(err).__name__}: {err}") from err
        td = _episode_td(ep)
        held += td.shape[0]
        if held > int(ds.total_steps):
            _check_total(ds, held, where)
        yield td
    _check_total(ds, held, where)


def read_minari(dataset: Any) -> TensorDict:
    """Read a Minari dataset into one transition TensorDict ``[N]``.

    Args:
        dataset: as :func:`open_minari`.

    Returns:
        TensorDict ``[N]`` (``N`` = the dataset's total steps), episodes in the dataset's
        order: observations at the root and under ``"next"``, ``"action"``,
        ``("next", "reward"|"done"|"terminated"|"truncated")`` ``[N, 1]``, ``"episode"`` ``[N]``.

    Raises:
        as :func:`open_minari`; :class:`DatasetFormatError` for an empty dataset or
        unsupported spaces.
    """
    parts = list(_episodes(open_minari(dataset)))
    if not parts:
        raise DatasetFormatError("The Minari dataset holds no episodes.")
    return torch.cat(parts, 0) if len(parts) > 1 else parts[0]


def load_minari(dataset: Any, storage: Storage | None = None) -> TensorStorage:
    """Read a Minari dataset into a replay storage, one episode at a time.

    Args:
        dataset: as :func:`open_minari`.
        storage: an empty ``LazyTensorStorage`` / ``MemmapStorage`` with ``max_size`` at least
            the dataset's total steps (default: a ``LazyTensorStorage`` of that size).

    Returns:
        The filled storage (sample it through a ``ReplayBuffer``; episodes are found by
        ``SliceSampler(traj_key="episode")``).
    """
    ds = open_minari(dataset)
    return fill_storage(_episodes(ds), int(ds.total_steps), storage)


def write_minari(td: TensorDictBase, dataset_id: str, *, env: Any = None,
                 observation_space: Any = None, action_space: Any = None,
                 episode_key: str = EPISODE, data_format: str | None = None,
                 **metadata: Any):
    """Write transitions as a local Minari dataset with ``minari.create_dataset_from_buffers``.

    Args:
        td: transition TensorDict ``[N]``, each episode's steps consecutive, the episode
            ids under ``episode_key``. Minari numbers the episodes 0, 1, ... in order.
        dataset_id: minari's ``(namespace/)(env_name/)name-v<k>`` id; the dataset goes to
            the local Minari folder (``MINARI_DATASETS_PATH``).
        env: the Gymnasium env (object, id or spec) the data came from; or give both
            ``observation_space`` and ``action_space``.
        data_format: minari's ``"hdf5"`` or ``"arrow"`` (default: minari's).
        **metadata: passed on (``algorithm_name``, ``author``, ``description``, ...).

    Returns:
        The new ``minari.MinariDataset``.

    Raises:
        DatasetFormatError: ``td`` lacks a key, or an episode is not consecutive.
        ValueError: neither ``env`` nor both spaces were given.
    """
    minari = _minari()
    from minari.data_collector import EpisodeBuffer

    if env is None and (observation_space is None or action_space is None):
        raise ValueError("write_minari needs env= or both observation_space= and action_space=.")
    check_transitions(td, episode_key)
    td = td.cpu()
    keys = obs_keys(td)
    buffers = []
    for start, stop in split_episodes(td.get(episode_key)):
        ep = td[start:stop]

        def obs(key: str, ep=ep) -> np.ndarray:
            return torch.cat([ep.get(key), ep.get((K.NEXT, key))[-1:]], 0).numpy()

        observations = obs(K.OBSERVATION) if keys == [K.OBSERVATION] else {
            k: obs(k) for k in keys}
        term = ep.get((K.NEXT, K.TERMINATED)).reshape(-1).bool().numpy()
        trunc = ep.get((K.NEXT, K.TRUNCATED)).reshape(-1).bool().numpy()
        buffers.append(EpisodeBuffer(
            observations=observations, actions=ep.get(K.ACTION).numpy(),
            rewards=ep.get((K.NEXT, K.REWARD)).reshape(-1).numpy(),
            terminations=term, truncations=trunc, infos={},
        ))
    kwargs = {"data_format": data_format} if data_format is not None else {}
    return minari.create_dataset_from_buffers(
        dataset_id, buffers, env=env, observation_space=observation_space,
        action_space=action_space, **kwargs, **metadata)
