"""Learning proof: double DQN (QValueActor, annealed epsilon-greedy, replay buffer,
DQNLoss, hard target updates) solves CartPole-v1.

Solved = mean return >= 475 over 10 fresh evaluation episodes of the greedy policy, within
a fixed frame budget, with a fixed seed. Training stops early once a periodic evaluation
reaches 475; the final check uses different episodes (seeds).
"""

from __future__ import annotations

import pytest

from tdrl.core.cli import load_app


@pytest.mark.slow
@pytest.mark.timeout(1800)  # minutes of CPU; allow for a loaded shared machine
def test_dqn_solves_cartpole(tmp_path):
    dqn = load_app("dqn")
    cfg = dqn.Config(  # the app's defaults (hard target updates every 50 steps, gamma 0.98)
        env_id="CartPole-v1", total_frames=40_000, eval_every=1_000, stop_return=475.0,
        eval_episodes=10, seed=0, out=str(tmp_path),
    )
    summary = dqn.train(cfg)
    assert summary["eval_return"] >= 475.0, summary
    assert summary["frames"] <= 40_000
