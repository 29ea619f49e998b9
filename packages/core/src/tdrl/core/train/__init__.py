"""Training utilities: loggers, a progress bar with live metrics, atomic checkpoints."""

from __future__ import annotations

from tdrl.core.train.checkpoint import (
    Checkpointer,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from tdrl.core.train.history import MetricHistory, truncate_csv
from tdrl.core.train.loggers import CSVLogger, Logger, TensorboardLogger, WandbLogger
from tdrl.core.train.progress import ProgressBar

__all__ = [
    "Logger",
    "CSVLogger",
    "TensorboardLogger",
    "WandbLogger",
    "ProgressBar",
    "Checkpointer",
    "save_checkpoint",
    "load_checkpoint",
    "rng_state",
    "set_rng_state",
    "MetricHistory",
    "truncate_csv",
]
