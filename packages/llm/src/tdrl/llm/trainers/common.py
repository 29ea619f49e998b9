"""Pieces shared by the LLM trainers: optimiser and schedule, data parallelism, and the glue
to :mod:`tdrl.core.train` (atomic checkpoints, metric history, CSV logs)."""

from __future__ import annotations

import logging
import math
import numbers
import os
import random
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist

from tdrl.core.train import CSVLogger, Logger, MetricHistory, load_checkpoint, truncate_csv
from tdrl.llm.trainers.host_memory import adamw_state_in_huge_pages

__all__ = [
    "make_optimizer",
    "warmup_cosine",
    "dist_info",
    "wrap_ddp",
    "all_reduce_mean",
    "checkpoint_file",
    "load_if_exists",
    "metric_history",
    "set_seed",
    "check_int",
    "check_number",
    "check_update_settings",
    "set_gradient_checkpointing",
    "tied_embedding_sparse_grad",
]

log = logging.getLogger(__name__)


def check_int(owner: str, name: str, value, minimum: int) -> None:
    """Raise ``ValueError`` unless ``value`` is an ``int`` (not a bool) ``>= minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{owner}.{name}={value!r}: expected an integer >= {minimum}")


def check_number(owner: str, name: str, value, *, gt: float | None = None, ge: float | None = None,
                 le: float | None = None, allow_inf: bool = False) -> None:
    """Raise ``ValueError`` unless ``value`` is a real number (finite unless ``allow_inf``) within the bounds."""
    bounds = [f"> {gt:g}" if gt is not None else "", f">= {ge:g}" if ge is not None else "",
              f"<= {le:g}" if le is not None else ""]
    want = " and ".join(b for b in bounds if b)
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and not math.isnan(value)
    ok = ok and (allow_inf or math.isfinite(value))
    ok = ok and (gt is None or value > gt) and (ge is None or value >= ge) and (le is None or value <= le)
    if not ok:
        kind = "a number" if allow_inf else "a finite number"
        raise ValueError(f"{owner}.{name}={value!r}: expected {kind}" + (f" {want}" if want else ""))


def check_update_settings(owner: str, cfg) -> None:
    """The settings every trainer's config has, checked alike: ``steps``, ``grad_accum``,
    ``warmup_steps``, ``checkpoint_every``, ``seed``, ``log_every`` (integers) and the
    optimiser's ``lr``, ``weight_decay`` (``>= 0``) and ``max_grad_norm`` (``> 0``, may be inf)."""
    for name, minimum in (("steps", 1), ("grad_accum", 1), ("warmup_steps", 0), ("checkpoint_every", 1),
                          ("seed", 0), ("log_every", 1)):
        check_int(owner, name, getattr(cfg, name), minimum)
    check_number(owner, "lr", cfg.lr, ge=0)
    check_number(owner, "weight_decay", cfg.weight_decay, ge=0)
    check_number(owner, "max_grad_norm", cfg.max_grad_norm, gt=0, allow_inf=True)


def set_seed(seed: int) -> None:
    """Seed Python's and torch's generators."""
    random.seed(seed)
    torch.manual_seed(seed)


def make_optimizer(model, lr: float, weight_decay: float = 0.0, betas=(0.9, 0.99)) -> torch.optim.AdamW:
    """AdamW over the trainable parameters (LoRA adapters only when peft froze the base).

    The fused implementation (one kernel over all parameters) is used where torch has it for
    the parameters' device and dtype; otherwise the multi-tensor (``foreach``) one. On a CPU the
    moments are allocated up front in transparent huge pages
    (:func:`tdrl.llm.trainers.host_memory.adamw_state_in_huge_pages`).
    """
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("make_optimizer: the model has no trainable parameters")
    fused = all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=betas, fused=fused or None, foreach=None if fused else True)
    adamw_state_in_huge_pages(opt)  # CPU: the moments in 2 MiB pages (cheap after a reward worker's fork)
    return opt


def warmup_cosine(optimizer, warmup_steps: int, total_steps: int, min_ratio: float = 0.1):
    """Linear warm-up then cosine decay to ``min_ratio`` of the base learning rate."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / max(1, warmup_steps)
        t = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * t))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


@contextmanager
def tied_embedding_sparse_grad(model, enabled: bool = True):
    """Inside: a trainable input embedding tied to the LM head gives its gradient as a sparse
    tensor (the rows of the tokens seen), which autograd adds into the head's dense gradient, in
    place. Without it, the embedding's backward fills a dense ``[vocab, hidden]`` zero tensor
    (113 MB for SmolLM2-135M) at the end of the backward, when every other gradient is alive:
    the peak. The weight's ``.grad`` stays dense (the head always contributes one). Nothing
    changes for an untied, frozen or non-``nn.Embedding`` input embedding, or with
    ``enabled=False`` (DDP / FSDP: their gradient hooks expect dense gradients)."""
    base = model.module if hasattr(model, "module") else model
    emb = base.get_input_embeddings() if hasattr(base, "get_input_embeddings") else None
    out = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    switch = (enabled and isinstance(emb, torch.nn.Embedding) and not emb.sparse and out is not None
              and getattr(out, "weight", None) is emb.weight and emb.weight.requires_grad)
    if switch:
        emb.sparse = True
    try:
        yield
    finally:
        if switch:
            emb.sparse = False


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


def all_reduce_sum(value: float) -> float:
    """Sum of a scalar over ranks (identity without a process group)."""
    if dist_info()[1] == 1:
        return float(value)
    t = torch.tensor([float(value)], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t.item())


def checkpoint_file(path: str | os.PathLike, rank: int, world_size: int) -> str:
    """The checkpoint file of this rank: ``path``, or ``path.rank<r>`` under data parallelism."""
    path = os.fspath(path)
    return f"{path}.rank{rank}" if world_size > 1 else path


def load_if_exists(path: str | os.PathLike) -> dict | None:
    """The checkpoint at ``path`` (:func:`tdrl.core.train.load_checkpoint`), or ``None``."""
    return load_checkpoint(path) if os.path.exists(path) else None


def metric_history(log_dir: str | os.PathLike | None, step: int, rank: int, loggers: Sequence[Logger] = (), hparams: Mapping | None = None) -> MetricHistory:
    """The trainer's :class:`tdrl.core.train.MetricHistory`.

    On rank 0 it forwards rows to ``loggers`` and, with ``log_dir``, to a
    :class:`tdrl.core.train.CSVLogger` writing ``<log_dir>/metrics.csv`` (and ``hparams.json``);
    rows after ``step`` (the resumed step; 0 for a fresh run) are first dropped from that file.
    Other ranks keep rows in memory only.
    """
    if rank != 0:
        return MetricHistory()
    loggers = list(loggers)
    if log_dir is not None:
        log_dir = Path(log_dir)
        truncate_csv(log_dir / "metrics.csv", step)
        csv_logger = CSVLogger(log_dir.parent, log_dir.name)
        if hparams is not None:
            csv_logger.log_hparams(hparams)
        loggers.insert(0, csv_logger)
    return MetricHistory(loggers)


def set_gradient_checkpointing(model, on: bool) -> None:
    """Turn activation recomputation of a ``transformers`` model (or a peft model around one) on
    (``on=False`` leaves the model as it is, as TRL does). On, each decoder layer keeps only its input in the forward pass and runs again in the
    backward pass (non-reentrant ``torch.utils.checkpoint``): the update's activation memory falls
    from every layer's intermediates to one layer's, for about one more forward pass of time.
    Generation and no-grad scoring are unaffected (``transformers`` checkpoints only with grad on).

    Raises:
        TypeError: ``on`` for a model without ``gradient_checkpointing_enable``.
    """
    if not on:
        return
    if not hasattr(model, "gradient_checkpointing_enable"):
        raise TypeError(f"gradient_checkpointing=True needs a transformers model with gradient_checkpointing_enable(); "
                        f"got {type(model).__name__}")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
