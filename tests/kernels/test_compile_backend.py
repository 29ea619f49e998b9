"""``TDRL_KERNELS=compile``: the references run through ``torch.compile`` where it pays, give
the eager results, still raise the user's input errors, and fall back when compiling fails."""

from __future__ import annotations

import pytest
import torch

from tdrl.kernels import current_backend, pg_token_loss, use_backend
from tdrl.kernels._dispatch import _compile_failed, _compiled, call_reference
from tdrl.kernels.pg_loss.reference import pg_token_loss_eager, pg_token_loss_reference


def _inputs(b: int, t: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(b, t, generator=g) * 3).requires_grad_()
    old = logp.detach() + 0.3 * torch.randn(b, t, generator=g)
    ref = logp.detach() + 0.2 * torch.randn(b, t, generator=g)
    adv = torch.randn(b, generator=g)
    mask = torch.rand(b, t, generator=g) < 0.7
    return logp, old, adv, mask, ref


def test_compiled_pg_loss_equals_the_eager_autograd_loss():
    reduction = "sequence"
    with use_backend("compile"):
        assert current_backend() == "compile"
        for b, t in [(4, 7), (3, 11)]:  # a second shape goes through a recompile
            logp, old, adv, mask, ref = _inputs(b, t, seed=b)
            loss, stats = pg_token_loss(logp, old, adv, mask, ref, 0.2, 0.28, 0.05, reduction)
            (grad,) = torch.autograd.grad(loss, logp)
            leaf = logp.detach().requires_grad_()
            want, want_stats = pg_token_loss_eager(leaf, old, adv, mask, ref, 0.2, 0.28, 0.05, reduction)
            (want_grad,) = torch.autograd.grad(want, leaf)
            torch.testing.assert_close(loss, want)
            torch.testing.assert_close(grad, want_grad)
            for k in ("clip_frac", "kl", "ratio_mean"):
                torch.testing.assert_close(stats[k], want_stats[k])
    assert pg_token_loss_reference in _compiled and pg_token_loss_reference not in _compile_failed


def test_compile_backend_keeps_input_errors():
    logp, old, adv, mask, ref = _inputs(2, 5, seed=0)
    with use_backend("compile"), pytest.raises(ValueError, match="reduction must be one of"):
        pg_token_loss(logp, old, adv, mask, ref, reduction="mean")
    with use_backend("compile"), pytest.raises(ValueError, match="must have logp's shape"):
        pg_token_loss(logp, old[:, :3], adv, mask, ref)
    assert pg_token_loss_reference not in _compile_failed


def test_compile_failure_falls_back_to_eager_with_a_warning(monkeypatch):
    """A machine without a C++ compiler: inductor cannot build the CPU kernel."""
    import torch._inductor.config as inductor_config

    monkeypatch.setattr(inductor_config.cpp, "cxx", ("/nonexistent/c++",))
    monkeypatch.setattr(inductor_config, "force_disable_caches", True)

    def scaled_sin(x):
        return (x * 3.0).sin() + x.cos()

    x = torch.linspace(-2, 2, 37)
    with use_backend("compile"), pytest.warns(RuntimeWarning, match=r"torch.compile of scaled_sin failed .*Cxx"):
        out = call_reference(scaled_sin, x)
    torch.testing.assert_close(out, scaled_sin(x))
    assert scaled_sin in _compile_failed
    with use_backend("compile"):  # from now on eager, without a second warning
        torch.testing.assert_close(call_reference(scaled_sin, x + 1), scaled_sin(x + 1))
    with use_backend("torch"):  # other backends never compile
        assert call_reference(len, [1, 2]) == 2 and len not in _compiled


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="compile"):
        with use_backend("inductor"):
            pass
