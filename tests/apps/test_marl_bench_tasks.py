"""Every BenchMARL task (28 VMAS, 10 PettingZoo) runs from apps/marl_bench at a tiny budget.

One algorithm each: MAPPO (continuous actions where the task has them, as BenchMARL's
``prefer_continuous_actions``), 2 envs, one iteration of a few frames, 4-step episodes. Each
run must report a finite evaluation return under its environment in ``marl_eval.json``, with
one ``<group>_return`` per agent group (``return`` their mean, as BenchMARL's logger writes it).
All 38 take ~25 s together on this 2-core machine (the slowest, sampling, ~4 s), so none is
marked ``slow``.
"""

from __future__ import annotations

import csv
import importlib
import json
import math

import pytest

from _load import load_app
from tdrl.marl.runner import TASKS
from tdrl.marl.tasks import TASK_NAMES


@pytest.fixture(scope="module")
def app():
    return load_app("marl_bench", "run.py")


@pytest.mark.parametrize("task", TASK_NAMES)
def test_every_task_runs_from_the_app(app, task, tmp_path):
    spec = TASKS[task]
    if spec["env"] == "pettingzoo" and spec["name"] in ("multiwalker", "waterworld"):
        try:
            importlib.import_module(f"pettingzoo.sisl.{spec['scenario']}")
        except ImportError as err:
            pytest.skip(f"{task} needs pettingzoo[sisl] with {spec['scenario']} ({err})")
    spelling = f"vmas/{task}" if spec["env"] == "vmas" else task
    out = tmp_path / "run"
    app.main(["-cn", "tiny", f"task={spelling}", "algorithm=mappo", "num_envs=2", "frames_per_batch=8",
              "minibatch_size=8", "n_iters=1", "eval_envs=1", "max_steps=4", "num_cells=[8]", f"out={out}"])
    rows = list(csv.DictReader(open(out / "evaluations.csv")))
    assert [(r["algorithm"], r["task"], r["iter"]) for r in rows] == [("mappo", task, "0")]
    assert math.isfinite(float(rows[0]["eval_return"]))
    data = json.loads((out / "marl_eval.json").read_text())
    step = data[spec["env"]][spec["name"]]["mappo"]["seed_0"]["step_0"]
    groups = sorted(k for k in step if k.endswith("_return") and k != "return")
    if spec["group_map"] is None:
        assert groups == ["agents_return"]
    else:  # one group per name prefix, as TorchRL (BenchMARL) groups them
        assert len(groups) > 1
    assert len(step["return"]) == 1 and step["step_count"] == 8
    mean = sum(step[g][0] for g in groups) / len(groups)
    assert step["return"][0] == pytest.approx(mean, rel=1e-5, abs=1e-6)
