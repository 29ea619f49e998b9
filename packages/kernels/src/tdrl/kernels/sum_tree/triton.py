"""Triton sum/min tree kernels over the flat heap layout of :mod:`.reference`.

* ``_find_kernel``: one program per ``BLOCK`` masses; each lane descends the ``depth``
  levels (two loads per level), going right when ``mass >= sums[left]`` and the right
  subtree is not empty, exactly as the reference.
* ``_update_kernel``: writes the (already de-duplicated, last write wins) leaves, then
  recomputes the ancestors level by level. A level may only be computed once the level below
  is final, so for a small batch one program does every level with a block barrier between
  them (one launch); a large batch launches one grid per level instead. Parents shared by
  several updated leaves are written several times with identical values.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._dispatch import interpreting
from .reference import tree_depth, last_writes

BLOCK = 1024
ONE_PROGRAM_MAX = 16384  # up to this many leaves, one program updates every level


@triton.jit
def _find_kernel(sums_ptr, mass_ptr, out_ptr, k, depth, p, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < k
    m = tl.load(mass_ptr + offs, mask=mask, other=0.0).to(sums_ptr.dtype.element_ty)
    node = tl.full([BLOCK], 1, dtype=tl.int64)
    for _ in range(depth):
        left = tl.load(sums_ptr + 2 * node, mask=mask, other=0.0)
        right = tl.load(sums_ptr + 2 * node + 1, mask=mask, other=0.0)
        go_right = (m >= left) & (right > 0)
        m = tl.where(go_right, m - left, m)
        node = 2 * node + go_right.to(tl.int64)
    tl.store(out_ptr + offs, node - p, mask=mask)


@triton.jit
def _update_kernel(sums_ptr, mins_ptr, idx_ptr, val_ptr, k, p, level_lo, level_hi,
                   BLOCK: tl.constexpr, WRITE_LEAVES: tl.constexpr, BARRIER: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    n_chunks = 1
    if BARRIER:
        n_chunks = tl.cdiv(k, BLOCK)
    if WRITE_LEAVES:
        for c in range(n_chunks):
            offs = (pid + c) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < k
            leaf = tl.load(idx_ptr + offs, mask=mask, other=0) + p
            val = tl.load(val_ptr + offs, mask=mask, other=0.0).to(sums_ptr.dtype.element_ty)
            tl.store(sums_ptr + leaf, val, mask=mask)
            tl.store(mins_ptr + leaf, tl.where(val > 0, val, float("inf")), mask=mask)
        if BARRIER:
            tl.debug_barrier()
    for level in range(level_lo, level_hi):
        for c in range(n_chunks):
            offs = (pid + c) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < k
            node = (tl.load(idx_ptr + offs, mask=mask, other=0) + p) >> (level + 1)
            ls = tl.load(sums_ptr + 2 * node, mask=mask, other=0.0, volatile=True)
            rs = tl.load(sums_ptr + 2 * node + 1, mask=mask, other=0.0, volatile=True)
            lm = tl.load(mins_ptr + 2 * node, mask=mask, other=0.0, volatile=True)
            rm = tl.load(mins_ptr + 2 * node + 1, mask=mask, other=0.0, volatile=True)
            tl.store(sums_ptr + node, ls + rs, mask=mask)
            tl.store(mins_ptr + node, tl.minimum(lm, rm), mask=mask)
        if BARRIER:
            tl.debug_barrier()


def _opts() -> dict:
    return {} if interpreting() else {"num_warps": 4}


def sum_tree_find_triton(sums: torch.Tensor, mass: torch.Tensor) -> torch.Tensor:
    """Triton version of :func:`.reference.sum_tree_find_reference` (same arguments)."""
    depth = tree_depth(sums)
    p = sums.numel() // 2
    mass = mass.reshape(-1).contiguous()
    out = torch.empty(mass.numel(), dtype=torch.int64, device=sums.device)
    k = mass.numel()
    if k == 0:
        return out
    block = min(BLOCK, triton.next_power_of_2(k))
    _find_kernel[(triton.cdiv(k, block),)](sums, mass, out, k, depth, p, BLOCK=block, **_opts())
    return out


def sum_tree_update_triton(sums: torch.Tensor, mins: torch.Tensor, index: torch.Tensor,
                           value: torch.Tensor) -> None:
    """Triton version of :func:`.reference.sum_tree_update_reference` (same arguments)."""
    depth = tree_depth(sums)
    p = sums.numel() // 2
    index, value = last_writes(index.reshape(-1), value.reshape(-1).to(sums.dtype))
    index, value = index.contiguous(), value.contiguous()
    k = index.numel()
    if k == 0:
        return
    block = min(BLOCK, triton.next_power_of_2(k))
    if k <= ONE_PROGRAM_MAX:  # one launch: every level in one program, barriers between
        _update_kernel[(1,)](sums, mins, index, value, k, p, 0, depth, BLOCK=block,
                             WRITE_LEAVES=True, BARRIER=True, **_opts())
        return
    grid = (triton.cdiv(k, block),)  # one launch per level: the launch boundary orders them
    _update_kernel[grid](sums, mins, index, value, k, p, 0, 0, BLOCK=block,
                         WRITE_LEAVES=True, BARRIER=False, **_opts())
    for level in range(depth):
        _update_kernel[grid](sums, mins, index, value, k, p, level, level + 1, BLOCK=block,
                             WRITE_LEAVES=False, BARRIER=False, **_opts())
