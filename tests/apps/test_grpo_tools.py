"""apps/grpo/train.py -cn tools_tiny: multi-turn GRPO with the sandboxed Python tool learns to
call it. After the SFT warm-up (the call shown on 10% of the problems) the greedy policy answers
two-digit products in its head and is wrong; GRPO raises the tool-call rate and, through the
tool's output, held-out accuracy (fixed seed)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from _load import load_app, read_rows
from tdrl.llm.agents import ERROR_KINDS


@pytest.mark.slow
def test_grpo_tools_tiny_learns_to_call_the_tool(tmp_path):
    app = load_app("grpo")
    s = app.main(["-cn", "tools_tiny", f"out={tmp_path / 'run'}"])
    rows = read_rows(tmp_path / "run" / "metrics.csv")
    assert {"tool_calls", "tool_call_rate", "tool_errors/malformed", "tool_errors/timeout", "turns"} <= set(rows[0])
    # the rollouts' call rate rises, and so do the held-out call rate and accuracy (greedy)
    assert s["train_tool_call_rate_last10"] >= s["train_tool_call_rate_first"] + 0.3, s
    assert s["tool_call_rate_after_sft"] <= 0.2 and s["tool_call_rate_after_grpo"] >= 0.8, s
    assert s["accuracy_after_sft"] <= 0.1 and s["accuracy_after_grpo"] >= 0.5, s
    assert set(s["tool_errors"]) == set(ERROR_KINDS)


def test_tool_settings_are_checked_before_any_work():
    app = load_app("grpo")
    for bad, match in ((["task=tool_arithmetic"], "needs tool=python"), (["task=nope"], "task"),
                       (["tool=calc"], "unknown tool"), (["tool=python", "max_turns=0"], "max_turns"),
                       (["tool=python", "tool_sandbox=none"], "mode='none'"),
                       (["-cn", "tools_tiny", "sft_tool_fraction=2"], "sft_tool_fraction")):
        overrides = [o for o in bad if o != "-cn" and o != "tools_tiny"]
        recipe = "tools_tiny" if "-cn" in bad else None
        with pytest.raises(ValueError, match=match):
            app.main.load(overrides, recipe=recipe)


def test_every_recipe_runs_tools_in_the_isolated_sandbox():
    """Issue 39: the app's default and every recipe that can run on a CPU keep tool_sandbox=bwrap
    (the unconfined mode only when a user writes tool_sandbox=rlimit)."""
    app = load_app("grpo")
    recipes = sorted(p.stem for p in (Path(app.__file__).parent / "recipes").glob("*.yaml"))
    assert "tools_tiny" in recipes and "smollm2_tools" in recipes
    assert app.Config.tool_sandbox == "bwrap"
    for recipe in [None, *recipes]:
        try:
            mode = app.main.load(["tool=python"] if recipe in (None, "tiny") else [], recipe=recipe).tool_sandbox
        except ValueError:  # a model or a GPU this machine lacks: the recipe's own text decides
            text = yaml.safe_load((Path(app.__file__).parent / "recipes" / f"{recipe}.yaml").read_text()) or {}
            mode = text.get("tool_sandbox", app.Config.tool_sandbox)
        assert mode == "bwrap", (recipe, mode)
    assert app.main.load(["tool=python", "tool_sandbox=rlimit"]).tool_sandbox == "rlimit"  # by name only


def test_the_real_model_tool_recipe_loads():
    from tdrl.llm.models import MODELS, install_line, model_installed

    name = "smollm2-135m-instruct"
    if not model_installed(name):
        pytest.skip(f"{name} is not installed: {install_line(MODELS[name])}")
    cfg = load_app("grpo").main.load([], recipe="smollm2_tools").grpo_config()
    assert cfg.tools == ("python",) and cfg.max_turns == 2
