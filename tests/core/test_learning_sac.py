"""Learning proof: SAC (TanhNormal actor, clipped double-Q, automatic entropy tuning,
replay buffer, soft target updates) reaches a mean return > -250 on Pendulum-v1.

Evaluated over 10 fresh episodes of the deterministic policy (tanh of the mean), fixed
seed, capped frame budget; training stops early once a periodic evaluation reaches -200.
"""

from __future__ import annotations

import pytest

from tdrl.core.cli import load_app


@pytest.mark.timeout(1800)  # minutes of CPU; allow for a loaded shared machine
def test_sac_solves_pendulum(tmp_path):
    sac = load_app("sac")
    cfg = sac.Config(
        env_id="Pendulum-v1", total_frames=8_000, learning_starts=500, hidden=(64, 64),
        eval_every=1_000, stop_return=-200.0, eval_episodes=10, log_every=500, seed=0,
        out=str(tmp_path),
    )
    summary = sac.train(cfg)
    assert summary["eval_return"] > -250.0, summary
    assert summary["frames"] <= 8_000
