"""apps/marl_bench --tiny: a results table, a CSV of every evaluation and PNG curves."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

import pytest
import torch

_APP = Path(__file__).resolve().parents[2] / "apps" / "marl_bench" / "run.py"


def _load():
    spec = importlib.util.spec_from_file_location("marl_bench_run", _APP)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_marl_bench_tiny_writes_table_csv_and_curves(tmp_path, capsys):
    app = _load()
    out = tmp_path / "bench"
    assert app.main(["--tiny", "--tasks", "navigation", "--algorithms", "mappo,qmix", "--seeds", "0,1",
                     "--compare_sequential", "true", "--out_dir", str(out)]) == 0
    table = (out / "results.md").read_text()
    assert "| mappo | navigation | 2 |" in table and "| qmix | navigation | 2 |" in table
    assert "speed-up" in table
    rows = list(csv.DictReader(open(out / "evaluations.csv")))
    # tiny: 2 iterations, evaluated after each, 2 seeds, 2 algorithms
    assert len(rows) == 2 * 2 * 2
    assert {r["seed"] for r in rows} == {"0", "1"}
    assert (out / "curves_navigation.png").stat().st_size > 1000
    assert "mappo" in capsys.readouterr().out


def test_marl_bench_bad_names_list_valid_ones(capsys):
    app = _load()
    with pytest.raises(SystemExit):
        app.parse_args(["--tasks", "navigatoin"])
    err = capsys.readouterr().err
    assert "navigatoin" in err and "balance" in err and "navigation" in err
    with pytest.raises(SystemExit):
        app.parse_args(["--algorithms", "mapo"])
    assert "mappo" in capsys.readouterr().err


def test_marl_bench_device_option(capsys):
    app = _load()
    assert app.parse_args(["--device", "cpu"]).device == "cpu"
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit):
            app.parse_args(["--device", "cuda"])
        assert "CUDA is not available" in capsys.readouterr().err
