"""GRU / LSTM sequences on the CPU: preallocated buffers, in-place steps, hand-written BPTT.

The same maths as ``fused.py`` (and ``reference.py``, which both are tested against), laid
out for the CPU, where the cost is not the arithmetic but allocating and touching memory
(and, the GEMMs being at this core's peak, the count of small elementwise ops per step):

* time-major workspaces (from a pool) holding what the backward needs, so nothing is
  allocated per step and each step touches contiguous blocks; ``x`` and ``dx`` time-major
  too when training (batch-first rows ``T * F`` floats apart, a power of two, made the
  per-step GEMMs slower). GRU: ``hs`` time-major and per step ``[N, 5H]``: ``r``, ``z`` and
  the gate factors of the backward (one product per gate there), the pre-activations and
  the reset state in hot scratch buffers (a store to a workspace costs ~2-3x one to a hot
  buffer: the workspaces do not fit in cache); LSTM: ``[T, N, 4H]``, the input GEMM's
  output overwritten in place by the activated gates (a hot scratch measured ~2% slower);
* every step is a few ``out=`` / in-place ops (LSTM gates reordered to ``i, f, o, g`` so
  the three sigmoids are one op), the reset ``h * keep`` only on the steps where some row
  resets (the step list is read once), per-step views made once with ``unbind``; what the
  forward computes anyway and the backward would recompute is kept (LSTM: the reset states,
  ``tanh(c)``);
* an output gradient that is None (an unused LSTM ``cs``: ``set_materialize_grads(False)``)
  is skipped, one broadcast along time (``out.sum()``) is read as one contiguous slice;
* the backward keeps one step's gate gradients ``[N, 4H]`` (hot in cache) and does four
  GEMMs per step: the state gradient, ``dW_hh`` and ``dW_ih`` accumulated in place, and
  that step's ``dx`` (measured faster here than storing all steps for three large GEMMs);
* large workspaces come from a small pool (:func:`clear_workspaces`) and go back when the
  autograd graph that saved them is freed: a fresh 64 MB buffer costs ~20 ms in page
  faults here, about as much as a GEMM over all steps.

float32 runs these loops compiled (``cpu_ext.cpp``, built on first use by ``cpu_ext.py``; the
same maths and workspaces, each step's gate maths one vectorised pass over the rows, the
GEMMs the same calls); float64, ``TDRL_RECURRENT_EXT=0`` or a failed build run the Python
loops below. Stacked networks (weights ``[S, G*H, .]``, seeds trained as one model) run through the
compiled loops only (:func:`stacked_ready`): their ``S`` blocks of rows are one batch whose GEMMs are
batched over ``S``. Without grad (inference, ``torch.no_grad``) nothing is saved. Shapes: ``x`` ``[N, T, F]``,
states ``[N, H]``, ``keep`` ``[N, T]`` (``1 - is_init`` in ``x``'s dtype), weights as
``nn.GRU`` / ``nn.LSTM`` (``weight_ih_l0`` ``[G*H, F]``, ``weight_hh_l0`` ``[G*H, H]``,
biases ``[G*H]`` or None).
"""

from __future__ import annotations

import threading
import weakref

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from . import cpu_ext as _cpu_ext

__all__ = ["clear_workspaces", "gru_cpu", "lstm_cpu", "stacked_ready"]

_POOL_MAX_BYTES = 512 * 2**20
_pool: dict[tuple[int, torch.dtype, torch.device], list[Tensor]] = {}
_pool_bytes = 0
_pool_lock = threading.Lock()


def _take(shape: tuple[int, ...], like: Tensor) -> Tensor:
    """An uninitialised ``shape`` buffer in ``like``'s dtype, reused from the pool when one fits."""
    numel = 1
    for s in shape:
        numel *= s
    global _pool_bytes
    with _pool_lock:
        free = _pool.get((numel, like.dtype, like.device))
        if free:
            buf = free.pop()
            _pool_bytes -= buf.numel() * buf.element_size()
            return buf.view(shape)
    return torch.empty(shape, dtype=like.dtype, device=like.device)


def _give(*bufs: Tensor) -> None:
    """Return buffers (no longer used by anyone) to the pool, up to its byte cap."""
    global _pool_bytes
    with _pool_lock:
        for buf in bufs:
            size = buf.numel() * buf.element_size()
            if _pool_bytes + size > _POOL_MAX_BYTES:
                continue
            _pool.setdefault((buf.numel(), buf.dtype, buf.device), []).append(buf.view(-1))
            _pool_bytes += size


def clear_workspaces() -> None:
    """Drop the pooled CPU workspaces of the recurrent ops (up to 512 MB are kept for reuse)."""
    global _pool_bytes
    with _pool_lock:
        _pool.clear()
        _pool_bytes = 0


def _reset_steps(keep: Tensor) -> list[bool]:
    """``[T]`` Python bools: whether any row resets before step ``t``."""
    return (keep == 0).any(0).tolist() if keep.numel() else [False] * keep.shape[1]


def _need_grad(*tensors: Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _bias(b: Tensor | None, rows: int, like: Tensor, lead: tuple = ()) -> Tensor:
    return like.new_zeros(*lead, rows) if b is None else b


def _t(w: Tensor) -> Tensor:
    return w.transpose(-1, -2)


def _rows(bias: Tensor, n: int) -> Tensor:
    """``bias`` expanded to ``[n, G*H]`` and made contiguous once: ``addmm`` then starts each
    step from a plain copy instead of a (several times slower) broadcast copy."""
    return bias.expand(n, -1).contiguous()


def _grad_steps(g: Tensor | None) -> list[Tensor] | None:
    """The ``T`` per-step ``[N, H]`` slices of an output gradient ``[N, T, H]`` (None: unused
    output). A gradient broadcast along time (``out.sum().backward()``: stride 0) becomes one
    contiguous slice shared by all steps; other broadcast ones are made contiguous."""
    if g is None:
        return None
    if g.stride(1) == 0:
        return [g[:, 0].contiguous()] * g.shape[1]
    if 0 in g.stride():
        g = g.contiguous()
    return list(g.unbind(1))


def _per_step(buf: Tensor, H: int, *spans: tuple[int, int]) -> list[tuple[Tensor, ...]]:
    """For each ``(a, b)`` the ``T`` views ``buf[t, :, a*H : b*H]`` of a ``[T, N, G*H]`` buffer,
    made in one call each (slicing in the loop costs more than the small ops themselves)."""
    return [buf[..., a * H : b * H].unbind(0) for a, b in spans]


def _ext_for(x: Tensor):
    """The compiled loops (``cpu_ext``) for float32 inputs, else None (the Python loops)."""
    return _cpu_ext.extension() if x.dtype == torch.float32 else None


def stacked_ready(x: Tensor) -> bool:
    """Whether stacked networks on ``x`` (float32, CPU) can run here: the compiled loops are built."""
    return x.device.type == "cpu" and _ext_for(x) is not None


def _unstack(fn, x, states, keep, weights):
    """Run ``fn`` on stacked networks' inputs ``[S, N, ...]`` as ``S * N`` rows; outputs back
    to ``[S, N, ...]`` (the rows of block ``s`` go through network ``s`` in the compiled loops)."""
    S, n = x.shape[:2]
    out = fn(x.flatten(0, 1), *(h.flatten(0, 1) for h in states), keep.flatten(0, 1), *weights)
    return tuple(o.unflatten(0, (S, n)) for o in out) if isinstance(out, tuple) else out.unflatten(0, (S, n))


def _none(t: Tensor | None, like: Tensor) -> Tensor:
    """The extension's "not wanted": an empty tensor for None."""
    return like.new_empty(0) if t is None else t


def _grad_time_major(g: Tensor | None, like: Tensor) -> Tensor:
    """An output gradient ``[N, T, H]`` as a ``[T, N, H]`` view with unit last stride for the
    extension (a broadcast along time keeps time stride 0: one slice read for every step)."""
    if g is None:
        return like.new_empty(0)
    if g.stride(1) == 0 and g.shape[1] > 0:
        g = g[:, :1].contiguous().expand(g.shape)
    elif 0 in g.stride() or g.stride(-1) != 1:
        g = g.contiguous()
    return g.transpose(0, 1)


# ---------------------------------------------------------------------------------- GRU


def _time_major(x: Tensor) -> Tensor:
    """``x [N, T, F]`` copied into a pooled time-major ``[T, N, F]`` buffer: each step's rows
    are then contiguous (batch-first rows ``T * F`` apart, a power of two here, map onto the
    same cache sets and made the per-step GEMMs and stores measurably slower)."""
    buf = _take((x.shape[1], x.shape[0], x.shape[2]), x)
    return buf.copy_(x.transpose(0, 1))


def _batch_first(buf: Tensor) -> Tensor:
    """A fresh ``[N, T, H]`` copy of a time-major (pooled) ``[T, N, H]`` buffer (never a view:
    ``.contiguous()`` returns the buffer itself when ``T`` or ``N`` is 1)."""
    out = buf.new_empty(buf.shape[1], buf.shape[0], buf.shape[2])
    return out.copy_(buf.transpose(0, 1))


def _gru_forward(x, h0, keep, resets, w_ih, w_hh, b_ih, b_hh, save: bool):
    """Returns ``hs [N, T, H]`` and, when ``save``, the time-major workspaces ``X [T, N, F]``
    (``x``), ``HS [T, N, H]`` (``hs``), ``G [T, N, 5H]`` holding per step ``r``, ``z`` and the
    backward's gate factors ``(1 - n^2)(1 - z)``, ``r (1 - r) (W_hn h + b_hn)``,
    ``z (1 - z) (h_prev - n)`` (so the backward does one product per gate). The reset state
    ``h * keep`` entering a step goes to a hot scratch, not a workspace: the backward remakes
    it from ``HS`` (one op on hot memory costs less than a store to and a load from the
    workspace)."""
    n, t_len, _ = x.shape
    H = w_hh.shape[1]
    b_ih, b_hh = _bias(b_ih, 3 * H, x), _bias(b_hh, 3 * H, x)
    bias = _rows(torch.cat([b_ih[: 2 * H] + b_hh[: 2 * H], b_ih[2 * H :]]), n)  # b_hr, b_hz in
    # time-major only for the backward's GEMMs (the forward's minds the layout less)
    if save:
        X, HS = _time_major(x), _take((t_len, n, H), x)
    else:
        hs = x.new_empty(n, t_len, H)
        X, HS = x.transpose(0, 1), hs.transpose(0, 1)
    G = _take((t_len, n, 5 * H), x) if save else x.new_empty(1, n, 5 * H)
    w_ih_t, w_rz_t, w_n_t = w_ih.t(), w_hh[: 2 * H].t(), w_hh[2 * H :].t()
    b_hn = _rows(b_hh[2 * H :], n)
    # hot per-step scratch: the pre-activations (then n) and (W_hn h + b_hn, h_prev - n); only
    # what the backward needs goes to the workspaces (a GEMM into them ran ~80 us slower)
    s, u, one = x.new_empty(n, 3 * H), x.new_empty(n, 2 * H), x.new_ones(())
    s_rz, nn_, ghn, diff = s[:, : 2 * H], s[:, 2 * H :], u[:, :H], u[:, H:]
    ks, xs, hss = keep.unsqueeze(-1).unbind(1), X.unbind(0), HS.unbind(0)  # per-step views
    steps = G if save else G.expand(t_len, -1, -1)  # without grad one step's buffer is reused
    hps = (x.new_empty(n, H), x.new_empty(n, H))
    blocks = list(zip(*_per_step(steps, H, (0, 2), (0, 1), (1, 2), (2, 3), (3, 5))))
    hp = torch.mul(h0, ks[0], out=hps[0]) if t_len and resets[0] else h0
    for t in range(t_len):
        rz, r, z, n_f, fac = blocks[t]
        torch.addmm(bias, xs[t], w_ih_t, out=s)
        torch.sigmoid(s_rz.addmm_(hp, w_rz_t), out=rz)
        torch.addmm(b_hn, hp, w_n_t, out=ghn)
        nn_.addcmul_(r, ghn).tanh_()
        torch.sub(hp, nn_, out=diff)
        h = torch.addcmul(nn_, z, diff, out=hss[t])  # (1 - z) n + z h
        if save:
            torch.addcmul(rz, rz, rz, value=-1, out=fac).mul_(u)
            torch.addcmul(one, nn_, nn_, value=-1, out=n_f).addcmul_(n_f, z, value=-1)
        if t + 1 < t_len:
            hp = torch.mul(h, ks[t + 1], out=hps[(t + 1) % 2]) if resets[t + 1] else h
    if not save:
        return hs, None
    return _batch_first(HS), (X, HS, G)


def _grad_buffers(X: Tensor, gates: int, H: int, need, first_weight: int, lead: tuple = ()):
    """The gradient buffers a backward fills, each only where its input needs one: ``DX``
    (time-major, from the pool), ``dW_ih [gates H, F]``, ``dW_hh [gates H, H]`` and one bias
    buffer ``db [4 H]`` for both biases (inputs ``first_weight`` .. ``first_weight + 3`` in
    ``need``, the autograd function's ``needs_input_grad``)."""
    i = first_weight
    DX = _take(X.shape, X) if need[0] else None
    dw_ih = X.new_zeros(*lead, gates * H, X.shape[-1]) if need[i] else None
    dw_hh = X.new_zeros(*lead, gates * H, H) if need[i + 1] else None
    db = X.new_zeros(*lead, 4 * H) if need[i + 2] or need[i + 3] else None
    return DX, dw_ih, dw_hh, db


def _dx_batch_first(DX: Tensor | None) -> Tensor | None:
    """The input gradient ``[N, T, F]`` from its time-major buffer (given back to the pool)."""
    if DX is None:
        return None
    dx = _batch_first(DX)
    _give(DX)
    return dx


def _linear_grads(dw_h, dg_h_t, h_prev, dw_i, dg_i_t, dg_i, x, w_i, dx, db, dg_t, ones) -> None:
    """Step ``t``'s share of the gradients of a cell's two linear maps, in place: ``dw_h +=
    dg_h^T h_prev``, ``dw_i += dg_i^T x``, ``dx = dg_i w_i``, ``db += dg^T 1`` (each skipped when
    its buffer is ``None``; ``*_t`` are the transposed gate gradients). The GRU's hidden map
    sees other gate gradients than its input map (the reset gate scales the candidate's); the
    LSTM passes the same ``dg`` for both."""
    if dw_h is not None:
        dw_h.addmm_(dg_h_t, h_prev)
    if dw_i is not None:
        dw_i.addmm_(dg_i_t, x)
    if dx is not None:
        torch.mm(dg_i, w_i, out=dx)
    if db is not None:
        db.addmv_(dg_t, ones)


def _gru_grads(DX, dh, dw_ih, dw_p, db, need, H: int) -> tuple:
    """:class:`_GRUCPU`'s gradients from the backward's buffers: ``dw_p`` has ``W_hh``'s rows
    in the order (n, r, z) and ``db`` is (b_hn, b_r, b_z, b_in)."""
    dx = _dx_batch_first(DX)
    dw_hh = None if dw_p is None else torch.cat([dw_p[..., H:, :], dw_p[..., :H, :]], -2)
    db_ih = db[..., H:] if need[5] else None
    db_hh = torch.cat([db[..., H : 3 * H], db[..., :H]], -1) if need[6] else None
    return dx, dh, None, dw_ih, dw_hh, db_ih, db_hh


def _lstm_grads(DX, dh, dc, dw_ih, dw_hh, db, need, H: int) -> tuple:
    """:class:`_LSTMCPU`'s gradients from the backward's buffers (gates in (i, f, o, g) order,
    back to PyTorch's (i, f, g, o); one bias gradient serves both biases)."""
    dw_ih = None if dw_ih is None else _ifog(dw_ih, H, dw_ih.dim() - 2)
    dw_hh = None if dw_hh is None else _ifog(dw_hh, H, dw_hh.dim() - 2)
    db = None if db is None else _ifog(db, H, db.dim() - 1)
    dx = _dx_batch_first(DX)
    return dx, dh, dc, None, dw_ih, dw_hh, db if need[6] else None, db if need[7] else None


def _gru_forward_ext(ext, x, h0, keep, w_ih, w_hh, b_ih, b_hh, save: bool):
    """:func:`_gru_forward` through the compiled loop (same returns and workspaces)."""
    n, t_len, _ = x.shape
    H, lead = w_hh.shape[-1], tuple(w_hh.shape[:-2])
    b_ih, b_hh = _bias(b_ih, 3 * H, x, lead), _bias(b_hh, 3 * H, x, lead)
    bias = torch.cat([b_ih[..., : 2 * H] + b_hh[..., : 2 * H], b_ih[..., 2 * H :], b_hh[..., 2 * H :]], -1)
    x = x if x.stride(-1) == 1 else x.contiguous()
    if save:
        X, HS, G = _time_major(x), _take((t_len, n, H), x), _take((t_len, n, 5 * H), x)
    else:
        hs = x.new_empty(n, t_len, H)
        X, HS, G = x.transpose(0, 1), hs.transpose(0, 1), x.new_empty(0)
    ext.gru_forward(X, h0.contiguous(), keep.contiguous(), _t(w_ih), _t(w_hh), bias, HS, G)
    if not save:
        return hs, None
    return _batch_first(HS), (X, HS, G)


def _gru_backward_ext(ctx, ext, g_hs):
    h0, keep, w_ih, w_hh = ctx.saved_tensors
    X, HS, G = ctx.X, ctx.HS, ctx.G
    H, lead = w_hh.shape[-1], tuple(w_hh.shape[:-2])
    need = ctx.needs_input_grad
    w_p = torch.cat([w_hh[..., 2 * H :, :], w_hh[..., : 2 * H, :]], -2)  # rows (n, r, z)
    DX, dw_ih, dw_p, db = _grad_buffers(X, 3, H, need, 3, lead)  # db: (b_hn, b_r, b_z, b_in)
    dh = ext.gru_backward(
        X, HS, G, h0.contiguous(), keep.contiguous(), w_p, w_ih, _grad_time_major(g_hs, X),
        _none(DX, X), _none(dw_ih, X), _none(dw_p, X), _none(db, X),
    )  # fmt: skip
    return _gru_grads(DX, dh, dw_ih, dw_p, db, need, H)


class _GRUCPU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, h0, keep, w_ih, w_hh, b_ih, b_hh):
        ctx.set_materialize_grads(False)
        ctx.ext = ext = _ext_for(x)
        if ext is not None:
            hs, (X, HS, G) = _gru_forward_ext(ext, x, h0, keep, w_ih, w_hh, b_ih, b_hh, save=True)
            resets = None
        else:
            resets = _reset_steps(keep)
            hs, (X, HS, G) = _gru_forward(x, h0, keep, resets, w_ih, w_hh, b_ih, b_hh, save=True)
        ctx.save_for_backward(h0, keep, w_ih, w_hh)
        ctx.X, ctx.HS, ctx.G, ctx.resets = X, HS, G, resets
        weakref.finalize(ctx, _give, X, HS, G)  # back to the pool when the graph is freed
        return hs

    @staticmethod
    @once_differentiable
    def backward(ctx, g_hs):
        if ctx.ext is not None:
            return _gru_backward_ext(ctx, ctx.ext, g_hs)
        h0, keep, w_ih, w_hh = ctx.saved_tensors
        X, HS, resets = ctx.X, ctx.HS, ctx.resets
        t_len, n, f = X.shape
        H = w_hh.shape[1]
        if g_hs is None:  # not reached by autograd (one output), kept for direct calls
            g_hs = X.new_zeros(()).expand(n, t_len, H)
        need = ctx.needs_input_grad
        # d per step: (d ghn, d r_pre, d z_pre, d n_pre, dh): [:3H] is d(W_hh h + b_hh) for
        # W_hh's rows reordered (n, r, z), [H:4H] is d(W_ih x + b_ih) in W_ih's order
        # (r, z, n), [4H:] the state gradient entering the step; two such buffers alternate
        w_p = torch.cat([w_hh[2 * H :], w_hh[: 2 * H]])
        DX, dw_ih, dw_p, db = _grad_buffers(X, 3, H, need, 3)
        ones = X.new_ones(n)
        views = []
        for d in (X.new_empty(n, 5 * H), X.new_empty(n, 5 * H)):
            views.append((d[:, 4 * H :], d[:, :H], d[:, H : 3 * H], d[:, 3 * H : 4 * H],
                          d[:, 3 * H :], d[:, : 3 * H], d[:, H : 4 * H], d[:, : 4 * H].t(),
                          d[:, : 3 * H].t(), d[:, H : 4 * H].t()))  # fmt: skip
        hp_buf, ks, xs, hss = X.new_empty(n, H), keep.unsqueeze(-1).unbind(1), X.unbind(0), HS.unbind(0)
        dxs = DX.unbind(0) if DX is not None else None
        gss = _grad_steps(g_hs)
        blocks = list(zip(*_per_step(ctx.G, H, (0, 1), (1, 2), (2, 3), (3, 5))))
        views[0][0].copy_(gss[-1]) if t_len else views[0][0].zero_()
        for t in range(t_len - 1, -1, -1):
            dh, dghn, drz, dpn, pn_dh, dgh, dgi, d_t, dgh_t, dgi_t = views[(t_len - 1 - t) % 2]
            dh_next = views[(t_len - t) % 2][0]
            if t + 1 < t_len:  # dh arrives from step t + 1 (w.r.t. its reset state)
                if resets[t + 1]:
                    torch.addcmul(gss[t], dh, ks[t + 1], out=dh)
                else:
                    dh.add_(gss[t])
            hp = h0 if t == 0 else hss[t - 1]
            if resets[t]:
                hp = torch.mul(hp, ks[t], out=hp_buf)
            r, z, np_, fac = blocks[t]
            torch.mul(dh, np_, out=dpn)  # dh (1 - n^2)(1 - z)
            torch.mul(dpn, r, out=dghn)
            torch.mul(pn_dh, fac, out=drz)  # (dpn r(1-r) ghn, dh z(1-z)(h_prev - n))
            torch.mul(dh, z, out=dh_next).addmm_(dgh, w_p)
            _linear_grads(dw_p, dgh_t, hp, dw_ih, dgi_t, dgi, xs[t], w_ih, None if dxs is None else dxs[t], db, d_t, ones)
        dh = views[t_len % 2][0]
        dh = dh * ks[0] if t_len and resets[0] else dh.clone()
        return _gru_grads(DX, dh, dw_ih, dw_p, db, need, H)


def gru_cpu(x, h0, keep, w_ih, w_hh, b_ih=None, b_hh=None) -> Tensor:
    """GRU sequence on CPU tensors (``keep = 1 - is_init`` in ``x``'s dtype): ``[N, T, H]``
    (stacked networks, when :func:`stacked_ready`: every tensor with a leading ``S``)."""
    if w_hh.dim() == 3:
        return _unstack(_gru_rows, x, (h0,), keep, (w_ih, w_hh, b_ih, b_hh))
    return _gru_rows(x, h0, keep, w_ih, w_hh, b_ih, b_hh)


def _gru_rows(x, h0, keep, w_ih, w_hh, b_ih=None, b_hh=None) -> Tensor:
    """:func:`gru_cpu` on ``[N, T]`` rows (of stacked networks: ``S`` blocks of rows)."""
    if _need_grad(x, h0, w_ih, w_hh, b_ih, b_hh):
        return _GRUCPU.apply(x, h0, keep, w_ih, w_hh, b_ih, b_hh)
    with torch.no_grad():
        ext = _ext_for(x)
        if ext is not None:
            return _gru_forward_ext(ext, x, h0, keep, w_ih, w_hh, b_ih, b_hh, save=False)[0]
        return _gru_forward(x, h0, keep, _reset_steps(keep), w_ih, w_hh, b_ih, b_hh, save=False)[0]


# --------------------------------------------------------------------------------- LSTM


def _ifog(w: Tensor, H: int, dim: int = 0) -> Tensor:
    """Rows (or entries) along the gate dim ``dim`` in ``nn.LSTM``'s gate order ``i, f, g, o``
    -> ``i, f, o, g`` (and back); ``dim`` 1 for stacked networks."""
    return torch.cat([w.narrow(dim, 0, 2 * H), w.narrow(dim, 3 * H, H), w.narrow(dim, 2 * H, H)], dim)


def _lstm_forward(x, h0, c0, keep, resets, w_ih, w_hh, b_ih, b_hh, save: bool):
    """Returns ``hs, cs [N, T, H]`` and, when ``save``, the time-major workspaces
    ``A [T, N, 4H]`` of activated gates ``(i, f, o, g)``, ``TC [T, N, H]`` of ``tanh(c)`` and
    ``HC [T, N, 2H]``, the reset states ``(h, c) * keep`` entering each step that resets."""
    n, t_len, _ = x.shape
    H = w_hh.shape[1]
    bias = _rows(_ifog(_bias(b_ih, 4 * H, x) + _bias(b_hh, 4 * H, x), H), n)
    A = _take((t_len, n, 4 * H), x) if save else x.new_empty(1, n, 4 * H)
    TC = _take((t_len, n, H), x) if save else x.new_empty(1, n, H)
    HC = _take((t_len, n, 2 * H), x) if save else x.new_empty(1, n, 2 * H)
    w_ih_t, w_hh_t = _ifog(w_ih, H).t(), _ifog(w_hh, H).t()
    hs, cs = x.new_empty(n, t_len, H), x.new_empty(n, t_len, H)
    X = _time_major(x) if save else x.transpose(0, 1)  # time-major for the backward's GEMMs
    ks, xs, hss, css = keep.unsqueeze(-1).unbind(1), X.unbind(0), hs.unbind(1), cs.unbind(1)
    steps = A if save else A.expand(t_len, -1, -1)  # without grad one step's buffer is reused
    tcs = (TC if save else TC.expand(t_len, -1, -1)).unbind(0)
    hps, cps = _per_step(HC if save else HC.expand(t_len, -1, -1), H, (0, 1), (1, 2))
    blocks = _per_step(steps, H, (0, 4), (0, 3), (3, 4), (0, 1), (1, 2), (2, 3))
    hp, cp = h0, c0
    if t_len and resets[0]:
        hp, cp = torch.mul(h0, ks[0], out=hps[0]), torch.mul(c0, ks[0], out=cps[0])
    for t in range(t_len):
        a, sig, g, i, fg, o = (b[t] for b in blocks)
        torch.addmm(bias, xs[t], w_ih_t, out=a).addmm_(hp, w_hh_t)
        sig.sigmoid_()
        g.tanh_()
        c = torch.mul(fg, cp, out=css[t]).addcmul_(i, g)
        h = torch.mul(o, torch.tanh(c, out=tcs[t]), out=hss[t])
        if t + 1 < t_len:
            if resets[t + 1]:
                hp = torch.mul(h, ks[t + 1], out=hps[t + 1])
                cp = torch.mul(c, ks[t + 1], out=cps[t + 1])
            else:
                hp, cp = h, c
    return hs, cs, ((X, A, TC, HC) if save else None)


def _lstm_forward_ext(ext, x, h0, c0, keep, w_ih, w_hh, b_ih, b_hh, save: bool):
    """:func:`_lstm_forward` through the compiled loop (same returns and workspaces)."""
    n, t_len, _ = x.shape
    H, lead = w_hh.shape[-1], tuple(w_hh.shape[:-2])
    g = len(lead)  # the gate dim of the weights and biases
    bias = _ifog(_bias(b_ih, 4 * H, x, lead) + _bias(b_hh, 4 * H, x, lead), H, g)
    x = x if x.stride(-1) == 1 else x.contiguous()
    hs, cs = x.new_empty(n, t_len, H), x.new_empty(n, t_len, H)
    if save:
        X = _time_major(x)
        A, TC, HC = (_take((t_len, n, k * H), x) for k in (4, 1, 2))
    else:
        X, A, TC, HC = x.transpose(0, 1), x.new_empty(0), x.new_empty(0), x.new_empty(0)
    ext.lstm_forward(
        X, h0.contiguous(), c0.contiguous(), keep.contiguous(), _t(_ifog(w_ih, H, g)),
        _t(_ifog(w_hh, H, g)), bias, hs.transpose(0, 1), cs.transpose(0, 1), A, TC, HC,
    )  # fmt: skip
    return hs, cs, ((X, A, TC, HC) if save else None)


def _lstm_backward_ext(ctx, ext, g_hs, g_cs):
    h0, c0, keep, w_ih, w_hh, hs, cs = ctx.saved_tensors
    X = ctx.X
    need = ctx.needs_input_grad
    n, t_len, H = hs.shape
    lead = tuple(w_hh.shape[:-2])
    DX, dw_ih, dw_hh, db = _grad_buffers(X, 4, H, need, 4, lead)
    dh, dc = ext.lstm_backward(
        X, hs.transpose(0, 1), cs.transpose(0, 1), ctx.A, ctx.TC, ctx.HC, h0.contiguous(),
        c0.contiguous(), keep.contiguous(), _ifog(w_hh, H, len(lead)), _ifog(w_ih, H, len(lead)),
        _grad_time_major(g_hs, X), _grad_time_major(g_cs, X), _none(DX, X), _none(dw_ih, X),
        _none(dw_hh, X), _none(db, X),
    )  # fmt: skip
    return _lstm_grads(DX, dh, dc, dw_ih, dw_hh, db, need, H)


class _LSTMCPU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, h0, c0, keep, w_ih, w_hh, b_ih, b_hh):
        ctx.set_materialize_grads(False)  # an unused output (most often cs) gets no zero grad
        ctx.ext = ext = _ext_for(x)
        if ext is not None:
            resets = None
            hs, cs, saved = _lstm_forward_ext(ext, x, h0, c0, keep, w_ih, w_hh, b_ih, b_hh, save=True)
        else:
            resets = _reset_steps(keep)
            hs, cs, saved = _lstm_forward(x, h0, c0, keep, resets, w_ih, w_hh, b_ih, b_hh, save=True)
        X, A, TC, HC = saved
        ctx.save_for_backward(h0, c0, keep, w_ih, w_hh, hs, cs)
        ctx.X, ctx.A, ctx.TC, ctx.HC, ctx.resets = X, A, TC, HC, resets
        weakref.finalize(ctx, _give, X, A, TC, HC)  # back to the pool when the graph is freed
        return hs, cs

    @staticmethod
    @once_differentiable
    def backward(ctx, g_hs, g_cs):
        if ctx.ext is not None:
            return _lstm_backward_ext(ctx, ctx.ext, g_hs, g_cs)
        h0, c0, keep, w_ih, w_hh, hs, cs = ctx.saved_tensors
        X, A, resets = ctx.X, ctx.A, ctx.resets
        need = ctx.needs_input_grad
        n, t_len, H = hs.shape
        w_ih_p, w_hh_p = _ifog(w_ih, H), _ifog(w_hh, H)
        DX, dw_ih, dw_hh, db = _grad_buffers(X, 4, H, need, 4)
        one, ones = X.new_ones(()), X.new_ones(n)
        d, u = X.new_empty(n, 4 * H), X.new_empty(n, 3 * H)  # d: (i, f, o, g) order
        s = X.new_empty(n, H)
        hps, cps = _per_step(ctx.HC, H, (0, 1), (1, 2))
        dhc = X.new_zeros(n, 2 * H)  # (dh, dc) side by side: a reset masks both in one op
        dh, dc, dhc3 = dhc[:, :H], dhc[:, H:], dhc.view(n, 2, H)
        d3, dg, d_t = d[:, : 3 * H], d[:, 3 * H :], d.t()
        u_i, u_f, u_o = u[:, :H], u[:, H : 2 * H], u[:, 2 * H :]
        ks, xs, hss, css = keep.unsqueeze(-1).unbind(1), X.unbind(0), hs.unbind(1), cs.unbind(1)
        ghs, gcs, tcs = _grad_steps(g_hs), _grad_steps(g_cs), ctx.TC.unbind(0)
        dxs = DX.unbind(0) if DX is not None else None
        blocks = _per_step(A, H, (0, 3), (0, 1), (1, 2), (2, 3), (3, 4))
        for t in range(t_len - 1, -1, -1):
            if ghs is not None:
                dh.add_(ghs[t])
            if gcs is not None:
                dc.add_(gcs[t])
            if resets[t]:
                hp, cp = hps[t], cps[t]
            else:
                hp, cp = (h0, c0) if t == 0 else (hss[t - 1], css[t - 1])
            a3, i, fg, o, g = (b[t] for b in blocks)
            tc = tcs[t]
            torch.addcmul(one, tc, tc, value=-1, out=s).mul_(o)  # o (1 - tanh(c)^2)
            dc.addcmul_(dh, s)
            torch.mul(dc, g, out=u_i)
            torch.mul(dc, cp, out=u_f)
            torch.mul(dh, tc, out=u_o)
            torch.addcmul(a3, a3, a3, value=-1, out=d3).mul_(u)  # (i, f, o) (1 - .) u
            torch.addcmul(one, g, g, value=-1, out=dg).mul_(i).mul_(dc)
            torch.mm(d, w_hh_p, out=dh)
            dc.mul_(fg)
            if resets[t]:
                dhc3.mul_(ks[t].unsqueeze(1))
            _linear_grads(dw_hh, d_t, hp, dw_ih, d_t, d, xs[t], w_ih_p, None if dxs is None else dxs[t], db, d_t, ones)
        return _lstm_grads(DX, dh, dc, dw_ih, dw_hh, db, need, H)


def lstm_cpu(x, h0, c0, keep, w_ih, w_hh, b_ih=None, b_hh=None) -> tuple[Tensor, Tensor]:
    """LSTM sequence on CPU tensors (as :func:`gru_cpu`): ``(hs, cs)``, each ``[N, T, H]``."""
    if w_hh.dim() == 3:
        return _unstack(_lstm_rows, x, (h0, c0), keep, (w_ih, w_hh, b_ih, b_hh))
    return _lstm_rows(x, h0, c0, keep, w_ih, w_hh, b_ih, b_hh)


def _lstm_rows(x, h0, c0, keep, w_ih, w_hh, b_ih=None, b_hh=None) -> tuple[Tensor, Tensor]:
    """:func:`lstm_cpu` on ``[N, T]`` rows (of stacked networks: ``S`` blocks of rows)."""
    if _need_grad(x, h0, c0, w_ih, w_hh, b_ih, b_hh):
        return _LSTMCPU.apply(x, h0, c0, keep, w_ih, w_hh, b_ih, b_hh)
    with torch.no_grad():
        ext = _ext_for(x)
        if ext is not None:
            hs, cs, _ = _lstm_forward_ext(ext, x, h0, c0, keep, w_ih, w_hh, b_ih, b_hh, save=False)
            return hs, cs
        resets = _reset_steps(keep)
        hs, cs, _ = _lstm_forward(x, h0, c0, keep, resets, w_ih, w_hh, b_ih, b_hh, save=False)
    return hs, cs
