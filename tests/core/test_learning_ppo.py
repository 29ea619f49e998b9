"""Learning proof: PPO (tdrl.core modules, GAE, PPOLoss) solves CartPole-v1.

Solved = mean return >= 475 over 10 fresh evaluation episodes of the deterministic
(argmax) policy, within a fixed frame budget, with a fixed seed. Training stops early once
a periodic evaluation reaches 475; the final check uses different episodes (seeds).
"""

from __future__ import annotations

import csv
import pytest

from tdrl.core.cli import load_app


@pytest.mark.timeout(1800)  # about a minute of CPU; allow for a loaded shared machine
def test_ppo_solves_cartpole(tmp_path):
    ppo = load_app("ppo")
    cfg = ppo.Config(  # the app's defaults (RL Zoo CartPole settings), capped budget
        env_id="CartPole-v1", total_frames=60_000, eval_every=8_192, stop_return=475.0,
        eval_episodes=10, seed=0, out=str(tmp_path),
    )
    summary = ppo.train(cfg)
    assert summary["eval_return"] >= 475.0, summary
    assert summary["frames"] <= 60_000
    with open(tmp_path / "metrics.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    first = [float(r["train_return"]) for r in rows if r.get("train_return") not in ("", "nan")]
    assert first[0] < 100.0  # it started from a random policy and learned
