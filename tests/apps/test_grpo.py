"""apps/grpo/train.py --tiny: the main app runs end to end and writes its outputs."""

from __future__ import annotations

import csv
import importlib.util
import json
import sys
from pathlib import Path

import pytest

APP = Path(__file__).resolve().parents[2] / "apps" / "grpo" / "train.py"


def _load_app():
    spec = importlib.util.spec_from_file_location("grpo_app", APP)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["grpo_app"] = mod  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_grpo_app_tiny(tmp_path):
    app = _load_app()
    out = tmp_path / "run"
    summary = app.main(["--tiny", "--out", str(out), "--threads", "1"])
    for name in ("sft/metrics.csv", "grpo/metrics.csv", "grpo/hparams.json", "reward_curve.png", "summary.json"):
        assert (out / name).stat().st_size > 0, name
    rows = list(csv.DictReader(open(out / "grpo" / "metrics.csv")))
    assert len(rows) == 4 and {"reward", "kl", "clip_frac", "tokens_per_s", "step"} <= set(rows[0])
    saved = json.loads((out / "summary.json").read_text())
    assert saved["accuracy_after_sft"] == summary["accuracy_after_sft"]
    assert 0.0 <= summary["accuracy_after_grpo"] <= 1.0
    # the final model reloads through from_pretrained, the path --model takes
    from tdrl.llm import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(out / "final")
    assert tok.padding_side == "left" and model.config.model_type == "qwen2"
    # --model PATH: start from that local folder (here the tiny model just written)
    summary2 = app.main(["--tiny", "--out", str(tmp_path / "run2"), "--model", str(out / "final"), "--threads", "1", "--sft-steps", "2", "--steps", "1"])
    assert summary2["params"] == summary["params"]
    # a rerun into the same folder starts afresh; --resume continues GRPO without redoing SFT
    sft_rows = (out / "sft" / "metrics.csv").read_text()
    resumed = app.main(["--tiny", "--out", str(out), "--threads", "1", "--resume", "--steps", "6"])
    assert (out / "sft" / "metrics.csv").read_text() == sft_rows
    assert resumed["accuracy_after_sft"] == summary["accuracy_after_sft"]
    rows = list(csv.DictReader(open(out / "grpo" / "metrics.csv")))
    assert [int(float(r["step"])) for r in rows] == [1, 2, 3, 4, 5, 6]
    app.main(["--tiny", "--out", str(out), "--threads", "1", "--steps", "2"])
    rows = list(csv.DictReader(open(out / "grpo" / "metrics.csv")))
    assert [int(float(r["step"])) for r in rows] == [1, 2]


def test_grpo_app_rejects_unknown_loss():
    app = _load_app()
    with pytest.raises(SystemExit):
        app.parse_args(["--loss", "nope"])


def test_tiny_fills_only_the_flags_not_given():
    app = _load_app()
    tiny = app.parse_args(["--tiny"])
    assert (tiny.steps, tiny.hidden_size) == (app.TINY["steps"], app.TINY["hidden_size"])
    full = app.Config()
    # a flag given wins over --tiny, even one equal to the default
    cfg = app.parse_args(["--steps", str(full.steps), "--tiny", "--lora"])
    assert (cfg.steps, cfg.hidden_size, cfg.lora) == (full.steps, app.TINY["hidden_size"], True)
    assert app.parse_args([]) == full
