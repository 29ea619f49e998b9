"""Seeds stacked into one vmap-ed model behave exactly like separate models."""

from __future__ import annotations

import pytest
import torch

from tdrl.core.objectives import total_loss
from tdrl.marl.algorithms import make_mappo
from tdrl.marl.envs import VmasEnv
from tdrl.marl.modules import MultiAgentMLP, QMixer
from tdrl.marl.objectives import MAPPOConfig
from tdrl.marl.loops import TrainConfig, collect, train_on_policy
from tdrl.marl.vectorised import SeedStackedModule, make_vectorised_on_policy


def test_seed_stacked_module_equals_each_module():
    torch.manual_seed(0)
    mods = [MultiAgentMLP(4, 3, 2, share_params=False, num_cells=(8,)) for _ in range(3)]
    stacked = SeedStackedModule(mods)
    x = torch.randn(3 * 5, 2, 4)
    out = stacked(x)
    for s, m in enumerate(mods):
        torch.testing.assert_close(out[5 * s: 5 * (s + 1)], m(x[5 * s: 5 * (s + 1)]))
    assert stacked.stacked_params[0].shape == (3, 2, 4, 8)


@pytest.mark.parametrize("share", [True, False])
@pytest.mark.parametrize("centralised", [True, False])
def test_multi_agent_mlp_seed_stacked_path_equals_each_module(share, centralised):
    """MultiAgentMLP's batched seed path (no vmap) gives each seed's own forward and gradients,
    also with extra batch dims ([n_seeds * E, T, n_agents, in])."""
    torch.manual_seed(0)
    mods = [MultiAgentMLP(4, 3, 2, centralised=centralised, share_params=share, num_cells=(8, 8)) for _ in range(3)]
    stacked = SeedStackedModule(mods)
    assert stacked._stacked_forward is not None
    x = torch.randn(3 * 5, 2, 2, 4)
    out = stacked(x)
    out.square().sum().backward()
    for s, m in enumerate(mods):
        ref = m(x[5 * s: 5 * (s + 1)])
        torch.testing.assert_close(out[5 * s: 5 * (s + 1)], ref)
        ref.square().sum().backward()
        for p_stack, p in zip(stacked.stacked_params, m.parameters()):
            torch.testing.assert_close(p_stack.grad[s], p.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("hidden", [64, None])
def test_qmixer_seed_stacked_path_equals_each_mixer(hidden):
    torch.manual_seed(0)
    mixers = [QMixer((3, 5), 3, mixing_embed_dim=8, hypernet_hidden=hidden) for _ in range(2)]
    stacked = SeedStackedModule(mixers)
    assert stacked._stacked_forward is not None
    q, state = torch.randn(2 * 6, 3, 1), torch.randn(2 * 6, 3, 5)
    out = stacked(q, state)
    assert out.shape == (12, 1)
    out.sum().backward()
    for s, m in enumerate(mixers):
        ref = m(q[6 * s: 6 * (s + 1)], state[6 * s: 6 * (s + 1)])
        torch.testing.assert_close(out[6 * s: 6 * (s + 1)], ref)
        ref.sum().backward()
        for p_stack, p in zip(stacked.stacked_params, m.parameters()):
            torch.testing.assert_close(p_stack.grad[s], p.grad, rtol=1e-5, atol=1e-6)


def test_vectorised_mappo_gradients_equal_per_seed_gradients():
    seeds, E = [3, 7], 4
    env = VmasEnv("navigation", num_envs=len(seeds) * E, seed=0, n_agents=2)
    cfg = MAPPOConfig(gamma=0.9)
    vec = make_vectorised_on_policy(env, seeds, cfg, num_cells=(16,))
    torch.manual_seed(0)
    batch, _ = collect(env, vec.policy, env.reset(), 3)
    vec.estimator(batch)
    flat = batch.reshape(-1)
    (total_loss(vec.loss(flat)) * len(seeds)).backward()
    actor_stack = vec.policy.module[0].module
    for s, seed in enumerate(seeds):
        torch.manual_seed(seed)
        single = make_mappo(env, cfg, num_cells=(16,))
        block = batch[s * E:(s + 1) * E]
        single.estimator(block)  # same critic weights -> same advantages
        torch.testing.assert_close(block["agents", "advantage"], batch[s * E:(s + 1) * E]["agents", "advantage"])
        total_loss(single.loss(block.reshape(-1))).backward()
        single_grads = [p.grad for p in single.policy.module[0].module.parameters()]
        for g_stack, g_single in zip(actor_stack.stacked_params, single_grads):
            torch.testing.assert_close(g_stack.grad[s], g_single, rtol=1e-4, atol=1e-6)


def test_vectorised_training_runs_and_reports_each_seed():
    seeds = [0, 1]
    env = VmasEnv("navigation", num_envs=2 * 8, max_steps=10, seed=0, n_agents=2)
    eval_env = VmasEnv("navigation", num_envs=2 * 2, max_steps=10, seed=1, n_agents=2)
    parts = make_vectorised_on_policy(env, seeds, MAPPOConfig(), num_cells=(16,))
    before = [p.detach().clone() for p in parts.loss.parameters()]
    cfg = TrainConfig(frames_per_batch=40, n_iters=2, num_epochs=1, minibatch_size=20, lr=1e-3,
                      eval_interval=1, max_steps=10)
    hist = train_on_policy(env, parts, cfg, eval_env=eval_env, n_seeds=2)
    assert hist[-1]["frames"] == 80 and len(hist[-1]["eval_return_seeds"]) == 2
    assert any(not torch.equal(a, b) for a, b in zip(before, parts.loss.parameters()))
