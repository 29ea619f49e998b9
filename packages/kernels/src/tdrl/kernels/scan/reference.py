"""Pure-torch reverse discounted scan and GAE over ``[..., T, F]`` (time on dim -2).

The recurrence behind both ops is the first-order linear scan, run backwards in time::

    y[t] = d[t] + c[t] * y[t + 1],      y[T] = 0

with ``d = x`` and ``c = gamma * (1 - done)`` for the discounted cumulative sum, and
``d = delta`` (the TD error) and ``c = gamma * lmbda * (1 - done)`` for GAE
(Schulman et al., 2016, "High-Dimensional Continuous Control Using Generalized Advantage
Estimation").

CPU speed: a plain Python loop over ``T`` costs one small kernel launch per step. Here the
time axis is cut into ``L ~ sqrt(T)`` chunks: stage 1 runs the scan inside every chunk at
once (``L`` steps, each vectorised over all sequences x chunks), stage 2 carries the chunk
boundary values back (``T / L`` steps on one value per sequence) and one fused update adds
them in. That is ``~2 sqrt(T)`` small steps instead of ``T`` (see benchmarks/kernels_cpu.py).
Low-precision inputs are computed in float32 and cast back.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

ScanFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _chunk_len(t_len: int) -> int:
    return max(1, math.isqrt(max(t_len - 1, 0)) + 1)


def _scan_within(d: torch.Tensor, c: torch.Tensor) -> None:
    """Stage 1 in place on ``[N, K, L]`` views: ``d`` <- in-chunk scan, ``c`` <- suffix products."""
    for t in range(d.shape[-1] - 2, -1, -1):
        d[..., t].addcmul_(c[..., t], d[..., t + 1])
        c[..., t].mul_(c[..., t + 1])


def reverse_scan_rows(d: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """Reverse linear scan ``y[:, t] = d[:, t] + c[:, t] * y[:, t + 1]``, in place.

    Args:
        d: ``[N, T]`` floating tensor (last dim contiguous), the inputs; overwritten by ``y``.
        c: ``[N, T]`` tensor of the same dtype and layout, the per-step decay
            (``c[:, T-1]`` is unused); overwritten by scratch values.

    Returns:
        ``d``, now holding ``y``. Every row kernel (``ScanFn``) may overwrite its inputs;
        callers pass buffers they own. No autograd: call through :func:`reverse_scan`.
    """
    n, t_len = d.shape
    if n == 0 or t_len == 0:
        return d
    chunk = _chunk_len(t_len)
    n_main = t_len // chunk
    rem = t_len - n_main * chunk
    # Views [N, chunks, L]: the full chunks, then the ragged tail (the latest steps).
    parts = [(d[:, : n_main * chunk].view(n, n_main, chunk), c[:, : n_main * chunk].view(n, n_main, chunk))]
    if rem:
        parts.append((d[:, n_main * chunk :].unsqueeze(1), c[:, n_main * chunk :].unsqueeze(1)))
    for dd, cc in parts:
        _scan_within(dd, cc)
    # Stage 2: the value at the start of each chunk, carried from the chunk after it.
    head = torch.cat([dd[..., 0] for dd, _ in parts], dim=1)  # [N, chunks]
    prod = torch.cat([cc[..., 0] for _, cc in parts], dim=1)
    for j in range(head.shape[1] - 2, -1, -1):
        head[:, j].addcmul_(prod[:, j], head[:, j + 1])
    # Every chunk but the last one in time receives the start value of its successor.
    main_d, main_c = parts[0]
    n_carry = n_main if rem else n_main - 1
    if n_carry > 0:
        main_d[:, :n_carry].addcmul_(main_c[:, :n_carry], head[:, 1 : n_carry + 1].unsqueeze(-1))
    return d


def _shift_for_backward(c: torch.Tensor) -> torch.Tensor:
    """Decays of the transposed scan: ``flip(c[t - 1])`` with a zero in front."""
    shifted = torch.zeros_like(c)
    shifted[:, 1:] = c[:, :-1]
    return shifted.flip(-1)


class _ReverseScan(torch.autograd.Function):
    """``y = scan(d; c)`` with the gradient to ``d`` (the decays ``c`` are constants).

    The transpose of a reverse scan is a forward scan with the decays shifted by one step,
    computed by the same row kernel on flipped rows: no ``[T, T]`` matrix is formed.
    """

    @staticmethod
    def forward(ctx, d: torch.Tensor, c: torch.Tensor, scan_fn: ScanFn) -> torch.Tensor:
        ctx.save_for_backward(c)
        ctx.scan_fn = scan_fn
        return scan_fn(d.clone(), c.clone())

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (c,) = ctx.saved_tensors
        g = ctx.scan_fn(grad.contiguous().flip(-1).contiguous(), _shift_for_backward(c).contiguous())
        return g.flip(-1), None, None


def reverse_scan(d: torch.Tensor, c: torch.Tensor, scan_fn: ScanFn = reverse_scan_rows) -> torch.Tensor:
    """Differentiable reverse scan on rows ``[N, T]`` using the row kernel ``scan_fn``.

    Without autograd, ``d`` and ``c`` may be overwritten (pass buffers you own).
    """
    if d.requires_grad and torch.is_grad_enabled():
        return _ReverseScan.apply(d.contiguous(), c.detach().contiguous(), scan_fn)
    return scan_fn(d, c)


def _compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    return torch.float64 if dtype == torch.float64 else torch.float32


def _check_time_layout(name: str, x: torch.Tensor, ref_shape: torch.Size | None = None) -> None:
    if x.dim() < 2:
        raise ValueError(
            f"{name} must have shape [..., T, F] with time on dim -2 (e.g. [batch, T, 1]); "
            f"got shape {tuple(x.shape)}."
        )
    if ref_shape is not None and x.shape != ref_shape:
        raise ValueError(f"{name} has shape {tuple(x.shape)}, expected {tuple(ref_shape)} like the reward.")


def _rows(buf: torch.Tensor) -> torch.Tensor:
    """``[..., T, F]`` owned buffer -> ``[N, T]`` rows (a view when ``F == 1``)."""
    return buf.movedim(-2, -1).reshape(-1, buf.shape[-2])


def _owned(x: torch.Tensor, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """A fresh contiguous ``[..., T, F]`` copy of ``x`` broadcast to ``shape``, as ``dtype``."""
    return torch.empty(shape, dtype=dtype, device=x.device).copy_(x)


def _run_scan(d: torch.Tensor, c: torch.Tensor, scan_fn: ScanFn) -> torch.Tensor:
    """Scan the owned ``[..., T, F]`` buffers ``d`` / ``c`` over dim -2; returns ``[..., T, F]``."""
    shape = d.shape
    y = reverse_scan(_rows(d), _rows(c), scan_fn)
    lead, t_len, feat = shape[:-2], shape[-2], shape[-1]
    return y.reshape(*lead, feat, t_len).movedim(-1, -2)


def _check_flag(name: str, flag: torch.Tensor | None, shape: torch.Size) -> None:
    if flag is None:
        return
    try:
        ok = torch.broadcast_shapes(flag.shape, shape) == shape
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(f"{name} has shape {tuple(flag.shape)}, expected {tuple(shape)} (bool).")


def _decay(scale: float | torch.Tensor, done: torch.Tensor | None, shape, dtype, device) -> torch.Tensor:
    """Owned buffer ``scale * (1 - done)`` of ``shape``."""
    c = torch.empty(shape, dtype=dtype, device=device)
    if done is None:
        return c.copy_(torch.as_tensor(scale, dtype=dtype, device=device).expand(shape))
    if isinstance(scale, torch.Tensor):
        return c.copy_(torch.where(done.bool(), 0.0, scale.to(dtype)).expand(shape))
    zero = torch.zeros((), dtype=dtype, device=device)
    return torch.where(done.bool().expand(shape), zero, torch.full((), float(scale), dtype=dtype, device=device), out=c)


def discounted_cumsum_impl(
    x: torch.Tensor,
    gamma: float | torch.Tensor,
    done: torch.Tensor | None = None,
    scan_fn: ScanFn = reverse_scan_rows,
) -> torch.Tensor:
    """Shared body of :func:`discounted_cumsum` for any row kernel ``scan_fn``."""
    _check_time_layout("x", x)
    _check_flag("done", done, x.shape)
    shape, dtype = x.shape, _compute_dtype(x)
    c = _decay(gamma, done, shape, dtype, x.device)
    d = x.to(dtype) if x.requires_grad and torch.is_grad_enabled() else _owned(x, shape, dtype)
    return _run_scan(d, c, scan_fn).to(x.dtype)


def gae_impl(
    reward: torch.Tensor,
    value: torch.Tensor,
    next_value: torch.Tensor,
    done: torch.Tensor,
    terminated: torch.Tensor,
    gamma: float | torch.Tensor,
    lmbda: float | torch.Tensor,
    scan_fn: ScanFn = reverse_scan_rows,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Shared body of :func:`gae` for any row kernel ``scan_fn``."""
    _check_time_layout("reward", reward)
    shape = reward.shape
    for name, t in (("value", value), ("next_value", next_value)):
        _check_time_layout(name, t, shape)
    _check_flag("done", done, shape)
    _check_flag("terminated", terminated, shape)
    dtype = _compute_dtype(reward, value, next_value)
    out_dtype = torch.promote_types(reward.dtype, value.dtype)
    device = reward.device
    r, v, nv = reward.to(dtype), value.to(dtype), next_value.to(dtype)
    c = _decay(gamma * lmbda, done, shape, dtype, device)
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (r, v, nv))
    if needs_grad or isinstance(gamma, torch.Tensor):
        g = torch.as_tensor(gamma, dtype=dtype, device=device)
        delta = r + g * torch.where(terminated.bool(), 0.0, nv) - v
        if not needs_grad:
            delta = _owned(delta, shape, dtype)
    else:
        # In place into one owned buffer: page faults of fresh allocations dominate on CPU.
        zero = torch.zeros((), dtype=dtype, device=device)
        delta = torch.empty(shape, dtype=dtype, device=device)
        torch.where(terminated.bool().expand(shape), zero, nv, out=delta)
        delta.mul_(float(gamma)).add_(r).sub_(v)
    adv = _run_scan(delta, c, scan_fn)
    return adv.to(out_dtype), (adv + v).to(out_dtype)
