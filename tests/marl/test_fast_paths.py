"""The speed paths keep the maths: oneDNN linear == addmm (values and gradients), GAE with
reused critic values == GAE with two full critic passes."""

from __future__ import annotations

import pytest
import torch

from tdrl.marl.algorithms import make_mappo
from tdrl.marl.envs import VmasEnv
from tdrl.marl.modules._linear import linear_io, onednn_available
from tdrl.marl.objectives import MAPPOConfig, MultiAgentGAE
from tdrl.marl.loops import collect


@pytest.mark.skipif(not onednn_available(), reason="torch build without oneDNN")
@pytest.mark.parametrize("bias", [True, False])
def test_linear_io_matches_addmm_values_and_gradients(bias):
    torch.manual_seed(0)
    x = torch.randn(37, 13, requires_grad=True)
    w = torch.randn(13, 7, requires_grad=True)
    b = torch.randn(7, requires_grad=True) if bias else None
    gy = torch.randn(37, 7)
    out = linear_io(x, w, b)
    assert out.grad_fn is not None and "OneDNN" in type(out.grad_fn).__name__
    grads = torch.autograd.grad(out, [x, w] + ([b] if bias else []), gy)
    ref = torch.addmm(b, x, w) if bias else x @ w
    ref_grads = torch.autograd.grad(ref, [x, w] + ([b] if bias else []), gy)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5)


def test_linear_io_falls_back_under_vmap_and_for_float64():
    torch.manual_seed(0)
    x, w, b = torch.randn(3, 5, 4), torch.randn(4, 2), torch.randn(2)
    out = torch.func.vmap(lambda xi: linear_io(xi, w, b))(x)
    torch.testing.assert_close(out, x @ w + b)
    xd, wd = x[0].double(), w.double()
    torch.testing.assert_close(linear_io(xd, wd), xd @ wd)


def test_linear_io_takes_addmm_off_the_cpu():
    # a non-CPU tensor (meta here; cuda on a GPU machine) never reaches the oneDNN op
    x = torch.randn(5, 3, device="meta", requires_grad=True)
    w = torch.randn(3, 4, device="meta", requires_grad=True)
    b = torch.randn(4, device="meta", requires_grad=True)
    out = linear_io(x, w, b)
    assert out.shape == (5, 4) and type(out.grad_fn).__name__ == "AddmmBackward0"
    out.sum().backward()
    assert w.grad.shape == (3, 4)


def test_builders_put_the_networks_on_the_env_device():
    env = VmasEnv("navigation", num_envs=2, seed=0, n_agents=2)
    env.device = torch.device("meta")  # stands in for a cuda env: only the builders' move is checked
    parts = make_mappo(env, MAPPOConfig(), num_cells=(8,))
    assert {p.device.type for p in parts.loss.parameters()} == {"meta"}


def test_gae_reusing_values_equals_two_critic_passes():
    torch.manual_seed(0)
    # episodes of 7 steps inside a 20-step batch: resets in the middle of the batch
    env = VmasEnv("navigation", num_envs=6, max_steps=7, seed=0, n_agents=2)
    parts = make_mappo(env, MAPPOConfig(), num_cells=(16,))
    batch, _ = collect(env, parts.policy, env.reset(), 20)
    assert batch.get(("next", "done")).any()
    fast = MultiAgentGAE(0.99, 0.9, value_network=parts.critic, reuse_values=True)(batch.clone())
    slow = MultiAgentGAE(0.99, 0.9, value_network=parts.critic)(batch.clone())
    for key in [("next", "agents", "state_value"), ("agents", "advantage"), ("agents", "value_target")]:
        torch.testing.assert_close(fast.get(key), slow.get(key), rtol=1e-5, atol=1e-6)
    # shuffled in time: nothing can be reused, the result is still exact
    perm = torch.randperm(20)
    fast = MultiAgentGAE(0.99, 0.9, value_network=parts.critic, reuse_values=True)(batch[:, perm].clone())
    slow = MultiAgentGAE(0.99, 0.9, value_network=parts.critic)(batch[:, perm].clone())
    torch.testing.assert_close(fast.get(("next", "agents", "state_value")),
                               slow.get(("next", "agents", "state_value")), rtol=1e-5, atol=1e-6)
