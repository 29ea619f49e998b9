"""benchmarks/marl_seeds_table.py: a benchmark of several seeds, tdrl's seeds as one vectorised
model against BenchMARL's seeds one after another: its arithmetic (by hand), its reuse of
finished pairs, and tdrl's real vectorised run of two seeds on VMAS."""

from __future__ import annotations

import importlib

import pytest

seeds_table = importlib.import_module("benchmarks.marl_seeds_table")
marl_table = importlib.import_module("benchmarks.marl_table")


def test_the_summary_counts_every_seed_by_hand():
    ours = {"frames": 600, "wall_s": 2.0, "cpu_s": 4.0, "sim_s": 1.0, "returns": [1.0, 3.0]}
    theirs = [{"frames": 600, "wall_s": 3.0, "cpu_s": 3.0, "sim_s": 1.0, "return": 0.0},
              {"frames": 600, "wall_s": 5.0, "cpu_s": 5.0, "sim_s": 2.0, "return": 2.0}]
    s = seeds_table.summarise(ours, theirs)
    assert s["tdrl frames/s"] == 600 and s["BenchMARL frames/s"] == 150  # 1200 / 2 s vs 1200 / 8 s
    assert s["ratio"] == pytest.approx(4.0) and s["cpu ratio"] == pytest.approx(2.0)  # 1200/4 vs 1200/8
    assert s["own ratio"] == pytest.approx((5.0 / 1200) / (1.0 / 1200))  # (8-3) vs (2-1) seconds outside VMAS
    assert s["sim share"] == pytest.approx((0.5, 3.0 / 8.0))
    assert s["tdrl return"] == "2.000 ± 1.414" and s["BenchMARL return"] == "1.000 ± 1.414" and s["seeds"] == 2


def test_finished_pairs_are_reused_and_one_seed_is_refused(tmp_path, monkeypatch):
    calls = []

    def tdrl(task, algorithm, budget, seeds, device="cpu"):
        calls.append(("tdrl", tuple(seeds)))
        return {"frames": 600, "wall_s": 1.0, "cpu_s": 1.0, "sim_s": 0.5, "returns": [0.0] * len(seeds)}

    def peer(task, algorithm, budget, seed, device):
        calls.append(("benchmarl", seed))
        return {"frames": 600, "wall_s": 1.0, "cpu_s": 1.0, "sim_s": 0.5, "return": 0.0}

    monkeypatch.setattr(seeds_table, "run_tdrl", tdrl)
    monkeypatch.setattr(seeds_table, "benchmarl_subprocess", peer)
    monkeypatch.setattr(seeds_table, "BENCHMARL_PY", tmp_path)  # exists: the side-by-side path runs
    argv = ["--tasks", "wheel", "--algorithms", "qmix", "--runs", str(tmp_path / "runs.ndjson"), "--seeds", "0", "1"]
    seeds_table.main(argv)
    assert calls == [("tdrl", (0, 1)), ("benchmarl", 0), ("benchmarl", 1)]
    calls.clear()
    seeds_table.main(argv)
    assert calls == []
    seeds_table.main([*argv, "--fresh"])
    assert len(calls) == 3
    with pytest.raises(SystemExit, match="at least two distinct seeds"):
        seeds_table.main([*argv[:-3], "--seeds", "3"])


def test_tdrl_trains_two_seeds_as_one_vectorised_run():
    """The real tdrl side: two seeds on one SeedAxis, each evaluated on its own block."""
    pytest.importorskip("vmas")
    budget = marl_table.Budget(envs=4, frames_per_batch=200, iters=1, minibatch=100, optimizer_steps=2,
                               train_batch=16, eval_episodes=3)
    out = marl_table.run_tdrl("navigation", "iql", budget, [0, 1])
    assert out["frames"] == 200 and len(out["returns"]) == 2
    assert out["return"] == pytest.approx(sum(out["returns"]) / 2)
    assert out["returns"][0] != out["returns"][1]  # two different seeds' policies
    assert 0 < out["sim_s"] < out["wall_s"]
