"""Triton recurrence of the GRU / LSTM sequence ops: one launch for all ``T`` steps.

Each program owns ``BLOCK_N`` rows and walks time forwards. The hidden weights are loaded
once per program as ``[H, H]`` tiles per gate (``W^T``), and every step does one ``tl.dot``
per gate on the program's ``[BLOCK_N, H]`` state, adds the precomputed input projections
(``gi``, one GEMM outside), applies the reset mask and the gate arithmetic, and writes the
state and the activated gates that the hand-written backward (``fused.py``) reads.
The state never leaves registers between steps. ``H`` must be a power of two in
``[16, 128]`` (``tl.dot`` tiles; all gate tiles stay resident); other sizes and float64
use the torch loop. Float32 arithmetic, ``tl.dot`` in IEEE precision (no TF32), so the
kernel matches the reference to float32 rounding.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._dispatch import interpreting
from .fused import gru_loop_torch, lstm_loop_torch

BLOCK_N = 16


@triton.jit
def _sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def _tanh(x):
    return 2.0 * _sigmoid(2.0 * x) - 1.0


@triton.jit
def _w_tile(w_ptr, gate, cols_k, cols_j, H: tl.constexpr):
    # W^T tile of one gate: element (k, j) = W[gate * H + j, k]; W is [G*H, H] row-major
    return tl.load(w_ptr + (gate * H + cols_j[None, :]) * H + cols_k[:, None])


@triton.jit
def _gru_kernel(
    gi_ptr, h0_ptr, keep_ptr, w_ptr, b_ptr, hs_ptr, sv_ptr, n_rows, t_len,
    H: tl.constexpr, BLOCK_N: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < n_rows
    cols = tl.arange(0, H)
    m2 = rmask[:, None]
    wr = _w_tile(w_ptr, 0, cols, cols, H)
    wz = _w_tile(w_ptr, 1, cols, cols, H)
    wn = _w_tile(w_ptr, 2, cols, cols, H)
    br = tl.load(b_ptr + cols)
    bz = tl.load(b_ptr + H + cols)
    bn = tl.load(b_ptr + 2 * H + cols)
    r64 = rows.to(tl.int64)
    h = tl.load(h0_ptr + r64[:, None] * H + cols[None, :], mask=m2, other=0.0).to(tl.float32)
    for t in range(t_len):
        keep = tl.load(keep_ptr + r64 * t_len + t, mask=rmask, other=0.0).to(tl.float32)
        h = h * keep[:, None]
        step = r64[:, None] * t_len + t
        gbase = gi_ptr + step * (3 * H) + cols[None, :]
        gir = tl.load(gbase, mask=m2, other=0.0)
        giz = tl.load(gbase + H, mask=m2, other=0.0)
        gin = tl.load(gbase + 2 * H, mask=m2, other=0.0)
        r = _sigmoid(gir + tl.dot(h, wr, input_precision="ieee") + br[None, :])
        z = _sigmoid(giz + tl.dot(h, wz, input_precision="ieee") + bz[None, :])
        ghn = tl.dot(h, wn, input_precision="ieee") + bn[None, :]
        n = _tanh(gin + r * ghn)
        h = n + z * (h - n)
        tl.store(hs_ptr + step * H + cols[None, :], h, mask=m2)
        sbase = sv_ptr + step * (4 * H) + cols[None, :]
        tl.store(sbase, r, mask=m2)
        tl.store(sbase + H, z, mask=m2)
        tl.store(sbase + 2 * H, n, mask=m2)
        tl.store(sbase + 3 * H, ghn, mask=m2)


@triton.jit
def _lstm_kernel(
    gi_ptr, h0_ptr, c0_ptr, keep_ptr, w_ptr, b_ptr, hs_ptr, cs_ptr, sv_ptr, n_rows, t_len,
    H: tl.constexpr, BLOCK_N: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < n_rows
    cols = tl.arange(0, H)
    m2 = rmask[:, None]
    wi = _w_tile(w_ptr, 0, cols, cols, H)
    wf = _w_tile(w_ptr, 1, cols, cols, H)
    wg = _w_tile(w_ptr, 2, cols, cols, H)
    wo = _w_tile(w_ptr, 3, cols, cols, H)
    bi = tl.load(b_ptr + cols)
    bf = tl.load(b_ptr + H + cols)
    bg = tl.load(b_ptr + 2 * H + cols)
    bo = tl.load(b_ptr + 3 * H + cols)
    r64 = rows.to(tl.int64)
    off0 = r64[:, None] * H + cols[None, :]
    h = tl.load(h0_ptr + off0, mask=m2, other=0.0).to(tl.float32)
    c = tl.load(c0_ptr + off0, mask=m2, other=0.0).to(tl.float32)
    for t in range(t_len):
        keep = tl.load(keep_ptr + r64 * t_len + t, mask=rmask, other=0.0).to(tl.float32)
        h = h * keep[:, None]
        c = c * keep[:, None]
        step = r64[:, None] * t_len + t
        gbase = gi_ptr + step * (4 * H) + cols[None, :]
        i = _sigmoid(tl.load(gbase, mask=m2, other=0.0) + tl.dot(h, wi, input_precision="ieee") + bi[None, :])
        f = _sigmoid(tl.load(gbase + H, mask=m2, other=0.0) + tl.dot(h, wf, input_precision="ieee") + bf[None, :])
        g = _tanh(tl.load(gbase + 2 * H, mask=m2, other=0.0) + tl.dot(h, wg, input_precision="ieee") + bg[None, :])
        o = _sigmoid(tl.load(gbase + 3 * H, mask=m2, other=0.0) + tl.dot(h, wo, input_precision="ieee") + bo[None, :])
        c = f * c + i * g
        h = o * _tanh(c)
        tl.store(hs_ptr + step * H + cols[None, :], h, mask=m2)
        tl.store(cs_ptr + step * H + cols[None, :], c, mask=m2)
        sbase = sv_ptr + step * (4 * H) + cols[None, :]
        tl.store(sbase, i, mask=m2)
        tl.store(sbase + H, f, mask=m2)
        tl.store(sbase + 2 * H, g, mask=m2)
        tl.store(sbase + 3 * H, o, mask=m2)


def _fits(H: int, dtype: torch.dtype) -> bool:
    return dtype == torch.float32 and 16 <= H <= 128 and (H & (H - 1)) == 0


def _launch_opts() -> dict:
    return {} if interpreting() else {"num_warps": 4}


def gru_loop_triton(gi, h0, keep, w_hh, b_hh):
    """Triton version of :func:`tdrl.kernels.recurrent.fused.gru_loop_torch`."""
    n, t_len, h3 = gi.shape
    H = h3 // 3
    if not _fits(H, gi.dtype) or n == 0 or t_len == 0:
        return gru_loop_torch(gi, h0, keep, w_hh, b_hh)
    gi, h0, keep = gi.contiguous(), h0.contiguous(), keep.contiguous()
    hs = gi.new_empty(n, t_len, H)
    sv = gi.new_empty(n, t_len, 4 * H)
    grid = (triton.cdiv(n, BLOCK_N),)
    _gru_kernel[grid](
        gi, h0, keep, w_hh.contiguous(), b_hh.contiguous(), hs, sv, n, t_len,
        H=H, BLOCK_N=BLOCK_N, **_launch_opts(),
    )  # fmt: skip
    return hs, sv


def lstm_loop_triton(gi, h0, c0, keep, w_hh, b_hh):
    """Triton version of :func:`tdrl.kernels.recurrent.fused.lstm_loop_torch`."""
    n, t_len, h4 = gi.shape
    H = h4 // 4
    if not _fits(H, gi.dtype) or n == 0 or t_len == 0:
        return lstm_loop_torch(gi, h0, c0, keep, w_hh, b_hh)
    gi, h0, c0, keep = gi.contiguous(), h0.contiguous(), c0.contiguous(), keep.contiguous()
    hs, cs = gi.new_empty(n, t_len, H), gi.new_empty(n, t_len, H)
    sv = gi.new_empty(n, t_len, 4 * H)
    grid = (triton.cdiv(n, BLOCK_N),)
    _lstm_kernel[grid](
        gi, h0, c0, keep, w_hh.contiguous(), b_hh.contiguous(), hs, cs, sv, n, t_len,
        H=H, BLOCK_N=BLOCK_N, **_launch_opts(),
    )  # fmt: skip
    return hs, cs, sv
