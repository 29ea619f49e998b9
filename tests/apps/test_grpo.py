"""apps/grpo/train.py: the main app's tiny recipe end to end, its outputs, resume without
redoing SFT, reruns that never delete, settings checked before any work, torchrun and
accelerate launch."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from _load import REPO, load_app, read_rows


@pytest.fixture(scope="module")
def app():
    return load_app("grpo")


@pytest.mark.slow
def test_grpo_app_tiny(app, tmp_path):
    out = tmp_path / "run"
    summary = app.main(["-cn", "tiny", f"out={out}"])
    for name in ("sft/metrics.csv", "metrics.csv", "config.yaml", "reward_curve.png", "summary.json"):
        assert (out / name).stat().st_size > 0, name
    rows = read_rows(out / "metrics.csv")
    assert len(rows) == 4 and {"reward", "kl", "clip_frac", "tokens_per_s", "step"} <= set(rows[0])
    saved = json.loads((out / "summary.json").read_text())
    assert saved["accuracy_after_sft"] == summary["accuracy_after_sft"]
    assert 0.0 <= summary["accuracy_after_grpo"] <= 1.0
    # the final model reloads through from_pretrained, the path model= takes
    from tdrl.llm import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(out / "final")
    assert tok.padding_side == "left" and model.config.model_type == "qwen2"
    # model=PATH: start from that local folder (here the tiny model just written)
    summary2 = app.main(["-cn", "tiny", f"out={tmp_path / 'run2'}", f"model={out / 'final'}", "sft_steps=2", "steps=1"])
    assert summary2["params"] == summary["params"]
    # resume=true continues GRPO from the last checkpoint without redoing SFT
    sft_rows = (out / "sft" / "metrics.csv").read_text()
    resumed = app.main(["-cn", "tiny", f"out={out}", "resume=true", "steps=6"])
    assert (out / "sft" / "metrics.csv").read_text() == sft_rows
    assert resumed["accuracy_after_sft"] == summary["accuracy_after_sft"]
    assert [int(float(r["step"])) for r in read_rows(out / "metrics.csv")] == [1, 2, 3, 4, 5, 6]
    # a rerun without resume never touches the earlier run: it gets a numbered folder
    before = (out / "metrics.csv").read_text()
    again = app.main(["-cn", "tiny", f"out={out}", "steps=2"])
    assert again["out"] == str(tmp_path / "run-1") and (out / "metrics.csv").read_text() == before
    assert [int(float(r["step"])) for r in read_rows(tmp_path / "run-1" / "metrics.csv")] == [1, 2]


def test_grpo_and_sft_settings_are_checked_before_any_work(app, tmp_path):
    for bad, key in (("loss=nope", "loss"), ("lr=-1", "lr"), ("temperature=0", "temperature"),
                     ("prompts_per_step=0", "prompts_per_step"), ("sft_lr=nan", "lr"),
                     ("max_new_tokens=0", "max_new_tokens"), ("checkpoint_every=-1", "checkpoint_every")):
        with pytest.raises(ValueError, match=key):
            app.main.load([bad])
    with pytest.raises(ValueError, match="chat=true needs model="):  # the tiny model has no chat template
        app.main.load(["chat=true"])
    with pytest.raises(ValueError, match="device"):
        app.main.load(["device=gpu"])
    with pytest.raises(SystemExit) as info:  # the command line: exit 2, nothing written
        app.main([f"out={tmp_path / 'x'}", "group_size=0"])
    assert info.value.code == 2 and not (tmp_path / "x").exists()


def test_tiny_recipe_and_flags(app):
    tiny = app.main.load(recipe="tiny")
    assert (tiny.steps, tiny.hidden_size) == (4, 32)
    cfg = app.main.load(["steps=250", "lora=true"], recipe="tiny")  # a flag wins over the recipe
    assert (cfg.steps, cfg.hidden_size, cfg.lora) == (250, 32, True)
    assert app.main.load() == app.Config()


@pytest.mark.slow
def test_torchrun_two_ranks_is_one_job(tmp_path):
    """``torchrun --nproc_per_node 2`` on the tiny recipe: one run folder written by rank 0,
    each rank's checkpoint holds the same weights (DDP keeps the replicas equal)."""
    out = tmp_path / "ddp"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29671",
         str(REPO / "apps" / "grpo" / "train.py"), "-cn", "tiny", f"out={out}", "steps=2", "sft_steps=4"],
        capture_output=True, text=True, timeout=600, env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [p.name for p in tmp_path.iterdir()] == ["ddp"]  # one job, one folder
    rows = read_rows(out / "metrics.csv")
    assert [int(float(r["step"])) for r in rows] == [1, 2]  # rank 0 wrote each round once
    from tdrl.core.train import load_checkpoint

    rank0 = load_checkpoint(out / "checkpoints" / "step_2.pt")["objects"]["trainer"]
    rank1 = load_checkpoint(out / "checkpoints" / "rank1" / "step_2.pt")["objects"]["trainer"]
    assert rank0["model"].keys() == rank1["model"].keys()
    assert all(torch.equal(rank0["model"][k], rank1["model"][k]) for k in rank0["model"])
    assert rank0["sampler"] != rank1["sampler"] or rank0["rng"]["torch"].ne(rank1["rng"]["torch"]).any()


@pytest.mark.slow
def test_accelerate_launch_two_processes_is_one_job(tmp_path):
    """``accelerate launch --multi_gpu --num_processes 2`` (accelerate's torch.distributed.run path;
    gloo without CUDA) starts the same one job as torchrun: one folder, one checkpoint per rank."""
    pytest.importorskip("accelerate")
    out = tmp_path / "acc"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
         "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "29672",
         str(REPO / "apps" / "grpo" / "train.py"), "-cn", "tiny", f"out={out}", "steps=2", "sft_steps=4"],
        capture_output=True, text=True, timeout=600, env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rank 1 of 2" in proc.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["acc"]
    assert [int(float(r["step"])) for r in read_rows(out / "metrics.csv")] == [1, 2]
    assert (out / "checkpoints" / "step_2.pt").exists() and (out / "checkpoints" / "rank1" / "step_2.pt").exists()
