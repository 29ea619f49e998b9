"""MAPPO on VMAS navigation improves the deterministic evaluation return at a fixed seed."""

from __future__ import annotations

import torch

from tdrl.marl.algorithms import make_mappo
from tdrl.marl.envs import VmasEnv
from tdrl.marl.objectives import MAPPOConfig
from tdrl.marl.loops import TrainConfig, evaluate, train_on_policy


def test_mappo_navigation_improves_return():
    torch.manual_seed(0)
    env = VmasEnv("navigation", num_envs=200, max_steps=50, seed=0, n_agents=2)
    eval_env = VmasEnv("navigation", num_envs=50, max_steps=50, seed=123, n_agents=2)
    parts = make_mappo(env, MAPPOConfig(gamma=0.95, lmbda=0.9), num_cells=(64, 64))
    before = evaluate(eval_env, parts.policy, 50)
    cfg = TrainConfig(frames_per_batch=5000, n_iters=12, num_epochs=4, minibatch_size=1000,
                      lr=1e-3, eval_interval=0, max_steps=50)
    history = train_on_policy(env, parts, cfg)
    after = evaluate(eval_env, parts.policy, 50)
    print(f"eval return before {before:.3f} after {after:.3f}")
    assert history[-1]["frames"] == 60_000
    assert after > before + 0.5, (before, after)
