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
them in. That is ``~2 sqrt(T)`` small steps instead of ``T`` (see benchmarks/kernels.py).
Low-precision inputs are computed in float32 and cast back.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

ScanFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def reverse_scan_rows(d: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """Reverse linear scan ``y[:, t] = d[:, t] + c[:, t] * y[:, t + 1]`` on rows.

    Args:
        d: ``[N, T]`` floating tensor, the inputs.
        c: ``[N, T]`` tensor of the same dtype, the per-step decay (``c[:, T-1]`` is unused).

    Returns:
        ``[N, T]`` tensor ``y`` (no autograd: call through :func:`reverse_scan`).
    """
    n, t_len = d.shape
    if n == 0 or t_len == 0:
        return torch.zeros_like(d)
    chunk = max(1, math.isqrt(t_len - 1) + 1)
    n_chunks = -(-t_len // chunk)
    pad = n_chunks * chunk - t_len
    if pad:
        d = torch.nn.functional.pad(d, (0, pad))
        c = torch.nn.functional.pad(c, (0, pad))
    # [L, N, n_chunks]: one time step of every chunk of every row is a contiguous slice.
    dt = d.view(n, n_chunks, chunk).permute(2, 0, 1).contiguous()
    ct = c.view(n, n_chunks, chunk).permute(2, 0, 1).contiguous()
    y = torch.empty_like(dt)
    prod = torch.empty_like(ct)
    y[-1] = dt[-1]
    prod[-1] = ct[-1]
    for t in range(chunk - 2, -1, -1):
        torch.addcmul(dt[t], ct[t], y[t + 1], out=y[t])
        torch.mul(ct[t], prod[t + 1], out=prod[t])
    # Stage 2: y at the start of each chunk, carried from the chunk after it.
    head = y[0].clone()  # [N, n_chunks]
    for j in range(n_chunks - 2, -1, -1):
        head[:, j].addcmul_(prod[0, :, j], head[:, j + 1])
    carry = torch.zeros_like(head)
    carry[:, :-1] = head[:, 1:]
    y.addcmul_(prod, carry.unsqueeze(0))
    out = y.permute(1, 2, 0).reshape(n, n_chunks * chunk)
    return out[:, :t_len] if pad else out


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
        return scan_fn(d, c)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (c,) = ctx.saved_tensors
        g = ctx.scan_fn(grad.contiguous().flip(-1).contiguous(), _shift_for_backward(c).contiguous())
        return g.flip(-1), None, None


def reverse_scan(d: torch.Tensor, c: torch.Tensor, scan_fn: ScanFn = reverse_scan_rows) -> torch.Tensor:
    """Differentiable reverse scan on rows ``[N, T]`` using the row kernel ``scan_fn``."""
    d = d.contiguous()
    c = c.detach().contiguous()
    if d.requires_grad and torch.is_grad_enabled():
        return _ReverseScan.apply(d, c, scan_fn)
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


def _to_rows(x: torch.Tensor, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """``[..., T, F]`` (broadcast to ``shape``) -> ``[N, T]`` contiguous rows of ``dtype``."""
    x = x.to(dtype).expand(shape)
    return x.movedim(-2, -1).reshape(-1, shape[-2])


def _from_rows(y: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    lead, t_len, feat = shape[:-2], shape[-2], shape[-1]
    return y.reshape(*lead, feat, t_len).movedim(-1, -2)


def _not(flag: torch.Tensor | None, shape: torch.Size, name: str) -> torch.Tensor | None:
    if flag is None:
        return None
    if flag.shape != shape:
        try:
            torch.broadcast_shapes(flag.shape, shape)
        except RuntimeError:
            raise ValueError(f"{name} has shape {tuple(flag.shape)}, expected {tuple(shape)}.") from None
    return ~flag.bool()


def discounted_cumsum_impl(
    x: torch.Tensor,
    gamma: float | torch.Tensor,
    done: torch.Tensor | None = None,
    scan_fn: ScanFn = reverse_scan_rows,
) -> torch.Tensor:
    """Shared body of :func:`discounted_cumsum` for any row kernel ``scan_fn``."""
    _check_time_layout("x", x)
    shape = x.shape
    dtype = _compute_dtype(x)
    not_done = _not(done, shape, "done")
    c = torch.as_tensor(gamma, dtype=dtype, device=x.device)
    if not_done is not None:
        c = c * not_done
    y = reverse_scan(_to_rows(x, shape, dtype), _to_rows(c, shape, dtype), scan_fn)
    return _from_rows(y, shape).to(x.dtype)


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
    dtype = _compute_dtype(reward, value, next_value)
    not_term = _not(terminated, shape, "terminated")
    not_done = _not(done, shape, "done")
    gamma_t = torch.as_tensor(gamma, dtype=dtype, device=reward.device)
    lmbda_t = torch.as_tensor(lmbda, dtype=dtype, device=reward.device)
    r, v, nv = reward.to(dtype), value.to(dtype), next_value.to(dtype)
    delta = r + gamma_t * nv * not_term - v
    c = gamma_t * lmbda_t * not_done
    adv = _from_rows(reverse_scan(_to_rows(delta, shape, dtype), _to_rows(c, shape, dtype), scan_fn), shape)
    out_dtype = torch.promote_types(reward.dtype, value.dtype)
    return adv.to(out_dtype), (adv + v).to(out_dtype)


def discounted_cumsum_reference(
    x: torch.Tensor, gamma: float | torch.Tensor, done: torch.Tensor | None = None
) -> torch.Tensor:
    """Pure-torch :func:`tdrl.kernels.discounted_cumsum` (same signature and result)."""
    return discounted_cumsum_impl(x, gamma, done, reverse_scan_rows)


def gae_reference(
    reward: torch.Tensor,
    value: torch.Tensor,
    next_value: torch.Tensor,
    done: torch.Tensor,
    terminated: torch.Tensor,
    gamma: float | torch.Tensor,
    lmbda: float | torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pure-torch :func:`tdrl.kernels.gae` (same signature and result)."""
    return gae_impl(reward, value, next_value, done, terminated, gamma, lmbda, reverse_scan_rows)
