"""Pieces shared by the trainers: optimiser and schedule, data parallelism, checkpoints, logs."""

from __future__ import annotations

import csv
import logging
import math
import os
import random
from collections.abc import Mapping

import torch
import torch.distributed as dist

__all__ = [
    "make_optimizer",
    "warmup_cosine",
    "dist_info",
    "wrap_ddp",
    "all_reduce_mean",
    "save_checkpoint",
    "load_checkpoint",
    "CSVMetrics",
    "set_seed",
    "rng_state",
    "set_rng_state",
]

log = logging.getLogger(__name__)


def set_seed(seed: int) -> None:
    """Seed Python's and torch's generators."""
    random.seed(seed)
    torch.manual_seed(seed)


def make_optimizer(model, lr: float, weight_decay: float = 0.0, betas=(0.9, 0.99)) -> torch.optim.AdamW:
    """AdamW over the trainable parameters (LoRA adapters only when peft froze the base).

    The fused implementation (one kernel over all parameters) is used where torch has it for
    the parameters' device and dtype; otherwise the multi-tensor (``foreach``) one.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("make_optimizer: the model has no trainable parameters")
    fused = all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params)
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=betas, fused=fused or None, foreach=None if fused else True)


def warmup_cosine(optimizer, warmup_steps: int, total_steps: int, min_ratio: float = 0.1):
    """Linear warm-up then cosine decay to ``min_ratio`` of the base learning rate."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / max(1, warmup_steps)
        t = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * t))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def dist_info() -> tuple[int, int]:
    """``(rank, world_size)`` of the default process group, ``(0, 1)`` without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def wrap_ddp(model):
    """Wrap in ``DistributedDataParallel`` when a process group is initialised."""
    if dist_info()[1] == 1:
        return model
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [model.device.index] if getattr(model, "device", torch.device("cpu")).type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids)


def all_reduce_mean(values: Mapping[str, float]) -> dict[str, float]:
    """Average scalar metrics over ranks (identity without a process group)."""
    if dist_info()[1] == 1 or not values:
        return dict(values)
    keys = sorted(values)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64)
    dist.all_reduce(t)
    t /= dist.get_world_size()
    return dict(zip(keys, t.tolist()))


def save_checkpoint(path: str, state: dict) -> None:
    """Write ``state`` with ``torch.save`` atomically (temporary file + rename)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: str) -> dict | None:
    """The state saved at ``path``, or ``None`` when there is none."""
    if not os.path.exists(path):
        return None
    return torch.load(path, map_location="cpu", weights_only=False)


def rng_state() -> dict:
    return {"python": random.getstate(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])


class CSVMetrics:
    """Append rows of scalar metrics to a CSV file; the header grows when new keys appear.

    Args:
        path: the CSV file; ``None`` keeps rows in memory only.
    """

    def __init__(self, path: str | None = None):
        self.path, self.rows = path, []
        if path and os.path.exists(path):
            with open(path, newline="") as f:
                self.rows = [{k: float(v) for k, v in r.items() if v != ""} for r in csv.DictReader(f)]

    def log(self, row: Mapping[str, float]) -> None:
        self.rows.append({k: float(v) for k, v in row.items()})
        if self.path:
            self._write()

    def truncate(self, step: int) -> None:
        """Drop rows logged after ``step`` (a resumed run rewrites them)."""
        self.rows = [r for r in self.rows if r.get("step", 0) <= step]
        if self.path:
            self._write()

    def _write(self) -> None:
        cols: list[str] = []
        for r in self.rows:
            cols += [k for k in r if k not in cols]
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        tmp = self.path + ".tmp"
        with open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=cols)
            w.writeheader()
            w.writerows(self.rows)
        os.replace(tmp, self.path)
