"""The compiled float32 time loops of the CPU GRU / LSTM path (``recurrent/cpu_ext.cpp``):
outputs and gradients against the float64 reference and the Python loops, resets (none, every
step, at t = 0), only ``h_n`` in the loss, subsets of inputs needing grad, ``T = 1``, broadcast
and unused output gradients, outputs not aliasing pooled workspaces; the fallback when the
build fails (one warning) and ``TDRL_RECURRENT_EXT=0``."""

from __future__ import annotations

import shutil
import warnings

import pytest
import torch
from tdrl.kernels import gru_reference, gru_sequence, lstm_reference, lstm_sequence
from tdrl.kernels.recurrent import cpu_ext

TOL32 = {"atol": 3e-5, "rtol": 3e-4}


@pytest.fixture
def ext():
    mod = cpu_ext.extension()
    if mod is None:
        pytest.skip("the recurrent CPU extension is not available here")
    return mod


def _case(kind, n=9, t_len=11, f=5, h=12, seed=0, bias=True, resets="random"):
    g = torch.Generator().manual_seed(seed)
    gates = 3 if kind == "gru" else 4
    mk = lambda *s: (torch.randn(*s, generator=g) * 0.6).requires_grad_()  # noqa: E731
    x = mk(n, t_len, f)
    states = [mk(n, h) for _ in range(1 if kind == "gru" else 2)]
    is_init = {
        "random": torch.rand(n, t_len, generator=g) < 0.3,
        "none": torch.zeros(n, t_len, dtype=torch.bool),
        "every": torch.ones(n, t_len, dtype=torch.bool),
    }[resets]
    if resets == "random":
        is_init[:2, 0] = True
    weights = [mk(gates * h, f), mk(gates * h, h)] + ([mk(gates * h), mk(gates * h)] if bias else [])
    return x, states, is_init, weights


def _op(kind, x, states, is_init, weights):
    return (gru_sequence if kind == "gru" else lstm_sequence)(x, *states, is_init, *weights)


def _ref64(kind, x, states, is_init, weights):
    """The reference in float64 on the same (float32) values: what float32 should approximate."""
    d = lambda t: t.double()  # noqa: E731  (differentiable: grads come back in float32)
    fn = gru_reference if kind == "gru" else lstm_reference
    out = fn(d(x), *map(d, states), is_init, *map(d, weights))
    return tuple(o.float() for o in out) if isinstance(out, tuple) else out.float()


def _loss(out, seed=3):
    g = torch.Generator().manual_seed(seed)
    outs = out if isinstance(out, tuple) else (out,)
    return sum((o * torch.randn(o.shape, generator=g)).sum() for o in outs)


def _compare(kind, case, loss=_loss, leaves=None):
    x, states, is_init, weights = case
    leaves = [x, *states, *weights] if leaves is None else leaves
    out, ref = _op(kind, *case), _ref64(kind, *case)
    torch.testing.assert_close(out, ref, **TOL32)
    got = torch.autograd.grad(loss(out), leaves)
    want = torch.autograd.grad(loss(ref), leaves)
    for i, (a, b) in enumerate(zip(got, want)):
        torch.testing.assert_close(a, b, **TOL32, msg=lambda m, i=i: f"grad of leaf {i}: {m}")
    return out, got


def test_extension_builds_where_a_compiler_is():
    if shutil.which("g++") is None and shutil.which("c++") is None or shutil.which("ninja") is None:
        pytest.skip("no C++ compiler / ninja here")
    assert cpu_ext.extension() is not None, cpu_ext._state.get("failed")


@pytest.mark.parametrize("kind", ["gru", "lstm"])
@pytest.mark.parametrize("variant", ["random", "none", "every", "t1", "no_bias", "h_not_mult_8"])
def test_matches_the_reference_and_the_python_loops(ext, monkeypatch, kind, variant):
    kw = {"t1": {"t_len": 1}, "no_bias": {"bias": False}, "h_not_mult_8": {"h": 13}}.get(variant, {})
    case = _case(kind, resets=variant if variant in ("none", "every") else "random", **kw)
    out, grads = _compare(kind, case)
    monkeypatch.setenv("TDRL_RECURRENT_EXT", "0")  # the same float32 maths in Python
    py = _op(kind, *case)
    x, states, _, weights = case
    py_grads = torch.autograd.grad(_loss(py), [x, *states, *weights])
    torch.testing.assert_close(out, py, atol=2e-6, rtol=1e-5)
    for a, b in zip(grads, py_grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("kind", ["gru", "lstm"])
@pytest.mark.parametrize("loss", ["last_step", "one_row_every_step_reset", "broadcast_sum"])
def test_final_state_only_and_broadcast_gradients(ext, kind, loss):
    case = _case(kind, n=5, t_len=8, h=7, seed=7)
    if loss == "one_row_every_step_reset":
        case[2][3] = True

    def f(out):
        hs = out if kind == "gru" else out[0]
        if loss == "last_step":
            return (hs[:, -1] * torch.arange(1.0, 8.0)).sum()
        return hs[3].sum() if loss == "one_row_every_step_reset" else hs.sum()

    _compare(kind, case, loss=f)


@pytest.mark.parametrize("used", ["hs", "cs"])
def test_lstm_one_output_unused(ext, used):
    case = _case("lstm", n=7, t_len=10, h=6, seed=5)
    _compare("lstm", case, loss=lambda out: _loss(out[0] if used == "hs" else out[1]))


@pytest.mark.parametrize("kind", ["gru", "lstm"])
@pytest.mark.parametrize("which", ["x", "weights", "state", "w_hh_only"])
def test_only_some_inputs_need_grad_and_non_contiguous_x(ext, kind, which):
    x, states, is_init, weights = _case(kind, n=6, t_len=7, f=4, h=5, seed=8)
    x = x.detach().transpose(0, 1).contiguous().transpose(0, 1)
    states = [s.detach() for s in states]
    weights = [w.detach() for w in weights]
    leaves = {"x": [x], "weights": weights, "state": states, "w_hh_only": weights[1:2]}[which]
    for t in leaves:
        t.requires_grad_()
    _compare(kind, (x, states, is_init, weights), leaves=leaves)


@pytest.mark.parametrize("kind", ["gru", "lstm"])
@pytest.mark.parametrize("t_len", [1, 3])
def test_outputs_do_not_alias_pooled_workspaces(ext, kind, t_len):
    x, states, is_init, weights = _case(kind, n=4, t_len=t_len, h=5, seed=9)
    first = lambda out: out if kind == "gru" else out[0]  # noqa: E731
    with torch.no_grad():
        a = _op(kind, x, states, is_init, weights)
        kept = [t.clone() for t in (a if isinstance(a, tuple) else (a,))]
        _op(kind, torch.randn_like(x), states, is_init, weights)
    for t, k in zip(a if isinstance(a, tuple) else (a,), kept):
        torch.testing.assert_close(t, k, rtol=0, atol=0)
    out = _op(kind, x, states, is_init, weights)
    grads = torch.autograd.grad(first(out).sum(), [x, *states])
    grads_kept, out_kept = [g.clone() for g in grads], first(out).detach().clone()
    del out
    first(_op(kind, torch.randn_like(x), states, is_init, weights)).sum().backward()
    for g, k in zip(grads, grads_kept):
        torch.testing.assert_close(g, k, rtol=0, atol=0)
    with torch.no_grad():
        torch.testing.assert_close(first(_op(kind, x, states, is_init, weights)), out_kept, rtol=0, atol=0)


class _Spy:
    """Counts the calls into the extension's functions (and forwards them)."""

    def __init__(self, mod):
        self.mod, self.calls = mod, []

    def __getattr__(self, name):
        fn = getattr(self.mod, name)

        def call(*args):
            self.calls.append(name)
            return fn(*args)

        return call


def test_float32_uses_the_extension_and_float64_does_not(ext, monkeypatch):
    spy = _Spy(ext)
    monkeypatch.setitem(cpu_ext._state, "module", spy)
    for kind in ("gru", "lstm"):
        case = _case(kind, n=3, t_len=4, h=4)
        _loss(_op(kind, *case)).backward()
        with torch.no_grad():
            _op(kind, *case)
    assert spy.calls == ["gru_forward", "gru_backward", "gru_forward"] + [
        "lstm_forward", "lstm_backward", "lstm_forward",
    ]  # fmt: skip
    spy.calls.clear()
    x, states, is_init, weights = _case("gru", n=3, t_len=4, h=4)
    d = lambda t: t.detach().double().requires_grad_()  # noqa: E731
    _op("gru", d(x), [d(s) for s in states], is_init, [d(w) for w in weights]).sum().backward()
    assert spy.calls == []


def test_disabled_by_the_environment_variable(monkeypatch):
    class Boom:
        def __getattr__(self, name):
            raise AssertionError("the extension was called although TDRL_RECURRENT_EXT=0")

    monkeypatch.setitem(cpu_ext._state, "module", Boom())
    monkeypatch.setenv("TDRL_RECURRENT_EXT", "0")
    assert cpu_ext.extension() is None
    for kind in ("gru", "lstm"):
        _compare(kind, _case(kind, n=4, t_len=5, h=6, seed=2))


def test_a_failed_build_falls_back_with_one_warning(monkeypatch):
    saved = dict(cpu_ext._state)
    cpu_ext._state.clear()

    def fail():
        raise RuntimeError("no compiler (forced by the test)")

    monkeypatch.setattr(cpu_ext, "_build", fail)
    try:
        with pytest.warns(RuntimeWarning, match="forced by the test"):
            out = _compare("gru", _case("gru", n=4, t_len=5, h=6, seed=3))
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no second warning, no second build attempt
            _compare("lstm", _case("lstm", n=4, t_len=5, h=6, seed=3))
        assert out is not None and "failed" in cpu_ext._state
    finally:
        cpu_ext._state.clear()
        cpu_ext._state.update(saved)
