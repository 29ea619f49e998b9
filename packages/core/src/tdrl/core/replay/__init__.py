"""Replay buffers: storage + sampler + writer.

See :class:`ReplayBuffer`. Storages: :class:`ListStorage`, :class:`TensorStorage`
(lazy, any device), :class:`MemmapStorage` (files on disk, crash-safe). Samplers:
:class:`RandomSampler`, :class:`SamplerWithoutReplacement`, :class:`PrioritizedSampler`
(vectorised :class:`SumMinTree` on the CPU, :class:`DeviceSumTree` on CUDA), :class:`SliceSampler`. Asynchronous
prioritized writes (a writer thread): :class:`AsyncPrioritizedReplayBuffer`. Writers:
:class:`RoundRobinWriter`, :class:`MaxValueWriter`. Hindsight goal relabelling on sample:
:class:`HERTransform`. The compact-observation path's reconstruction of ``("next", obs)``:
:class:`NextStateReconstructor`.
"""

from __future__ import annotations

from .async_writes import AsyncPrioritizedReplayBuffer
from .buffer import (
    PrioritizedReplayBuffer,
    ReplayBuffer,
    TensorDictPrioritizedReplayBuffer,
    TensorDictReplayBuffer,
)
from .compact import NextStateReconstructor, trajectory_links
from .device_tree import DeviceSumTree
from .her import HERTransform, her_relabel_fraction
from .prioritized import WEIGHT_KEY, PrioritizedSampler
from .samplers import RandomSampler, Sampler, SamplerWithoutReplacement
from .slice_sampler import SliceSampler
from ..diskio import ChecksumError
from ._files import ReplayFormatError
from .memmap import LazyMemmapStorage, MemmapStorage
from .storages import LazyTensorStorage, ListStorage, Storage, TensorStorage
from .sum_tree import SumMinTree
from .writers import MaxValueWriter, RoundRobinWriter, TensorDictMaxValueWriter, Writer

__all__ = [
    "ReplayBuffer",
    "TensorDictReplayBuffer",
    "PrioritizedReplayBuffer",
    "TensorDictPrioritizedReplayBuffer",
    "AsyncPrioritizedReplayBuffer",
    "Storage",
    "ListStorage",
    "TensorStorage",
    "LazyTensorStorage",
    "MemmapStorage",
    "LazyMemmapStorage",
    "ReplayFormatError",
    "ChecksumError",
    "Sampler",
    "RandomSampler",
    "SamplerWithoutReplacement",
    "PrioritizedSampler",
    "SliceSampler",
    "HERTransform",
    "NextStateReconstructor",
    "trajectory_links",
    "her_relabel_fraction",
    "SumMinTree",
    "DeviceSumTree",
    "WEIGHT_KEY",
    "Writer",
    "RoundRobinWriter",
    "MaxValueWriter",
    "TensorDictMaxValueWriter",
]
