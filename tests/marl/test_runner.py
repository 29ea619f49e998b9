"""The benchmark runner: every task x algorithm family trains; results survive crashes and
failing pairs.

Budgets are CI-sized (4 envs, 2 iterations of 5 steps, episodes of 12 steps so that the
slow full reset of ``sampling`` happens only at evaluation).
"""

from __future__ import annotations

import csv
import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tdrl.marl.runner import TASKS, BenchConfig, BenchmarkFailed, run_benchmark

TINY = dict(num_envs=4, frames_per_batch=20, n_iters=2, num_epochs=1, minibatch_size=10, num_cells=(16,),
            off_policy_frames_per_batch=20, n_optimizer_steps=2, off_policy_batch_size=16, eval_envs=2,
            eval_interval=1, max_steps=12)


FIRST_FIVE = ("balance", "navigation", "sampling", "transport", "wheel")
SISL = ("pettingzoo/multiwalker", "pettingzoo/waterworld")  # need pettingzoo[sisl]; continuous only


def _grid():
    """Every task x {mappo, qmix}: the five first tasks by default, the rest of the grid marked
    ``slow`` (tests/apps/test_marl_bench_tasks.py runs every task once at CI size)."""
    for task in sorted(TASKS):
        for algo in ("mappo", "qmix"):
            marks = [] if task in FIRST_FIVE else [pytest.mark.slow]
            yield pytest.param(task, algo, marks=marks, id=f"{task}-{algo}")


@pytest.mark.parametrize("task, algo", list(_grid()))  # one on-policy, one off-policy family
def test_every_task_trains_and_evaluates_every_seed(task, algo, tmp_path):
    """Both families run two seeds as one vectorised model, reported per seed."""
    if task in SISL:
        try:
            __import__(f"pettingzoo.sisl.{TASKS[task]['scenario']}")
        except ImportError as err:
            pytest.skip(f"{task}: PettingZoo's SISL task does not import here ({err})")
        if algo == "qmix":
            pytest.skip(f"{task} has continuous actions only (as in BenchMARL)")
    seeds = (0, 1)
    cfg = BenchConfig(algorithms=(algo,), tasks=(task,), seeds=seeds, out_dir=str(tmp_path), **TINY)
    result = run_benchmark(cfg)
    rows = result["evaluations"]
    assert sorted((r["seed"], r["iter"]) for r in rows) == [(s, i) for s in seeds for i in (0, 1)]
    assert all(math.isfinite(r["eval_return"]) for r in rows)
    assert all(r["frames"] == 20 * (r["iter"] + 1) for r in rows)
    (summary,) = result["summary"]
    assert summary["vectorised"] is True and math.isfinite(summary["final_return_mean"])
    assert result["failures"] == []
    # every evaluation episode is kept (one per eval sub-env of its seed), and marl-eval's JSON
    for r in rows:
        assert len(r["eval_episode_returns"]) == 2
        assert math.isclose(sum(r["eval_episode_returns"]) / 2, r["eval_return"], rel_tol=1e-5, abs_tol=1e-6)
    env, _, name = task.rpartition("/")
    runs = json.loads((tmp_path / "marl_eval.json").read_text())[env or "vmas"][name][algo]
    assert sorted(runs) == [f"seed_{s}" for s in seeds]
    for r in rows:
        run = runs[f"seed_{r['seed']}"]
        groups = {f"{k.split('/', 1)[1]}_return": v for k, v in r.items() if k.startswith("eval_episode_returns/")}
        assert groups and all(len(v) == 2 for v in groups.values())  # each group's return, per seed
        assert run[f"step_{r['iter']}"] == {"step_count": r["frames"], "return": r["eval_episode_returns"], **groups}
        best = max(x for q in rows if q["seed"] == r["seed"] for x in q["eval_episode_returns"])
        assert run["absolute_metrics"] == {"return": [best]}
    lines = (tmp_path / "evaluations.jsonl").read_text().splitlines()
    assert [(d["seed"], d["iter"], d["eval_return"]) for d in map(json.loads, lines)] == [
        (r["seed"], r["iter"], r["eval_return"]) for r in rows]


def test_vectorised_qmix_against_sequential_seeds(tmp_path):
    """compare_sequential with QMIX: the vectorised seeds, then the same seeds one after another
    (rows of the latter are not added), and the speed-up row in the table."""
    cfg = BenchConfig(algorithms=("qmix",), tasks=("navigation",), seeds=(0, 1), compare_sequential=True,
                      out_dir=str(tmp_path), **TINY)
    result = run_benchmark(cfg)
    (sp,) = result["speedups"]
    assert sp["algorithm"] == "qmix" and sp["seeds"] == 2 and sp["speedup"] == pytest.approx(
        sp["sequential_s"] / sp["vectorised_s"])
    assert sorted((r["seed"], r["iter"]) for r in result["evaluations"]) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert len({r["eval_return"] for r in result["evaluations"]}) > 1  # the seeds are not copies
    assert "| qmix | navigation | 2 |" in (tmp_path / "results.md").read_text()


@pytest.mark.parametrize("algo", ["ippo", "vdn"])
def test_wheel_with_the_other_algorithms(algo, tmp_path):
    """The pairs that crashed the tiny runner (IPPO on wheel; VDN for the off-policy side)."""
    cfg = BenchConfig(algorithms=(algo,), tasks=("wheel",), seeds=(0, 1), out_dir=str(tmp_path), **TINY)
    result = run_benchmark(cfg)
    assert len(result["evaluations"]) == 4 and not result["failures"]


def test_a_failing_pair_is_recorded_and_the_others_run(tmp_path, monkeypatch):
    # impossible only once VMAS builds the world: 5 agents share a goal, but there are 3 agents
    bad = {**TASKS["navigation"], "kwargs": {**TASKS["navigation"]["kwargs"], "agents_with_same_goal": 5}}
    monkeypatch.setitem(TASKS, "navigation_impossible", bad)
    cfg = BenchConfig(algorithms=("mappo",), tasks=("navigation_impossible", "balance"), seeds=(0,),
                      out_dir=str(tmp_path), **TINY)
    with pytest.raises(BenchmarkFailed, match=r"1 of 2 \(algorithm, task\) pairs failed: mappo on "
                                              r"navigation_impossible \(AssertionError"):
        run_benchmark(cfg)
    with open(tmp_path / "evaluations.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["task"], r["iter"]) for r in rows] == [("balance", "0"), ("balance", "1")]
    md = (tmp_path / "results.md").read_text()
    assert "| mappo | balance | 1 |" in md
    assert "| mappo | navigation_impossible | AssertionError" in md
    (failure,) = [json.loads(x) for x in (tmp_path / "failures.jsonl").read_text().splitlines()]
    assert failure["task"] == "navigation_impossible" and "agents_with_same_goal" in failure["traceback"]


def test_the_finished_pairs_survive_a_killed_run(tmp_path):
    """SIGKILL during the second pair: the first pair's evaluations and table row are on disk."""
    script = textwrap.dedent(f"""
        import torch
        from tdrl.marl.runner import BenchConfig, run_benchmark
        torch.set_num_threads(1)
        tiny = {TINY!r}
        tiny["n_optimizer_steps"] = 100_000  # MAPPO is unaffected; QMIX runs until killed
        cfg = BenchConfig(algorithms=("mappo", "qmix"), tasks=("balance",), seeds=(0,),
                          out_dir={str(tmp_path)!r}, **tiny)
        run_benchmark(cfg)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    md = tmp_path / "results.md"
    deadline = time.monotonic() + 240
    try:
        while "| mappo | balance |" not in (md.read_text() if md.exists() else ""):
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "the first pair did not finish in time"
            time.sleep(0.1)
        time.sleep(0.5)
        assert proc.poll() is None, "the run ended before it could be killed"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    text = md.read_text()
    assert "| mappo | balance | 1 |" in text and "In progress: 1 of 2" in text
    rows = [json.loads(x) for x in (tmp_path / "evaluations.jsonl").read_text().splitlines()]
    assert [(r["algorithm"], r["iter"]) for r in rows] == [("mappo", 0), ("mappo", 1)]
    # resume: the finished pair is read back, not trained again; the interrupted one is trained
    # from its start, and any evaluations it had written are dropped (one is faked here: the
    # killed QMIX had not finished its first iteration)
    with open(tmp_path / "evaluations.jsonl", "a") as f:
        f.write(json.dumps({**rows[0], "algorithm": "qmix", "eval_return": 1e9}) + "\n")
    import tdrl.marl.runner as runner

    trained = []
    real = runner._run_seeds

    def counting(cfg, algo, task, *args, **kwargs):
        trained.append(algo)
        return real(cfg, algo, task, *args, **kwargs)

    runner._run_seeds = counting
    try:
        cfg = BenchConfig(algorithms=("mappo", "qmix"), tasks=("balance",), seeds=(0,),
                          out_dir=str(tmp_path), resume=True, **TINY)
        result = run_benchmark(cfg)
    finally:
        runner._run_seeds = real
    assert trained == ["qmix"]
    after = [json.loads(x) for x in (tmp_path / "evaluations.jsonl").read_text().splitlines()]
    assert after[:2] == rows and [(r["algorithm"], r["iter"]) for r in after[2:]] == [("qmix", 0), ("qmix", 1)]
    assert all(r["eval_return"] < 1e9 for r in after)
    assert [s["algorithm"] for s in result["summary"]] == ["mappo", "qmix"]
    assert "| qmix | balance | 1 |" in (tmp_path / "results.md").read_text()


def test_a_torn_pairs_line_is_skipped_with_a_warning_and_trained_again(tmp_path, caplog):
    """A run killed while appending to pairs.jsonl leaves a torn last line: resume warns, trains
    that pair again, and the file holds whole lines afterwards (no glued append)."""
    import tdrl.marl.runner as runner

    run_benchmark(BenchConfig(algorithms=("mappo",), tasks=("balance",), seeds=(0,), out_dir=str(tmp_path), **TINY))
    pairs = tmp_path / "pairs.jsonl"
    with open(pairs, "a") as f:
        f.write('{"algorithm": "qmix", "task": "bal')  # torn: no closing brace, no newline
    trained, real = [], runner._run_seeds

    def counting(cfg, algo, task, *args, **kwargs):
        trained.append(algo)
        return real(cfg, algo, task, *args, **kwargs)

    runner._run_seeds = counting
    try:
        with caplog.at_level("WARNING", logger="tdrl.marl.runner"):
            result = run_benchmark(BenchConfig(algorithms=("mappo", "qmix"), tasks=("balance",), seeds=(0,),
                                               out_dir=str(tmp_path), resume=True, **TINY))
    finally:
        runner._run_seeds = real
    assert "pairs.jsonl line 2 is not JSON" in caplog.text
    assert trained == ["qmix"]
    assert [(r["algorithm"], r["task"]) for r in map(json.loads, pairs.read_text().splitlines())] == [
        ("mappo", "balance"), ("qmix", "balance")]
    assert [s["algorithm"] for s in result["summary"]] == ["mappo", "qmix"]
