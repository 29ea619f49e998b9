"""AdamW's moments on a CPU in transparent huge pages.

A GRPO round forks a worker process for each timed reward call
(:mod:`tdrl.llm.rewards.workers`). After a fork every page of the trainer is copy-on-write, so the
optimiser step that follows takes a page fault on each 4 KiB page it writes: for AdamW's two
moments of SmolLM2-135M (1.08 GB) that is ~260,000 faults, ~0.2 s a step on a 2-core box, and the
fork itself copies their page-table entries. Held in 2 MiB pages (``madvise(MADV_HUGEPAGE)``
on one buffer per moment, before its first touch), the same memory is ~520 pages. The moments
are views of those buffers, put in the optimiser's state before its first step (AdamW then
finds them there and does not allocate its own); the step computes the same numbers.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys

import torch

__all__ = ["adamw_state_in_huge_pages", "huge_page_zeros"]

_HUGE_PAGE = 2 << 20
_MADV_HUGEPAGE = 14


@functools.cache
def _madvise():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None
    fn = libc.madvise
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return fn


def huge_page_zeros(numel: int, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, bool]:
    """A zero-filled 1-D CPU tensor whose memory is asked for in transparent huge pages.

    Args:
        numel: elements.
        dtype: their type.

    Returns:
        ``(tensor, advised)``: ``advised`` says whether the kernel accepted the advice (Linux;
        a tensor under 2 MiB, another platform or a refusal gives ordinary pages).
    """
    size = torch.empty((), dtype=dtype).element_size()
    madvise = _madvise()
    if madvise is None or numel * size < _HUGE_PAGE:
        return torch.zeros(numel, dtype=dtype), False
    raw = torch.empty(numel + _HUGE_PAGE // size, dtype=dtype)  # untouched: no page is backed yet
    start = ((-raw.data_ptr()) % _HUGE_PAGE) // size  # the first 2 MiB boundary inside
    flat = raw[start : start + numel]
    advised = madvise(flat.data_ptr(), numel * size // _HUGE_PAGE * _HUGE_PAGE, _MADV_HUGEPAGE) == 0
    return flat.zero_(), advised


def adamw_state_in_huge_pages(optimizer: torch.optim.AdamW) -> bool:
    """Put AdamW's ``exp_avg`` / ``exp_avg_sq`` of every parameter in two huge-page buffers, in place.

    Done only before the first step, for plain CPU tensors of one floating dtype and without
    ``amsgrad``; otherwise nothing changes.

    Returns:
        Whether the state was placed (and the kernel accepted the advice).
    """
    params = [p for g in optimizer.param_groups for p in g["params"]]
    if (not params or optimizer.state or any(g.get("amsgrad") for g in optimizer.param_groups)
            or any(type(p.data) is not torch.Tensor or p.device.type != "cpu" or not p.is_contiguous() for p in params)
            or len({p.dtype for p in params}) != 1 or not params[0].is_floating_point()):
        return False
    total = sum(p.numel() for p in params)
    exp_avg, ok_a = huge_page_zeros(total, params[0].dtype)
    exp_avg_sq, ok_b = huge_page_zeros(total, params[0].dtype)
    if not (ok_a and ok_b):
        return False  # ordinary pages: let AdamW allocate its own state as usual
    # AdamW's own step counter: float32 for the fused kernel, the default dtype otherwise
    fused = {g.get("fused") for g in optimizer.param_groups}
    step_dtype = torch.float32 if fused == {True} else torch.get_default_dtype()
    start = 0
    for p in params:
        n = p.numel()
        optimizer.state[p] = {"step": torch.zeros((), dtype=step_dtype),
                              "exp_avg": exp_avg[start : start + n].view_as(p),
                              "exp_avg_sq": exp_avg_sq[start : start + n].view_as(p)}
        start += n
    return True
