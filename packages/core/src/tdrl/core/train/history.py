"""In-memory metric history that forwards to loggers and rewinds when a run resumes.

A trainer logs one row of scalars per step; :class:`MetricHistory` keeps the rows (for plots
and summaries), passes each to any number of :class:`tdrl.core.train.Logger` s, and travels in
the trainer's checkpoint (``state_dict``). When a run resumes from a checkpoint taken at step
``s``, the steps after ``s`` are logged again: :meth:`MetricHistory.load_state_dict` drops
them from memory and :func:`truncate_csv` drops them from a CSV file before a
:class:`tdrl.core.train.CSVLogger` reopens it, so the CSV holds each step once.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from tdrl.core.train.loggers import Logger

__all__ = ["MetricHistory", "truncate_csv"]


def _scalar(value: Any) -> float:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"MetricHistory: only scalars can be logged, got a tensor of shape {tuple(value.shape)}")
        return float(value.detach().cpu().item())
    return float(value)


def truncate_csv(path: str | os.PathLike, step: int, step_column: str = "step") -> int:
    """Drop the rows of a CSV whose ``step_column`` is greater than ``step`` (atomic rewrite).

    Args:
        path: the CSV file; nothing happens when it does not exist.
        step: the last step to keep.
        step_column: the column holding the step.

    Returns:
        The number of rows kept.
    """
    path = Path(path)
    if not path.exists():
        return 0
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames or []
        rows = list(reader)
    if header and step_column not in header:
        raise KeyError(f"truncate_csv: {path} has no {step_column!r} column; columns are {header}")
    kept = [r for r in rows if r.get(step_column) in ("", None) or float(r[step_column]) <= step]
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=header)
        writer.writeheader()
        writer.writerows(kept)
    os.replace(tmp, path)
    return len(kept)


class MetricHistory:
    """Rows of per-step scalar metrics, kept in memory and forwarded to loggers.

    Args:
        loggers: :class:`tdrl.core.train.Logger` instances (CSV, TensorBoard, wandb) that
            receive every row; none keeps the rows in memory only.

    Example:
        >>> hist = MetricHistory([CSVLogger("runs", "grpo")])
        >>> hist.log({"reward": 0.5, "loss": 1.2}, step=1)
        >>> hist.column("reward")
        [0.5]
    """

    def __init__(self, loggers: Iterable[Logger] = ()) -> None:
        self.loggers = list(loggers)
        self.rows: list[dict[str, float]] = []

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        """Append ``{"step": step, **metrics}`` and send ``metrics`` to every logger."""
        values = {k: _scalar(v) for k, v in metrics.items() if k != "step"}
        self.rows.append({"step": float(step), **values})
        for logger in self.loggers:
            logger.log_metrics(values, step)

    def column(self, name: str) -> list[float]:
        """The values of one metric over the logged steps (rows without it are skipped)."""
        return [r[name] for r in self.rows if name in r]

    def truncate(self, step: int) -> None:
        """Forget the rows logged after ``step`` (in memory; see :func:`truncate_csv` for files)."""
        self.rows = [r for r in self.rows if r["step"] <= step]

    def state_dict(self) -> dict:
        return {"rows": [dict(r) for r in self.rows]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.rows = [dict(r) for r in state["rows"]]

    def close(self) -> None:
        for logger in self.loggers:
            logger.close()
