"""apps/marl_bench: the tiny recipe writes a results table, a CSV of every evaluation and PNG
curves; BenchMARL's -m spelling sweeps seeds and algorithms; bad names are refused before work."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest
import torch

from _load import REPO, load_app
from tdrl.core.train import read_sweep


@pytest.fixture(scope="module")
def app():
    return load_app("marl_bench", "run.py")


def test_marl_bench_tiny_writes_table_csv_and_curves(app, tmp_path, capsys):
    out = tmp_path / "bench"
    summary = app.main(["-cn", "tiny", "tasks=[navigation]", "algorithms=[mappo,qmix]", "seeds=[0,1]",
                        "compare_sequential=true", f"out={out}"])
    table = (out / "results.md").read_text()
    assert "| mappo | navigation | 2 |" in table and "| qmix | navigation | 2 |" in table
    assert "speed-up" in table
    rows = list(csv.DictReader(open(out / "evaluations.csv")))
    # tiny: 2 iterations, evaluated after each, 2 seeds, 2 algorithms
    assert len(rows) == 2 * 2 * 2
    assert {r["seed"] for r in rows} == {"0", "1"}
    assert (out / "curves_navigation.png").stat().st_size > 1000
    assert json.loads((out / "summary.jsonl").read_text())["evaluations"] == summary["evaluations"] == 8
    assert "mappo" in capsys.readouterr().out
    # resume=true into the same folder: both pairs are read back (pairs.jsonl), none is trained
    again = app.main(["-cn", "tiny", "tasks=[navigation]", "algorithms=[mappo,qmix]", "seeds=[0,1]",
                      "compare_sequential=true", f"out={out}", "resume=true"])
    assert again["summary"] == summary["summary"] and again["evaluations"] == 8
    assert list(csv.DictReader(open(out / "evaluations.csv"))) == rows
    assert not (tmp_path / "bench-1").exists()


def test_benchmarl_style_sweep_of_seeds_and_algorithms(tmp_path):
    """``-m algorithm=mappo,qmix seed=0,1``: four jobs, each its own folder and table."""
    proc = subprocess.run(
        [sys.executable, str(REPO / "apps" / "marl_bench" / "run.py"), "-cn", "tiny", "task=navigation",
         f"out={tmp_path}", "-m", "algorithm=mappo,qmix", "seed=0,1"],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    sweep = read_sweep(tmp_path)
    assert len(sweep) == 4
    for algo in ("mappo", "qmix"):
        for seed in (0, 1):
            folder = tmp_path / f"algorithm={algo},seed={seed}"
            rows = list(csv.DictReader(open(folder / "evaluations.csv")))
            assert {r["algorithm"] for r in rows} == {algo} and {r["seed"] for r in rows} == {str(seed)}


def test_marl_bench_bad_names_list_valid_ones(app):
    with pytest.raises(ValueError, match="navigatoin") as info:
        app.main.load(["tasks=[navigatoin]"])
    assert "balance" in str(info.value) and "navigation" in str(info.value)
    with pytest.raises(ValueError, match="mappo"):
        app.main.load(["algorithm=mapo"])


def test_marl_bench_device_option(app):
    assert app.main.load(["device=cpu"]).device == "cpu"
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            app.main.load(["device=cuda"])


def test_marl_bench_recurrent_option(app, tmp_path):
    """``recurrent=true``: GRU MAPPO / IPPO / VDN through the app; what cannot be recurrent is refused."""
    out = tmp_path / "gru"
    summary = app.main(["-cn", "tiny", "tasks=[navigation]", "algorithms=[mappo,ippo,vdn]", "recurrent=true",
                        "rnn_hidden=8", f"out={out}"])
    assert [s["algorithm"] for s in summary["summary"]] == ["mappo", "ippo", "vdn"] and not summary["failures"]
    assert "| ippo | navigation | 1 |" in (out / "results.md").read_text()
    with pytest.raises(ValueError, match="mappo / ippo / qmix / vdn only"):
        app.main.load(["recurrent=true", "algorithms=[mappo,maddpg]"])
