"""apps/sft/train.py: the tiny recipe on the embedded task and on a local data file, and an
exact resume."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from _load import load_app, read_rows


@pytest.fixture(scope="module")
def app():
    return load_app("sft")


@pytest.mark.slow
def test_sft_app_tiny_and_local_data(app, tmp_path):
    out = tmp_path / "run"
    summary = app.main(["-cn", "tiny", f"out={out}"])
    assert 0.0 <= summary["accuracy"] <= 1.0 and summary["final_loss"] > 0
    logged = read_rows(out / "metrics.csv")
    assert [float(r["step"]) for r in logged] == [float(i) for i in range(1, 11)]
    assert float(logged[-1]["loss"]) < float(logged[0]["loss"]), "ten SFT steps must lower the loss"
    assert (out / "final" / "config.json").exists() and (out / "config.yaml").exists()
    # data=FILE: a local jsonl with prompt/completion/answer columns, model=: the folder just saved
    rows = [{"prompt": f"Q: {a}+{b}=", "completion": str(a + b), "answer": str(a + b)} for a in range(6) for b in range(6)]
    data = tmp_path / "train.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows))
    s2 = app.main(["-cn", "tiny", f"out={tmp_path / 'run2'}", f"data={data}", f"model={out / 'final'}"])
    assert "accuracy" in s2 and len(read_rows(tmp_path / "run2" / "metrics.csv")) == 10
    # packing=true max_length=: the same data packed into rows of 64 tokens, the same loss on step 1
    s3 = app.main(["-cn", "tiny", f"out={tmp_path / 'run3'}", f"data={data}", f"model={out / 'final'}", "packing=true",
                   "max_length=64", "steps=1"])
    packed, plain = read_rows(tmp_path / "run3" / "metrics.csv"), read_rows(tmp_path / "run2" / "metrics.csv")
    assert s3["steps"] == 1 and app.main.load(["packing=true", "max_length=64"]).sft_config().max_length == 64
    assert float(packed[0]["loss"]) == pytest.approx(float(plain[0]["loss"]), rel=1e-4)
    with pytest.raises(ValueError, match="data"):
        app.main.load([f"data={tmp_path / 'missing.jsonl'}"])


@pytest.mark.slow
def test_sft_resume_equals_the_uninterrupted_run(app, tmp_path):
    """Interrupted after the step-5 checkpoint and resumed: the same losses and final weights."""
    full, part = tmp_path / "full", tmp_path / "part"
    app.main(["-cn", "tiny", f"out={full}"])
    (part / "checkpoints").mkdir(parents=True)
    shutil.copy(full / "checkpoints" / "step_5.pt", part / "checkpoints")
    shutil.copytree(full / "tiny_model", part / "tiny_model")
    shutil.copy(full / "metrics.csv", part / "metrics.csv")
    app.main(["-cn", "tiny", f"out={part}", "resume=true"])
    a, b = read_rows(full / "metrics.csv"), read_rows(part / "metrics.csv")
    assert [r["loss"] for r in a] == [r["loss"] for r in b] and len(b) == 10
    from safetensors.torch import load_file

    wa, wb = load_file(full / "final" / "model.safetensors"), load_file(part / "final" / "model.safetensors")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
