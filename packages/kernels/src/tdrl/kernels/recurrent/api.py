"""Public GRU / LSTM sequence ops with ``is_init`` resets, dispatched by backend.

* CUDA tensors with ``triton`` installed (or ``TDRL_KERNELS=triton`` under the interpreter):
  the Triton recurrence kernel for the forward pass, hand-written BPTT for the backward.
* CPU tensors otherwise (``auto`` / ``compile``): the CPU path (``cpu.py``): in-place steps
  on preallocated time-major buffers, hand-written BPTT. For float32 the forward and backward
  time loops are compiled C++ (``cpu_ext.cpp``, built just in time on first use into torch's
  extension cache, ~40 s on two cores, then only loaded); ``TDRL_RECURRENT_EXT=0`` disables
  it, float64 and a failed build (one ``RuntimeWarning``) run the Python loops.
* other devices without Triton: the fused torch path (``fused.py``, the same maths with
  plain ops; also the Triton forward's backward).
* ``TDRL_KERNELS=torch``: the step-by-step reference (``reference.py``), autograd through it.

Stacked networks (seeds trained as one model, ``tdrl.core.train.seeds``): weights with a leading
dim ``S`` (``weight_ih`` ``[S, G*H, F]``) take ``x`` ``[S, N, T, F]``, states ``[S, N, H]`` and
``is_init`` ``[S, N, T]``; network ``s`` runs on block ``s``: on the CPU (float32) through the
compiled loops with every GEMM batched over ``S`` (``bmm``), elsewhere through the fused torch path
(one batched GEMM over ``S`` per step; the reference under ``TDRL_KERNELS=torch``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._dispatch import current_backend, use_triton
from .cpu import gru_cpu, lstm_cpu, stacked_ready
from .fused import gru_fused, gru_loop_torch, lstm_fused, lstm_loop_torch
from .reference import gru_reference, lstm_reference

__all__ = ["gru_sequence", "lstm_sequence"]


def _check(name: str, gates: int, x, states, is_init, w_ih, w_hh, b_ih, b_hh) -> tuple[int, int]:
    lead = tuple(w_hh.shape[:-2])  # (S,) for stacked networks, () for one
    sl, sn = ("[S, " if lead else "["), ("S, " if lead else "")
    if x.dim() != 3 + len(lead) or tuple(x.shape[: len(lead)]) != lead:
        raise ValueError(f"{name}: x must be {sl}N, T, F], got shape {tuple(x.shape)}.")
    n, t_len, f = x.shape[-3:]
    if w_hh.dim() not in (2, 3) or w_hh.shape[-2] != gates * w_hh.shape[-1]:
        raise ValueError(
            f"{name}: weight_hh must be [{sn}{gates}H, H], got shape {tuple(w_hh.shape)}."
        )
    H = w_hh.shape[-1]
    if tuple(w_ih.shape) != (*lead, gates * H, f):
        raise ValueError(
            f"{name}: weight_ih must be [{sn}{gates}H, F] = {[*lead, gates * H, f]}, got {list(w_ih.shape)}."
        )
    for bname, b in (("bias_ih", b_ih), ("bias_hh", b_hh)):
        if b is not None and tuple(b.shape) != (*lead, gates * H):
            raise ValueError(f"{name}: {bname} must be [{sn}{gates * H}], got {list(b.shape)}.")
    for sname, s in states:
        if tuple(s.shape) != (*lead, n, H):
            raise ValueError(f"{name}: {sname} must be {sl}N, H] = {[*lead, n, H]}, got {list(s.shape)}.")
    if tuple(is_init.shape) != (*lead, n, t_len):
        raise ValueError(
            f"{name}: is_init must be {sl}N, T] = {[*lead, n, t_len]}, got {list(is_init.shape)}."
        )
    return H, n


def _biases(x: Tensor, gates_h: int, b_ih, b_hh, lead: tuple = ()) -> tuple[Tensor, Tensor]:
    zero = None
    if b_ih is None or b_hh is None:
        zero = torch.zeros(*lead, gates_h, dtype=x.dtype, device=x.device)
    return (zero if b_ih is None else b_ih), (zero if b_hh is None else b_hh)


def gru_sequence(
    x: Tensor,
    h0: Tensor | None,
    is_init: Tensor | None,
    weight_ih: Tensor,
    weight_hh: Tensor,
    bias_ih: Tensor | None = None,
    bias_hh: Tensor | None = None,
) -> Tensor:
    """One GRU layer (``nn.GRU``'s gates r, z, n) over ``[N, T]`` with episode resets.

    Before step ``t`` the hidden state is zeroed where ``is_init[:, t]`` is True.

    Args:
        x: ``[N, T, F]`` inputs. h0: ``[N, H]`` state before ``t = 0`` (None: zeros).
        is_init: ``[N, T]`` bool (None: no resets).
        weight_ih: ``[3H, F]``; weight_hh: ``[3H, H]``; bias_ih / bias_hh: ``[3H]`` or None
            (``nn.GRU``'s ``weight_ih_l0`` etc.). Stacked networks: every tensor with a
            leading dim ``S`` (see the module docstring).

    Returns:
        ``[N, T, H]`` (stacked: ``[S, N, T, H]``) hidden states after every step.
        Differentiable in all tensor inputs (once: no double backward).

    Raises:
        ValueError: a shape does not match the ones above.
    """
    lead = tuple(weight_hh.shape[:-2])
    n, t_len = x.shape[-3:-1] if x.dim() == 3 + len(lead) else (0, 0)
    H = weight_hh.shape[-1]
    h0 = x.new_zeros(*lead, n, H) if h0 is None else h0
    is_init = torch.zeros(*lead, n, t_len, dtype=torch.bool, device=x.device) if is_init is None else is_init
    _check("gru_sequence", 3, x, [("h0", h0)], is_init, weight_ih, weight_hh, bias_ih, bias_hh)
    if current_backend() == "torch":
        return gru_reference(x, h0, is_init.bool(), weight_ih, weight_hh, bias_ih, bias_hh)
    keep = (~is_init.bool()).to(x.dtype)
    if lead and stacked_ready(x):  # stacked networks on the CPU: the compiled loops, GEMMs batched
        return gru_cpu(x, h0, keep, weight_ih, weight_hh, bias_ih, bias_hh)
    if lead:  # stacked networks elsewhere: the fused path's batched GEMMs
        b_ih, b_hh = _biases(x, 3 * H, bias_ih, bias_hh, lead)
        return gru_fused(x, h0, keep, weight_ih, weight_hh, b_ih, b_hh, gru_loop_torch)
    if use_triton(x, h0, weight_ih, weight_hh):
        from .triton import gru_loop_triton

        b_ih, b_hh = _biases(x, 3 * H, bias_ih, bias_hh)
        return gru_fused(x, h0, keep, weight_ih, weight_hh, b_ih, b_hh, gru_loop_triton)
    if x.device.type == "cpu":
        return gru_cpu(x, h0, keep, weight_ih, weight_hh, bias_ih, bias_hh)
    b_ih, b_hh = _biases(x, 3 * H, bias_ih, bias_hh)
    return gru_fused(x, h0, keep, weight_ih, weight_hh, b_ih, b_hh, gru_loop_torch)


def lstm_sequence(
    x: Tensor,
    h0: Tensor | None,
    c0: Tensor | None,
    is_init: Tensor | None,
    weight_ih: Tensor,
    weight_hh: Tensor,
    bias_ih: Tensor | None = None,
    bias_hh: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """One LSTM layer (``nn.LSTM``'s gates i, f, g, o) over ``[N, T]`` with episode resets.

    Before step ``t`` both ``h`` and ``c`` are zeroed where ``is_init[:, t]`` is True.
    Arguments as :func:`gru_sequence`, with ``c0`` ``[N, H]`` and ``4H`` gate rows.

    Returns:
        ``(h, c)``, each ``[N, T, H]`` (stacked: ``[S, N, T, H]``): hidden (output) and cell
        state after every step.
    """
    lead = tuple(weight_hh.shape[:-2])
    n, t_len = x.shape[-3:-1] if x.dim() == 3 + len(lead) else (0, 0)
    H = weight_hh.shape[-1]
    h0 = x.new_zeros(*lead, n, H) if h0 is None else h0
    c0 = x.new_zeros(*lead, n, H) if c0 is None else c0
    is_init = torch.zeros(*lead, n, t_len, dtype=torch.bool, device=x.device) if is_init is None else is_init
    _check(
        "lstm_sequence", 4, x, [("h0", h0), ("c0", c0)], is_init,
        weight_ih, weight_hh, bias_ih, bias_hh,
    )  # fmt: skip
    if current_backend() == "torch":
        return lstm_reference(x, h0, c0, is_init.bool(), weight_ih, weight_hh, bias_ih, bias_hh)
    keep = (~is_init.bool()).to(x.dtype)
    if lead and stacked_ready(x):  # stacked networks on the CPU: the compiled loops, GEMMs batched
        return lstm_cpu(x, h0, c0, keep, weight_ih, weight_hh, bias_ih, bias_hh)
    if lead:  # stacked networks elsewhere: the fused path's batched GEMMs
        b_ih, b_hh = _biases(x, 4 * H, bias_ih, bias_hh, lead)
        return lstm_fused(x, h0, c0, keep, weight_ih, weight_hh, b_ih, b_hh, lstm_loop_torch)
    if use_triton(x, h0, c0, weight_ih, weight_hh):
        from .triton import lstm_loop_triton

        b_ih, b_hh = _biases(x, 4 * H, bias_ih, bias_hh)
        return lstm_fused(x, h0, c0, keep, weight_ih, weight_hh, b_ih, b_hh, lstm_loop_triton)
    if x.device.type == "cpu":
        return lstm_cpu(x, h0, c0, keep, weight_ih, weight_hh, bias_ih, bias_hh)
    b_ih, b_hh = _biases(x, 4 * H, bias_ih, bias_hh)
    return lstm_fused(x, h0, c0, keep, weight_ih, weight_hh, b_ih, b_hh, lstm_loop_torch)
