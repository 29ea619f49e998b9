"""Offline datasets in the field's formats, read into (and written from) tdrl transitions.

- :mod:`.minari`: Minari datasets through the ``minari`` package (:func:`read_minari`,
  :func:`load_minari`, :func:`write_minari`);
- :mod:`.d4rl`: D4RL-style HDF5 files through ``h5py`` (:func:`read_d4rl`, :func:`load_d4rl`,
  :func:`write_d4rl`).

``read_*`` return one transition TensorDict ``[N]``; ``load_*`` fill a replay storage
(``LazyTensorStorage`` in memory, ``MemmapStorage`` on disk for a large dataset) chunk by
chunk. Keys follow the data contract (docs/ARCHITECTURE.md): the observations at the root and
under ``"next"``, ``"action"``, ``("next", "reward" | "done" | "terminated" | "truncated")``
``[N, 1]``, plus the episode id ``"episode"`` ``[N]``. Both formats need the ``offline``
extra: ``pip install "packages/core[offline]"``.
"""

from __future__ import annotations

from tdrl.core.datasets._transitions import EPISODE, DatasetFormatError, episode_to_td
from tdrl.core.datasets.d4rl import load_d4rl, read_d4rl, write_d4rl
from tdrl.core.datasets.minari import load_minari, open_minari, read_minari, write_minari

__all__ = [
    "EPISODE",
    "DatasetFormatError",
    "episode_to_td",
    "read_d4rl",
    "load_d4rl",
    "write_d4rl",
    "open_minari",
    "read_minari",
    "load_minari",
    "write_minari",
]
