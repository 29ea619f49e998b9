"""benchmarks/marl_parity.py: one update of tdrl's MAPPO and QMIX equals TorchRL's ClipPPOLoss + GAE
and QMixerLoss + TD0 (BenchMARL's losses) on the same weights and batch. Needs .venv-benchmarl
(benchmarks/setup_benchmarl.sh); skipped without it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parents[2]
_VENV_PY = _ROOT / ".venv-benchmarl" / "bin" / "python"
pytestmark = [pytest.mark.skipif(not _VENV_PY.exists(), reason="no .venv-benchmarl (benchmarks/setup_benchmarl.sh)"),
              pytest.mark.skipif(importlib.util.find_spec("vmas") is None, reason="needs vmas")]


def _load():
    return importlib.import_module("benchmarks.marl_parity")


def test_mappo_update_equals_torchrls():
    res = _load().run("mappo", seed=0)
    assert set(res) == {"advantage", "value_target", "loss_objective", "loss_critic", "actor_grads", "critic_grads"}
    assert max(res.values()) < 1e-5, res


def test_mappo_saturated_actions_are_where_the_log_probs_differ():
    """The documented difference exists and is the only one: saturated actions (TorchRL clamps
    tanh at 1 - 1e-6) change the actor's gradient, nothing else."""
    res = _load().run("mappo", seed=0, loc_shift=4.0)
    assert res["actor_grads"] > 1e-2, res
    assert max(res["advantage"], res["value_target"], res["loss_critic"], res["critic_grads"]) < 1e-5, res


def test_qmix_update_equals_torchrls_and_only_the_time_limit_differs():
    res = _load().run("qmix", seed=0)
    same = [v for k, v in res.items() if "tdrl_flags" in k]
    other = [v for k, v in res.items() if "torchrl_flags" in k]
    assert len(same) == len(other) == 3
    assert max(same) < 1e-5, res  # the same computation
    assert min(other) > 1e-4, res  # the batch crosses the time limit: TorchRL's flags change the targets
