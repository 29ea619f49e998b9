"""apps/sft/train.py --tiny: SFT runs end to end on the embedded task and on a local data file."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

APP = Path(__file__).resolve().parents[2] / "apps" / "sft" / "train.py"


def _load_app():
    spec = importlib.util.spec_from_file_location("sft_app", APP)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["sft_app"] = mod  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_sft_app_tiny_and_local_data(tmp_path):
    app = _load_app()
    out = tmp_path / "run"
    summary = app.main(["--tiny", "--out", str(out)])
    assert 0.0 <= summary["accuracy"] <= 1.0 and summary["final_loss"] > 0
    from tdrl.core.train import CSVLogger

    logged = CSVLogger(out, "sft").read()
    assert logged["step"] == [float(i) for i in range(1, 11)]
    assert logged["loss"][-1] < logged["loss"][0], "ten SFT steps must lower the loss"
    assert (out / "final" / "config.json").exists()
    # --data: a local jsonl with prompt/completion/answer columns, --model: the folder just saved
    rows = [{"prompt": f"Q: {a}+{b}=", "completion": str(a + b), "answer": str(a + b)} for a in range(6) for b in range(6)]
    data = tmp_path / "train.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows))
    s2 = app.main(["--tiny", "--out", str(tmp_path / "run2"), "--data", str(data), "--model", str(out / "final")])
    assert "accuracy" in s2 and len(CSVLogger(tmp_path / "run2", "sft").read()["step"]) == 10  # --tiny: 10 steps
