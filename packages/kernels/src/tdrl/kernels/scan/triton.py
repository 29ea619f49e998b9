"""Triton reverse linear scan on rows ``[N, T]``: ``y[t] = d[t] + c[t] * y[t + 1]``.

Each program owns ``BLOCK_N`` rows and walks time backwards in tiles of ``BLOCK_T`` steps.
A tile is loaded with reversed time offsets (coalesced: ``T`` is contiguous) and scanned
with ``tl.associative_scan`` over the composition of affine maps ``y -> d + c * y``; the
value at the tile's earliest step carries into the next tile. Float32 arithmetic; float64
rows fall back to the torch reference.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._dispatch import interpreting
from .reference import reverse_scan_rows

BLOCK_N, BLOCK_T = 16, 128  # largest tile; small inputs get a smaller one


@triton.jit
def _compose_affine(c_prev, d_prev, c_new, d_new):
    # (y -> d_new + c_new * y) after (y -> d_prev + c_prev * y)
    return c_new * c_prev, d_new + c_new * d_prev


@triton.jit
def _reverse_scan_kernel(
    d_ptr, c_ptr, y_ptr, n_rows, t_len,
    BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < n_rows
    cols = tl.arange(0, BLOCK_T)
    row_off = rows[:, None].to(tl.int64) * t_len
    carry = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, t_len, BLOCK_T):
        t = t_len - 1 - start - cols
        mask = row_mask[:, None] & (t[None, :] >= 0)
        off = row_off + t[None, :]
        d = tl.load(d_ptr + off, mask=mask, other=0.0).to(tl.float32)
        c = tl.load(c_ptr + off, mask=mask, other=1.0).to(tl.float32)
        acc_c, acc_d = tl.associative_scan((c, d), 1, _compose_affine)
        y = acc_d + acc_c * carry[:, None]
        tl.store(y_ptr + off, y.to(y_ptr.dtype.element_ty), mask=mask)
        carry = tl.sum(tl.where(cols[None, :] == BLOCK_T - 1, y, 0.0), 1)


def reverse_scan_rows_triton(d: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """Triton version of :func:`tdrl.kernels.scan.reference.reverse_scan_rows`.

    Args:
        d: ``[N, T]`` float32 inputs (float64 is delegated to the torch reference).
        c: ``[N, T]`` decays.

    Returns:
        ``[N, T]`` tensor ``y`` of ``d``'s dtype.
    """
    if d.dtype == torch.float64:
        return reverse_scan_rows(d, c)
    d = d.contiguous()
    c = c.to(d.dtype).contiguous()
    n, t_len = d.shape
    y = torch.empty_like(d)
    if n == 0 or t_len == 0:
        return y
    block_n = min(BLOCK_N, triton.next_power_of_2(n))
    block_t = min(BLOCK_T, triton.next_power_of_2(t_len))
    opts = {} if interpreting() else {"num_warps": 4}
    grid = (triton.cdiv(n, block_n),)
    _reverse_scan_kernel[grid](d, c, y, n, t_len, BLOCK_N=block_n, BLOCK_T=block_t, **opts)
    return y
