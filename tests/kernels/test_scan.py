"""GAE and discounted cumsum: golden values, parity with a naive loop, Triton vs reference."""

from __future__ import annotations

import pytest
import torch
from tdrl.kernels import (
    discounted_cumsum,
    discounted_cumsum_reference,
    gae,
    gae_reference,
    use_backend,
)
from tdrl.kernels._dispatch import use_triton


def naive_gae(reward, value, next_value, done, terminated, gamma, lmbda):
    """The obvious Python loop over time (TorchRL's generalized_advantage_estimate)."""
    adv = torch.zeros_like(reward)
    last = torch.zeros_like(reward[..., 0, :])
    for t in reversed(range(reward.shape[-2])):
        not_term = (~terminated[..., t, :]).to(reward.dtype)
        not_done = (~done[..., t, :]).to(reward.dtype)
        delta = reward[..., t, :] + gamma * next_value[..., t, :] * not_term - value[..., t, :]
        last = delta + gamma * lmbda * not_done * last
        adv[..., t, :] = last
    return adv, adv + value


def naive_cumsum(x, gamma, done):
    y = torch.zeros_like(x)
    last = torch.zeros_like(x[..., 0, :])
    for t in reversed(range(x.shape[-2])):
        last = x[..., t, :] + gamma * (~done[..., t, :]).to(x.dtype) * last
        y[..., t, :] = last
    return y


def rollout(shape, seed=0, p_done=0.1):
    g = torch.Generator().manual_seed(seed)
    reward, value, next_value = (torch.randn(shape, generator=g) for _ in range(3))
    terminated = torch.rand(shape, generator=g) < p_done
    done = terminated | (torch.rand(shape, generator=g) < p_done)
    return reward, value, next_value, done, terminated


def col(*v, dtype=torch.float32):
    return torch.tensor(v, dtype=dtype).reshape(1, -1, 1)


# Hand-computed: gamma = lmbda = 0.5, value = [1, 2, 3], next_value = [2, 3, 4], reward = [1, 1, 2]
# so delta = r + 0.5 * V' - V = [1, 0.5, 1] and the lambda-trace decays by 0.25 per step.
GOLDEN = {
    # no episode end: A2 = 1, A1 = 0.5 + 0.25 * 1, A0 = 1 + 0.25 * 0.75
    "none": ((False, False, False), (False, False, False), (1.1875, 0.75, 1.0)),
    # terminated after step 1: delta1 = 1 - 2 = -1 (no bootstrap) and the trace stops
    "terminated": ((False, True, False), (False, True, False), (0.75, -1.0, 1.0)),
    # truncated after step 1: delta1 = 0.5 still bootstraps, only the trace stops
    "truncated": ((False, True, False), (False, False, False), (1.125, 0.5, 1.0)),
}


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("case", list(GOLDEN))
def test_gae_golden_terminated_vs_truncated(case, backend):
    done, term, expected = GOLDEN[case]
    value = col(1.0, 2.0, 3.0)
    with use_backend(backend):
        adv, target = gae(
            col(1.0, 1.0, 2.0), value, col(2.0, 3.0, 4.0),
            torch.tensor(done).reshape(1, 3, 1), torch.tensor(term).reshape(1, 3, 1), 0.5, 0.5,
        )
    torch.testing.assert_close(adv, col(*expected))
    torch.testing.assert_close(target, col(*expected) + value)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_discounted_cumsum_golden(backend):
    x = col(1.0, 2.0, 3.0)
    with use_backend(backend):
        plain = discounted_cumsum(x, 0.5)
        cut = discounted_cumsum(x, 0.5, done=torch.tensor([False, True, False]).reshape(1, 3, 1))
    torch.testing.assert_close(plain, col(2.75, 3.5, 3.0))
    torch.testing.assert_close(cut, col(2.0, 2.0, 3.0))


@pytest.mark.parametrize("shape", [(1, 1), (3, 1, 1), (4, 7, 1), (2, 3, 50, 2), (5, 1024, 1), (37, 1)])
def test_reference_matches_naive_loop(shape):
    r, v, nv, d, term = rollout(shape)
    adv, target = gae_reference(r, v, nv, d, term, 0.99, 0.95)
    adv_n, target_n = naive_gae(r, v, nv, d, term, 0.99, 0.95)
    torch.testing.assert_close(adv, adv_n, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(target, target_n, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(discounted_cumsum_reference(r, 0.9, d), naive_cumsum(r, 0.9, d), atol=1e-5, rtol=1e-5)


def test_tensor_gamma_and_float64():
    r, v, nv, d, term = rollout((3, 20, 1))
    gamma = torch.linspace(0.9, 0.99, 3).reshape(3, 1, 1)
    adv, _ = gae_reference(r, v, nv, d, term, gamma, 0.9)
    torch.testing.assert_close(adv, naive_gae(r, v, nv, d, term, gamma.reshape(3, 1), 0.9)[0], atol=1e-5, rtol=1e-5)
    r64, v64, nv64 = r.double(), v.double(), nv.double()
    adv64, _ = gae(r64, v64, nv64, d, term, 0.99, 0.95)
    assert adv64.dtype == torch.float64
    torch.testing.assert_close(adv64, naive_gae(r64, v64, nv64, d, term, 0.99, 0.95)[0])


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_bfloat16_computed_in_float32(backend):
    r, v, nv, d, term = (x.bfloat16() if x.is_floating_point() else x for x in rollout((3, 40, 1)))
    with use_backend(backend):
        adv, target = gae(r, v, nv, d, term, 0.99, 0.95)
    assert adv.dtype == target.dtype == torch.bfloat16
    adv32, _ = naive_gae(r.float(), v.float(), nv.float(), d, term, 0.99, 0.95)
    torch.testing.assert_close(adv.float(), adv32.bfloat16().float(), atol=0, rtol=0)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_gradients_match_autograd_of_naive_loop(backend):
    r, v, nv, d, term = rollout((2, 130, 1), seed=3)
    v.requires_grad_(True)
    r.requires_grad_(True)
    w = torch.randn_like(r)
    with use_backend(backend):
        adv, target = gae(r, v, nv, d, term, 0.9, 0.8)
    g = torch.autograd.grad(((adv + target) * w).sum(), (r, v))
    adv_n, target_n = naive_gae(r, v, nv, d, term, 0.9, 0.8)
    g_n = torch.autograd.grad(((adv_n + target_n) * w).sum(), (r, v))
    for a, b in zip(g, g_n, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shape", [(1, 1, 1), (17, 1, 1), (3, 129, 1), (2, 2, 140, 3), (5, 300, 1)])
def test_triton_matches_reference_forward_backward(shape):
    r, v, nv, d, term = rollout(shape, seed=1)
    x = r.clone().requires_grad_(True)
    g = torch.randn(shape)
    with use_backend("torch"):
        ref = discounted_cumsum(x, 0.97, d)
        gref = torch.autograd.grad((ref * g).sum(), x)[0]
        adv_ref, _ = gae(r, v, nv, d, term, 0.99, 0.95)
    with use_backend("triton"):
        out = discounted_cumsum(x, 0.97, d)
        gout = torch.autograd.grad((out * g).sum(), x)[0]
        adv, _ = gae(r, v, nv, d, term, 0.99, 0.95)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gout, gref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(adv, adv_ref, atol=1e-5, rtol=1e-5)


def test_dispatch_rules(monkeypatch):
    x = torch.zeros(2, 3, 1)
    assert not use_triton(x)  # CPU tensors run the reference by default
    with use_backend("triton"):
        assert use_triton(x)  # TRITON_INTERPRET=1 (tests/conftest.py) allows it on CPU
    monkeypatch.setenv("TDRL_KERNELS", "torch")
    assert not use_triton(x)
    monkeypatch.setenv("TDRL_KERNELS", "bogus")
    with pytest.raises(ValueError, match="TDRL_KERNELS"):
        use_triton(x)


def test_shape_errors_name_the_input():
    r, v, nv, d, term = rollout((2, 5, 1))
    with pytest.raises(ValueError, match="value"):
        gae(r, v[:, :4], nv, d, term, 0.99, 0.95)
    with pytest.raises(ValueError, match=r"\[\.\.\., T, F\]"):
        discounted_cumsum(torch.zeros(5), 0.9)
