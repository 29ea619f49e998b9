"""apps/offline: the tiny recipe for every algorithm (random Pendulum dataset written as D4RL
HDF5, training, evaluation, outputs), the dataset given as a file, and bad settings."""

from __future__ import annotations

import json
import math

import pytest

from _load import load_app, read_rows


@pytest.fixture(scope="module")
def app():
    return load_app("offline")


@pytest.mark.parametrize("algorithm", ["bc", "td3_bc", "iql", "cql", "dt"])
def test_tiny_run_for_every_algorithm(app, tmp_path, algorithm):
    out = tmp_path / "run"
    small_dt = ["context=5", "embed_dim=32", "num_layers=1"] if algorithm == "dt" else []
    summary = app.main(["-cn", "tiny", f"out={out}", f"algorithm={algorithm}", *small_dt])
    assert summary["steps"] == 60 and summary["dataset_transitions"] == 1000
    assert math.isfinite(summary["eval_return"]) and math.isfinite(summary["dataset_return"])
    rows = read_rows(out / "metrics.csv")
    losses = [float(r["loss_actor"]) for r in rows if r.get("loss_actor")]
    assert len(losses) == 3 and all(math.isfinite(v) for v in losses)
    if algorithm in ("bc", "dt"):  # imitation of the dataset actions improves
        assert losses[-1] < losses[0]
    assert json.loads((out / "summary.json").read_text())["algorithm"] == algorithm
    for name in ("dataset.hdf5", "model.pt", "learning_curve.png", "config.yaml"):
        assert (out / name).exists(), name


def test_dt_recipe_runs_with_the_measured_settings(app, tmp_path):
    out = tmp_path / "dt"
    summary = app.main(["-cn", "dt", f"out={out}", "steps=4", "dataset_frames=400", "eval_every=0",
                        "eval_episodes=1", "log_every=2", "progress=false"])
    assert summary["algorithm"] == "dt" and summary["steps"] == 4
    cfg = (out / "config.yaml").read_text()
    for line in ("batch_size: 64", "lr: 0.0001", "context: 20", "embed_dim: 64", "num_layers: 2"):
        assert line in cfg, line


def test_a_given_dataset_is_used_as_is(app, tmp_path):
    first = app.main(["-cn", "tiny", f"out={tmp_path / 'a'}", "algorithm=bc", "dataset_frames=400"])
    data = tmp_path / "a" / "dataset.hdf5"
    again = app.main(["-cn", "tiny", f"out={tmp_path / 'b'}", "algorithm=td3_bc", f"dataset={data}"])
    assert again["dataset_transitions"] == first["dataset_transitions"] == 400
    assert again["dataset_return"] == first["dataset_return"]
    assert not (tmp_path / "b" / "dataset.hdf5").exists()


def test_bad_settings_are_refused(app, tmp_path):
    for bad, key in (("algorithm=dqn", "algorithm"), ("context=0", "context"), ("return_scale=0", "return_scale"), (f"dataset={tmp_path / 'none.hdf5'}", "dataset"),
                     ("steps=0", "steps"), ("lr=-1", "lr")):
        with pytest.raises(ValueError, match=key):
            app.main.load([bad])
