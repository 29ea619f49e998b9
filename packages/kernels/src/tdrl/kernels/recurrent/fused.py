"""Fused GRU / LSTM sequences: one input GEMM for all steps, a tight loop for the rest.

Forward: the input projections of all ``T`` steps are one ``[N*T, F] x [F, G*H]`` GEMM; the
loop over time then does one ``[N, H] x [H, G*H]`` GEMM and the gate arithmetic per step and
keeps the activated gates. Backward is hand-written back-propagation through time (no
autograd graph of ``T`` cells): one GEMM per step for the state gradient, and the weight
gradients as three large GEMMs over all steps at the end. The recurrence of the forward pass
is a parameter, so the Triton kernel (``triton.py``) reuses this backward.

Saved per step (``sv``, ``[N, T, 4H]``): GRU ``r, z, n, (W_hn h + b_hn)``; LSTM the
activated ``i, f, g, o``. Same semantics as ``reference.py`` (tested against it).

Stacked networks (seeds trained as one model): every tensor may carry one leading dim ``S``
(``x`` ``[S, N, T, F]``, states ``[S, N, H]``, ``keep`` ``[S, N, T]``, weights ``[S, G*H, F]``,
biases ``[S, G*H]``); network ``s`` runs on block ``s``, every GEMM becomes one batched GEMM
over ``S`` (``baddbmm``) and the gate arithmetic is shared: the same code, not a second copy.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

__all__ = ["gru_fused", "gru_loop_torch", "lstm_fused", "lstm_loop_torch"]


def _addmm(c: Tensor, a: Tensor, w: Tensor) -> Tensor:
    """``c + a @ w``: ``addmm`` for one network, ``baddbmm`` over a leading stack dim (``w``
    ``[S, K, M]``, ``a`` ``[S, R, K]``; a bias ``c`` ``[S, M]`` broadcasts over the rows)."""
    if w.dim() == 2:
        return torch.addmm(c, a, w)
    return torch.baddbmm(c.unsqueeze(-2) if c.dim() == 2 else c, a, w)


def _t(w: Tensor) -> Tensor:
    return w.transpose(-1, -2)


def gru_loop_torch(gi: Tensor, h0: Tensor, keep: Tensor, w_hh: Tensor, b_hh: Tensor):
    """The GRU recurrence given the input projections ``gi`` ``[N, T, 3H]`` (biases in).

    Returns ``(hs [N, T, H], sv [N, T, 4H])``.
    """
    *lead, t_len, h3 = gi.shape
    H = h3 // 3
    hs = gi.new_empty(*lead, t_len, H)
    sv = gi.new_empty(*lead, t_len, 4 * H)
    w_t = _t(w_hh)
    h = h0
    for t in range(t_len):
        hp = h * keep[..., t : t + 1]
        gh = _addmm(b_hh, hp, w_t)
        git = gi[..., t, :]
        rz = torch.sigmoid(git[..., : 2 * H] + gh[..., : 2 * H])
        r, z = rz[..., :H], rz[..., H:]
        ghn = gh[..., 2 * H :]
        nn_ = torch.tanh(torch.addcmul(git[..., 2 * H :], r, ghn))
        h = torch.addcmul(nn_, z, hp - nn_)  # (1 - z) n + z h
        hs[..., t, :] = h
        svt = sv[..., t, :]
        svt[..., : 2 * H] = rz
        svt[..., 2 * H : 3 * H] = nn_
        svt[..., 3 * H :] = ghn
    return hs, sv


def lstm_loop_torch(gi: Tensor, h0: Tensor, c0: Tensor, keep: Tensor, w_hh: Tensor, b_hh: Tensor):
    """The LSTM recurrence given ``gi`` ``[N, T, 4H]``: ``(hs, cs [N, T, H], sv [N, T, 4H])``."""
    *lead, t_len, h4 = gi.shape
    H = h4 // 4
    hs, cs = gi.new_empty(*lead, t_len, H), gi.new_empty(*lead, t_len, H)
    sv = gi.new_empty(*lead, t_len, 4 * H)
    w_t = _t(w_hh)
    b = b_hh.unsqueeze(-2) if b_hh.dim() == 2 else b_hh
    h, c = h0, c0
    for t in range(t_len):
        k = keep[..., t : t + 1]
        hp, cp = h * k, c * k
        gates = _addmm(gi[..., t, :], hp, w_t) + b
        svt = sv[..., t, :]
        svt[..., : 2 * H] = torch.sigmoid(gates[..., : 2 * H])
        svt[..., 2 * H : 3 * H] = torch.tanh(gates[..., 2 * H : 3 * H])
        svt[..., 3 * H :] = torch.sigmoid(gates[..., 3 * H :])
        i, f, g, o = svt[..., :H], svt[..., H : 2 * H], svt[..., 2 * H : 3 * H], svt[..., 3 * H :]
        c = torch.addcmul(f * cp, i, g)
        h = o * torch.tanh(c)
        hs[..., t, :], cs[..., t, :] = h, c
    return hs, cs, sv


def _previous(states: Tensor, first: Tensor, keep: Tensor) -> Tensor:
    """``[N, T, H]`` state entering every step, after the reset: ``(first, states[:, :-1]) * keep``."""
    return torch.cat([first.unsqueeze(-2), states[..., :-1, :]], -2) * keep.unsqueeze(-1)


def _input_grads(ctx, dgi: Tensor, dgh: Tensor, hp_all: Tensor):
    x, w_ih = ctx.x, ctx.w_ih
    need = ctx.needs_input_grad
    g, lead = dgi.shape[-1], w_ih.shape[:-2]  # lead: the stack dim of stacked networks, or none
    dgi2, dgh2 = dgi.reshape(*lead, -1, g), dgh.reshape(*lead, -1, g)
    dx = (dgi2 @ w_ih).view_as(x) if need[0] else None
    dw_ih = _t(dgi2) @ x.reshape(*lead, -1, x.shape[-1]) if need[ctx.i_wih] else None
    dw_hh = _t(dgh2) @ hp_all.reshape(*lead, -1, hp_all.shape[-1]) if need[ctx.i_wih + 1] else None
    db_ih = dgi2.sum(-2) if need[ctx.i_wih + 2] else None
    db_hh = dgh2.sum(-2) if need[ctx.i_wih + 3] else None
    return dx, dw_ih, dw_hh, db_ih, db_hh


class _GRUSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, h0, keep, w_ih, w_hh, b_ih, b_hh, loop: Callable):
        gi = _addmm(b_ih, x.reshape(*w_ih.shape[:-2], -1, x.shape[-1]), _t(w_ih)).view(*x.shape[:-1], -1)
        hs, sv = loop(gi, h0, keep, w_hh, b_hh)
        ctx.save_for_backward(x, h0, keep, w_ih, w_hh, hs, sv)
        ctx.i_wih = 3
        return hs

    @staticmethod
    @once_differentiable
    def backward(ctx, g_hs):
        x, h0, keep, w_ih, w_hh, hs, sv = ctx.saved_tensors
        ctx.x, ctx.w_ih, ctx.w_hh = x, w_ih, w_hh
        *lead, t_len, H = hs.shape
        hp_all = _previous(hs, h0, keep)
        dgi = hs.new_empty(*lead, t_len, 3 * H)
        dgh = hs.new_empty(*lead, t_len, 3 * H)
        dh = torch.zeros_like(h0)
        for t in range(t_len - 1, -1, -1):
            dh = dh + g_hs[..., t, :]
            svt = sv[..., t, :]
            r, z, nn_, ghn = svt[..., :H], svt[..., H : 2 * H], svt[..., 2 * H : 3 * H], svt[..., 3 * H :]
            hp = hp_all[..., t, :]
            dpn = dh * (1 - z) * (1 - nn_ * nn_)
            dpr = dpn * ghn * r * (1 - r)
            dpz = dh * (hp - nn_) * z * (1 - z)
            dgit, dght = dgi[..., t, :], dgh[..., t, :]
            dgit[..., :H] = dpr
            dgit[..., H : 2 * H] = dpz
            dgit[..., 2 * H :] = dpn
            dght[..., : 2 * H] = dgit[..., : 2 * H]
            dght[..., 2 * H :] = dpn * r
            dh = _addmm(dh * z, dght, w_hh) * keep[..., t : t + 1]
        dx, dw_ih, dw_hh, db_ih, db_hh = _input_grads(ctx, dgi, dgh, hp_all)
        return dx, dh, None, dw_ih, dw_hh, db_ih, db_hh, None


class _LSTMSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, h0, c0, keep, w_ih, w_hh, b_ih, b_hh, loop: Callable):
        gi = _addmm(b_ih, x.reshape(*w_ih.shape[:-2], -1, x.shape[-1]), _t(w_ih)).view(*x.shape[:-1], -1)
        hs, cs, sv = loop(gi, h0, c0, keep, w_hh, b_hh)
        ctx.save_for_backward(x, h0, c0, keep, w_ih, w_hh, hs, cs, sv)
        ctx.i_wih = 4
        return hs, cs

    @staticmethod
    @once_differentiable
    def backward(ctx, g_hs, g_cs):
        x, h0, c0, keep, w_ih, w_hh, hs, cs, sv = ctx.saved_tensors
        ctx.x, ctx.w_ih, ctx.w_hh = x, w_ih, w_hh
        *lead, t_len, H = hs.shape
        hp_all = _previous(hs, h0, keep)
        cp_all = _previous(cs, c0, keep)
        dg = hs.new_empty(*lead, t_len, 4 * H)
        dh, dc = torch.zeros_like(h0), torch.zeros_like(c0)
        for t in range(t_len - 1, -1, -1):
            dh = dh + g_hs[..., t, :]
            dc = dc + g_cs[..., t, :]
            svt = sv[..., t, :]
            i, f, g, o = svt[..., :H], svt[..., H : 2 * H], svt[..., 2 * H : 3 * H], svt[..., 3 * H :]
            tc = torch.tanh(cs[..., t, :])
            dc = dc + dh * o * (1 - tc * tc)
            dgt = dg[..., t, :]
            dgt[..., :H] = dc * g * i * (1 - i)
            dgt[..., H : 2 * H] = dc * cp_all[..., t, :] * f * (1 - f)
            dgt[..., 2 * H : 3 * H] = dc * i * (1 - g * g)
            dgt[..., 3 * H :] = dh * tc * o * (1 - o)
            k = keep[..., t : t + 1]
            dh = (dgt @ w_hh) * k
            dc = dc * f * k
        dx, dw_ih, dw_hh, db_ih, db_hh = _input_grads(ctx, dg, dg, hp_all)
        return dx, dh, dc, None, dw_ih, dw_hh, db_ih, db_hh, None


def gru_fused(x, h0, keep, w_ih, w_hh, b_ih, b_hh, loop=gru_loop_torch) -> Tensor:
    """GRU sequence (``keep = 1 - is_init`` as ``x``'s dtype, biases given): ``[N, T, H]``."""
    return _GRUSequence.apply(x, h0, keep, w_ih, w_hh, b_ih, b_hh, loop)


def lstm_fused(x, h0, c0, keep, w_ih, w_hh, b_ih, b_hh, loop=lstm_loop_torch):
    """LSTM sequence (as :func:`gru_fused`): ``(hs, cs)``, each ``[N, T, H]``."""
    return _LSTMSequence.apply(x, h0, c0, keep, w_ih, w_hh, b_ih, b_hh, loop)
