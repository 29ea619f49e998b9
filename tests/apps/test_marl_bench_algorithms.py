"""MADDPG, IDDPG, MASAC, ISAC and IQL run from apps/marl_bench at a tiny budget (BenchMARL's
``algorithm=<name>`` spelling), and an algorithm whose action kind a task lacks is refused
before any work."""

from __future__ import annotations

import csv
import json
import math

import pytest

from _load import load_app

NEW = ("maddpg", "iddpg", "masac", "isac", "iql")


@pytest.fixture(scope="module")
def app():
    return load_app("marl_bench", "run.py")


@pytest.mark.parametrize("algo", NEW)
def test_new_algorithm_runs_from_the_app(app, algo, tmp_path):
    out = tmp_path / "run"
    summary = app.main(["-cn", "tiny", "task=vmas/balance", f"algorithm={algo}", "seeds=[0,1]", "num_envs=2",
                        "off_policy_frames_per_batch=8", "off_policy_batch_size=8", "n_optimizer_steps=2",
                        "n_iters=2", "eval_envs=1", "max_steps=4", "num_cells=[8]", f"out={out}"])
    rows = list(csv.DictReader(open(out / "evaluations.csv")))
    assert sorted((r["algorithm"], r["seed"], r["iter"]) for r in rows) == [
        (algo, s, i) for s in ("0", "1") for i in ("0", "1")]
    assert all(math.isfinite(float(r["eval_return"])) for r in rows)
    runs = json.loads((out / "marl_eval.json").read_text())["vmas"]["balance"][algo]
    assert sorted(runs) == ["seed_0", "seed_1"] and runs["seed_0"]["step_1"]["step_count"] == 16
    # the two seeds trained as one vectorised model, and are not copies of each other
    assert "| " + algo + " | balance |" in (out / "results.md").read_text()
    assert summary["summary"][0]["vectorised"] is True
    assert runs["seed_0"]["step_1"]["return"] != runs["seed_1"]["step_1"]["return"]


def test_iql_on_a_continuous_only_task_is_refused_before_any_work(app, tmp_path, capsys):
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as info:
        app.main(["-cn", "tiny", "task=pettingzoo/multiwalker", "algorithm=iql", f"out={out}"])
    assert info.value.code == 2
    assert "iql needs discrete actions, but pettingzoo/multiwalker has continuous actions only" in capsys.readouterr().err
    assert not out.exists()  # refused before the run folder


def test_evaluate_only_and_render_from_a_run_checkpoint(app, tmp_path, capsys):
    pytest.importorskip("imageio")
    out = tmp_path / "run"
    common = ["-cn", "tiny", "task=vmas/balance", "algorithm=iddpg", "num_envs=2", "off_policy_frames_per_batch=8",
              "off_policy_batch_size=8", "n_optimizer_steps=2", "n_iters=2", "eval_envs=2", "max_steps=4",
              "num_cells=[8]"]
    app.main([*common, "checkpoint_iters=1", f"out={out}"])
    ckpt = out / "checkpoints" / "iddpg_balance_seed0" / "step_16.pt"
    assert ckpt.is_file() and (out / "checkpoints" / "iddpg_balance_seed0" / "step_8.pt").is_file()
    capsys.readouterr()
    video = tmp_path / "episode.gif"
    app.main([*common, f"evaluate_from={ckpt}", f"video={video}", f"out={tmp_path / 'never'}"])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["frames"] == 16 and len(result["eval_episode_returns"]) == 2
    assert math.isfinite(result["eval_return"]) and result["eval_return/agents"] == result["eval_return"]
    app.main([*common, f"evaluate_from={ckpt}", f"out={tmp_path / 'never'}"])  # deterministic: the same again
    again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert again["eval_episode_returns"] == result["eval_episode_returns"] and again["video"] is None
    assert video.is_file() and len(__import__("imageio.v2").v2.mimread(video)) == 5  # reset + 4 steps
    assert not (tmp_path / "never").exists()  # evaluate-only makes no run folder


def test_video_without_a_checkpoint_is_refused(app, tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        app.main(["-cn", "tiny", "algorithm=iql", "task=vmas/balance", "video=x.gif", f"out={tmp_path / 'r'}"])
    assert info.value.code == 2 and "give evaluate_from=<checkpoint>" in capsys.readouterr().err
