"""Learning proof (CI-sized): BC on a small expert Pendulum-v1 dataset, made in the test by an
energy-pumping swing-up controller with a PD balance near the top and written as a D4RL HDF5
file, beats uniformly random actions by a wide margin with a fixed seed."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from _load import load_app
from tdrl.core.datasets import write_d4rl


def _expert(obs: np.ndarray) -> float:
    cos, sin, vel = obs
    if cos > 0.85:  # near the top: PD on the angle
        return float(np.clip(-12.0 * math.atan2(sin, cos) - 2.5 * vel, -2.0, 2.0))
    energy = vel**2 / 6.0 + 10.0 * cos  # 10 at rest on the top
    return 2.0 * float(np.sign(vel) or 1.0) * (1.0 if energy < 10.0 else -1.0)


def _episodes(policy, n: int, seed: int):
    env = gym.make("Pendulum-v1")
    rows, returns = [], []
    for ep in range(n):
        obs, _ = env.reset(seed=seed + ep)
        total = 0.0
        for t in range(200):
            act = policy(obs)
            nxt, rew, term, trunc, _ = env.step(np.array([act], dtype=np.float32))
            rows.append((obs, act, rew, nxt, term, trunc, ep))
            total += rew
            obs = nxt
        returns.append(total)
    env.close()
    return rows, float(np.mean(returns))


def test_bc_on_an_expert_dataset_beats_random(tmp_path):
    torch.manual_seed(0)
    rows, expert_return = _episodes(_expert, 12, seed=100)
    col = list(zip(*rows))
    f = lambda x: torch.tensor(np.array(x), dtype=torch.float32)  # noqa: E731
    from tensordict import TensorDict

    n = len(rows)
    data = TensorDict(observation=f(col[0]), action=f(col[1])[:, None], episode=torch.tensor(col[6]),
                      next=TensorDict(observation=f(col[3]), reward=f(col[2])[:, None],
                                      terminated=torch.tensor(col[4])[:, None], truncated=torch.tensor(col[5])[:, None],
                                      done=(torch.tensor(col[4]) | torch.tensor(col[5]))[:, None], batch_size=[n]),
                      batch_size=[n])
    write_d4rl(data, tmp_path / "expert.hdf5", attrs={"env": "Pendulum-v1", "policy": "swing-up controller"})
    rng = np.random.default_rng(0)
    _, random_return = _episodes(lambda o: float(rng.uniform(-2, 2)), 5, seed=200)
    app = load_app("offline")
    summary = app.main(["-cn", "tiny", f"out={tmp_path / 'bc'}", "algorithm=bc", f"dataset={tmp_path / 'expert.hdf5'}",
                        "steps=1500", "batch_size=128", "lr=1e-3", "hidden=[64,64]", "eval_every=0",
                        "eval_episodes=5", "checkpoint_every=0", "log_every=500"])
    assert expert_return > -450 and random_return < -1000, (expert_return, random_return)
    assert summary["dataset_return"] == pytest.approx(expert_return, rel=1e-4)
    assert summary["eval_return"] > random_return + 500, (summary["eval_return"], random_return, expert_return)
