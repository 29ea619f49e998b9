"""Collectors: run a policy in environments and yield batches of steps.

:class:`Collector` (one process), :class:`MultiSyncCollector` and
:class:`MultiAsyncCollector` (worker processes, shared-memory batches and weights),
:class:`RayCollector` (Ray actors, weights through the object store),
:class:`InferenceCollector` (env workers sharing one auto-batching policy server);
:class:`BatchCollector` is the contract the batch-yielding ones share (iteration, ``len``, ``with``).
"""

from __future__ import annotations

from .contract import BatchCollector
from .inference_collector import InferenceCollector
from .inference_server import InferenceServer
from .multi import MultiAsyncCollector, MultiSyncCollector, WorkerError
from .ray_collector import RayCollector
from .single import Collector, as_interaction_type
from .utils import MASK_KEY, split_trajectories

__all__ = [
    "BatchCollector",
    "Collector",
    "SyncDataCollector",
    "MultiSyncCollector",
    "MultiAsyncCollector",
    "WorkerError",
    "RayCollector",
    "InferenceCollector",
    "InferenceServer",
    "as_interaction_type",
    "split_trajectories",
    "MASK_KEY",
]

SyncDataCollector = Collector
"""Alias (TorchRL's older name of the single-process collector)."""
