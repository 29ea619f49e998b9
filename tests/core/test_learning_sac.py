"""Learning proof: SAC (TanhNormal actor, clipped double-Q, automatic entropy tuning,
replay buffer, soft target updates) reaches a mean return > -250 on Pendulum-v1.

Evaluated over 10 fresh episodes of the deterministic policy (tanh of the mean), fixed
seed, capped frame budget; training stops early once a periodic evaluation reaches -200.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def load_app(name: str):
    """Import ``apps/<name>/train.py`` as a module (apps are scripts, not packages)."""
    spec = importlib.util.spec_from_file_location(f"_tdrl_app_{name}", REPO / "apps" / name / "train.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
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
