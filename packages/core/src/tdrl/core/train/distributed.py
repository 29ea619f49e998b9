"""``torch.distributed`` awareness for the run harness: which process writes, and one
decision shared by all ranks.

An app launched by ``torchrun`` (``WORLD_SIZE`` > 1 in the environment) joins the default
process group in :func:`init_from_env` (gloo on CPU, NCCL on CUDA), so ``torchrun
--nproc_per_node 2 app.py`` is one job: rank 0 writes the run folder, every rank trains.
``accelerate launch --multi_gpu --num_processes 2 app.py`` is the same job (accelerate starts it
through ``torch.distributed.run``, which sets ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK``; on a
machine without CUDA the group uses gloo). ``accelerate launch --cpu --num_processes 2`` starts a
single process unless given an MPI hostfile, and MPI ranks are not read here: it is refused.
"""

from __future__ import annotations

import atexit
import datetime
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["init_from_env", "rank_and_world", "is_main_process", "broadcast_object", "main_process_first"]

log = logging.getLogger(__name__)


def rank_and_world() -> tuple[int, int]:
    """``(rank, world_size)`` of the default process group, ``(0, 1)`` without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def is_main_process() -> bool:
    """Rank 0, or the only process."""
    return rank_and_world()[0] == 0


#: Seconds a collective waits for the other ranks before it raises, unless
#: ``TDRL_DIST_TIMEOUT_S`` or ``init_from_env(timeout_s=)`` says otherwise. gloo's and NCCL's
#: own default is 30 minutes: one stopped or deadlocked rank would hang the job that long.
DEFAULT_TIMEOUT_S = 300.0


def _timeout_s(timeout_s: float | None) -> float:
    if timeout_s is None:
        raw = os.environ.get("TDRL_DIST_TIMEOUT_S", "")
        try:
            timeout_s = float(raw) if raw else DEFAULT_TIMEOUT_S
        except ValueError:
            raise ValueError(f"TDRL_DIST_TIMEOUT_S={raw!r} is not a number of seconds (e.g. 300)") from None
    if not timeout_s > 0:
        raise ValueError(f"the process-group timeout must be > 0 seconds, got {timeout_s}")
    return float(timeout_s)


def init_from_env(backend: str | None = None, timeout_s: float | None = None) -> bool:
    """Join the default process group when launched by ``torchrun`` (``WORLD_SIZE`` > 1).

    Args:
        backend: ``None`` picks NCCL when CUDA is available, else gloo.
        timeout_s: how long a collective waits for a stopped or deadlocked rank before it raises
            (ending the job with torch's "timed out" error instead of hanging); ``None`` reads
            ``TDRL_DIST_TIMEOUT_S``, else :data:`DEFAULT_TIMEOUT_S` (5 minutes).

    Returns:
        Whether a process group is initialised now (``False`` for a single process).
    """
    _check_launcher()
    timeout = _timeout_s(timeout_s)  # a bad value is refused on every launch, before any work
    if not dist.is_available() or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False
    if not dist.is_initialized():
        backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout))
        atexit.register(_destroy_at_exit)
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        log.info("joined process group: rank %d of %d (%s, collectives time out after %.0f s)",
                 dist.get_rank(), dist.get_world_size(), backend, timeout)
    return True


def _destroy_at_exit() -> None:
    """Leave the group while the interpreter is whole: a gloo group left to interpreter
    finalisation can abort the process (``terminate called without an active exception``) after
    the work is done, which ``torchrun`` reports as a failed rank."""
    if dist.is_initialized():
        dist.destroy_process_group()


def _check_launcher() -> None:
    """Refuse a multi-process launch whose ranks this module cannot see: ``accelerate launch
    --cpu --num_processes N`` (N > 1) runs one process (or N MPI processes with a hostfile), with
    ``MASTER_ADDR`` set but no ``WORLD_SIZE``."""
    env = os.environ
    if "WORLD_SIZE" in env or env.get("ACCELERATE_USE_CPU", "").lower() not in ("true", "1") or "MASTER_ADDR" not in env:
        return
    raise RuntimeError(
        "launched by `accelerate launch --cpu` with several processes: accelerate then starts one process "
        "(or MPI processes, whose ranks tdrl does not read), not a data-parallel job. On a CPU use "
        "`accelerate launch --multi_gpu --num_processes N app.py` (torch.distributed.run underneath, the gloo "
        "backend without CUDA) or `torchrun --nproc_per_node N app.py`; for one process drop --num_processes."
    )


def broadcast_object(value: Any) -> Any:
    """``value`` as rank 0 has it, on every rank (itself without a process group)."""
    if rank_and_world()[1] == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


@contextmanager
def main_process_first() -> Iterator[bool]:
    """Run the block on rank 0 first, then on the other ranks (which may then read what rank
    0 wrote, e.g. a model folder); yields whether this is rank 0. A single process just runs it."""
    rank, world = rank_and_world()
    if world > 1 and rank != 0:
        dist.barrier()
    try:
        yield rank == 0
    finally:
        if world > 1 and rank == 0:
            dist.barrier()
