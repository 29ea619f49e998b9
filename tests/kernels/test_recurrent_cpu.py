"""The CPU path of the GRU / LSTM sequence ops (``recurrent/cpu.py``) against the step-by-step
reference: outputs and every gradient, float64 gradcheck, no bias, no resets, resets at t = 0,
the buffer pool (two graphs alive at once, a retained graph differentiated twice)."""

from __future__ import annotations

import pytest
import torch
from tdrl.kernels import gru_reference, gru_sequence, lstm_reference, lstm_sequence
from tdrl.kernels.recurrent import cpu

TOL = {torch.float64: {"atol": 1e-10, "rtol": 1e-9}, torch.float32: {"atol": 3e-5, "rtol": 3e-4}}


def _case(kind, n=6, t_len=9, f=5, h=8, dtype=torch.float64, seed=0, bias=True, p_reset=0.3):
    g = torch.Generator().manual_seed(seed)
    gates = 3 if kind == "gru" else 4
    mk = lambda *s: (torch.randn(*s, generator=g, dtype=dtype) * 0.6).requires_grad_()  # noqa: E731
    x = mk(n, t_len, f)
    states = [mk(n, h) for _ in range(1 if kind == "gru" else 2)]
    is_init = torch.rand(n, t_len, generator=g) < p_reset
    is_init[:2, 0] = True  # resets at t = 0 drop h0 (c0) on those rows
    weights = [mk(gates * h, f), mk(gates * h, h)] + ([mk(gates * h), mk(gates * h)] if bias else [])
    return x, states, is_init, weights


def _ref(kind, x, states, is_init, weights):
    init = torch.zeros(x.shape[:2], dtype=torch.bool) if is_init is None else is_init
    if kind == "gru":
        return gru_reference(x, *states, init, *weights)
    return lstm_reference(x, *states, init, *weights)


def _op(kind, x, states, is_init, weights):
    return (gru_sequence if kind == "gru" else lstm_sequence)(x, *states, is_init, *weights)


def _loss(out, seed=3):
    g = torch.Generator().manual_seed(seed)
    outs = out if isinstance(out, tuple) else (out,)
    return sum((o * torch.randn(o.shape, generator=g, dtype=o.dtype)).sum() for o in outs)


def _check_against_reference(kind, x, states, is_init, weights, tol):
    leaves = [x, *states, *weights]
    out, ref = _op(kind, x, states, is_init, weights), _ref(kind, x, states, is_init, weights)
    torch.testing.assert_close(out, ref, **tol)
    got, want = torch.autograd.grad(_loss(out), leaves), torch.autograd.grad(_loss(ref), leaves)
    for name, a, b in zip(["x", "h0/c0", "..."], got, want):
        torch.testing.assert_close(a, b, **tol, msg=lambda m, name=name: f"grad {name}: {m}")
    return out


@pytest.mark.parametrize("kind", ["gru", "lstm"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("bias", [True, False])
def test_outputs_and_all_gradients_match_the_reference(kind, dtype, bias):
    x, states, is_init, weights = _case(kind, dtype=dtype, bias=bias, n=11, t_len=13, h=16)
    _check_against_reference(kind, x, states, is_init, weights, TOL[dtype])


@pytest.mark.parametrize("kind", ["gru", "lstm"])
def test_no_resets_and_every_step_resetting(kind):
    x, states, _, weights = _case(kind)
    _check_against_reference(kind, x, states, None, weights, TOL[torch.float64])
    every = torch.ones(x.shape[:2], dtype=torch.bool)
    out = _check_against_reference(kind, x, states, every, weights, TOL[torch.float64])
    # all states zeroed before every step: the initial state cannot matter
    other = [s.detach() * 0 + 5.0 for s in states]
    torch.testing.assert_close(_op(kind, x, other, every, weights), out)


@pytest.mark.parametrize("kind", ["gru", "lstm"])
def test_gradcheck_float64(kind):
    x, states, is_init, weights = _case(kind, n=3, t_len=4, f=2, h=3)
    fn = cpu.gru_cpu if kind == "gru" else cpu.lstm_cpu
    keep = (~is_init).double()

    def f(x, *rest):
        s, w = rest[: len(states)], rest[len(states) :]
        return fn(x, *s, keep, *w)

    assert torch.autograd.gradcheck(f, (x, *states, *weights))


@pytest.mark.parametrize("kind", ["gru", "lstm"])
def test_no_grad_forward_equals_the_training_forward_and_a_single_step(kind):
    x, states, is_init, weights = _case(kind, t_len=1)
    with_grad = _op(kind, x, states, is_init, weights)
    with torch.no_grad():
        no_grad = _op(kind, x, states, is_init, weights)
    torch.testing.assert_close(no_grad, with_grad)
    x, states, is_init, weights = _case(kind, t_len=7)
    with torch.no_grad():
        torch.testing.assert_close(_op(kind, x, states, is_init, weights), _ref(kind, x, states, is_init, weights))


@pytest.mark.parametrize("kind", ["gru", "lstm"])
def test_pooled_workspaces_two_live_graphs_and_retain_graph(kind):
    """Two forwards before either backward (two layers, two losses) must not share a workspace,
    and a graph kept with retain_graph gives the same gradients when differentiated again."""
    cpu.clear_workspaces()
    a = _case(kind, seed=1)
    b = _case(kind, seed=2)
    out_a, out_b = _op(kind, *a), _op(kind, *b)
    ga = torch.autograd.grad(_loss(out_a), [a[0], *a[3]], retain_graph=True)
    ga2 = torch.autograd.grad(_loss(out_a), [a[0], *a[3]])
    gb = torch.autograd.grad(_loss(out_b), [b[0], *b[3]])
    ra, rb = _ref(kind, *a), _ref(kind, *b)
    for got, want in zip(ga, torch.autograd.grad(_loss(ra), [a[0], *a[3]])):
        torch.testing.assert_close(got, want)
    for got, again in zip(ga, ga2):
        torch.testing.assert_close(got, again)
    for got, want in zip(gb, torch.autograd.grad(_loss(rb), [b[0], *b[3]])):
        torch.testing.assert_close(got, want)
    # the freed graphs gave their workspaces back; the next call of that shape reuses one
    del out_a, out_b
    assert cpu._pool, "no workspace came back to the pool"
    _check_against_reference(kind, *_case(kind, seed=4), TOL[torch.float64])


@pytest.mark.parametrize("used", ["hs", "cs", "hs_broadcast"])
def test_lstm_one_output_unused_or_broadcast_gradient(used):
    """Only one LSTM output in the loss (the other's gradient is None, not zero-filled), and
    ``out.sum()`` (a gradient broadcast along time, stride 0): gradients as the reference's."""
    x, states, is_init, weights = _case("lstm", n=7, t_len=10, h=6, seed=5)
    leaves = [x, *states, *weights]

    def loss(out):
        if used == "hs_broadcast":
            return out[0].sum()
        return _loss(out[0] if used == "hs" else out[1])

    got = torch.autograd.grad(loss(_op("lstm", x, states, is_init, weights)), leaves)
    want = torch.autograd.grad(loss(_ref("lstm", x, states, is_init, weights)), leaves)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **TOL[torch.float64])


def test_gru_broadcast_gradient_along_time():
    x, states, is_init, weights = _case("gru", n=7, t_len=10, h=6, seed=6)
    leaves = [x, *states, *weights]
    got = torch.autograd.grad(_op("gru", x, states, is_init, weights).sum(), leaves)
    want = torch.autograd.grad(_ref("gru", x, states, is_init, weights).sum(), leaves)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **TOL[torch.float64])


@pytest.mark.parametrize("kind", ["gru", "lstm"])
@pytest.mark.parametrize("loss", ["last_step", "one_row_every_step_reset"])
def test_gradient_from_the_final_state_only(kind, loss):
    """Only ``h_n`` (the last step) in the loss, and a loss on a row that resets before every
    step; the GRU's backward carries the state gradient in its own buffers across steps."""
    x, states, is_init, weights = _case(kind, n=5, t_len=8, h=7, seed=7)
    if loss == "one_row_every_step_reset":
        is_init[3] = True
    leaves = [x, *states, *weights]

    def f(out):
        hs = out if kind == "gru" else out[0]
        return (hs[:, -1] * torch.arange(1.0, 8.0, dtype=hs.dtype)).sum() if loss == "last_step" else hs[3].sum()

    got = torch.autograd.grad(f(_op(kind, x, states, is_init, weights)), leaves)
    want = torch.autograd.grad(f(_ref(kind, x, states, is_init, weights)), leaves)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **TOL[torch.float64])


@pytest.mark.parametrize("kind", ["gru", "lstm"])
@pytest.mark.parametrize("which", ["x", "weights", "state"])
def test_only_some_inputs_need_grad_and_non_contiguous_x(kind, which):
    """Gradients for a subset of the inputs (the others' GEMMs are skipped), ``x`` given as a
    transposed (non-contiguous) view: equal to the reference's."""
    x, states, is_init, weights = _case(kind, n=6, t_len=7, f=4, h=5, seed=8)
    x = x.detach().transpose(0, 1).contiguous().transpose(0, 1)  # [N, T, F] with time-major strides
    states = [s.detach() for s in states]
    weights = [w.detach() for w in weights]
    leaves = {"x": [x], "weights": weights, "state": states}[which]
    for t in leaves:
        t.requires_grad_()
    got = torch.autograd.grad(_loss(_op(kind, x, states, is_init, weights)), leaves)
    want = torch.autograd.grad(_loss(_ref(kind, x, states, is_init, weights)), leaves)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **TOL[torch.float64])


@pytest.mark.parametrize("t_len", [1, 3])
def test_gru_outputs_do_not_alias_pooled_workspaces(t_len):
    """Outputs (and ``dx``) are fresh tensors, also when ``T = 1`` (where a time-major buffer's
    transpose is already "contiguous"): later calls reusing the pool leave them unchanged."""
    x, states, is_init, weights = _case("gru", n=4, t_len=t_len, h=5, seed=9)
    with torch.no_grad():
        first = _op("gru", x, states, is_init, weights)
        kept = first.clone()
        _op("gru", torch.randn_like(x), states, is_init, weights)
    torch.testing.assert_close(first, kept, rtol=0, atol=0)
    out = _op("gru", x, states, is_init, weights)
    (dx,) = torch.autograd.grad(out.sum(), [x])
    dx_kept, out_kept = dx.clone(), out.detach().clone()
    del out
    _op("gru", torch.randn_like(x), states, is_init, weights).sum().backward()
    torch.testing.assert_close(dx, dx_kept, rtol=0, atol=0)
    with torch.no_grad():
        again = _op("gru", x, states, is_init, weights)
    torch.testing.assert_close(again, out_kept, rtol=0, atol=0)
