"""apps/examples: TRL's GRPO and SFT quick starts, in TRL's spelling, train the tiny model
(issue 42: a TRL user's quick starts run with the import line changed)."""

from __future__ import annotations

import ast

import pytest

import torch

from _load import REPO, load_example as _example, read_rows




def _calls(name: str) -> dict[str, list[str]]:
    """The keywords of each tdrl config / trainer call in an example's source."""
    tree = ast.parse((REPO / "apps" / "examples" / f"{name}.py").read_text())
    found: dict[str, list[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id.endswith(("Config", "Trainer")):
            found.setdefault(node.func.id, []).extend(k.arg for k in node.keywords)
    return found


@pytest.mark.parametrize("name", ["trl_grpo_quickstart", "trl_sft_quickstart"])
def test_quickstarts_are_spelled_as_trl_spells_them(name):
    """Every keyword the ports pass is a TRL name tdrl accepts (no tdrl-only spelling)."""
    from tdrl.llm import trl_names

    tables = {t.owner: t for t in (trl_names.GRPO_CONFIG_NAMES, trl_names.GRPO_TRAINER_NAMES,
                                   trl_names.SFT_CONFIG_NAMES, trl_names.SFT_TRAINER_NAMES)}
    calls = _calls(name)
    assert {"GRPOConfig", "GRPOTrainer"} <= set(calls) or {"SFTConfig", "SFTTrainer"} <= set(calls)
    for owner, keywords in calls.items():
        accepted = {r.trl for r in tables[owner].names if r.kind != "refuse"}
        assert set(keywords) <= accepted, f"{owner}: {sorted(set(keywords) - accepted)} are not TRL's names"


def _changed(before: dict, model) -> bool:
    return any(not torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_trl_grpo_quickstart(tmp_path):
    example = _example("trl_grpo_quickstart")
    trainer = example.main(str(tmp_path))
    cfg = trainer.config  # TRL's names, read as TRL reads them
    assert (cfg.steps, cfg.group_size, cfg.max_new_tokens, cfg.lr) == (3, 4, 8, 1e-3)
    assert (cfg.minibatch_size, cfg.prompts_per_step, cfg.grad_accum) == (8, 2, 1)  # 8 completions a step and a round
    rows = read_rows(tmp_path / "metrics.csv")  # output_dir holds the run's metrics
    assert [float(r["step"]) for r in rows] == [1.0, 2.0, 3.0]
    # the logged reward is TRL's reward_len on the round's completions
    expect = sum(example.reward_len(trainer.last_completions)) / len(trainer.last_completions)
    assert float(rows[-1]["reward"]) == expect <= 0
    from tdrl.llm import load_model_and_tokenizer

    start, _ = load_model_and_tokenizer(tmp_path / "tiny_model")
    assert _changed(start.state_dict(), trainer.model), "three GRPO steps must change the weights"


def test_trl_sft_quickstart(tmp_path):
    trainer = _example("trl_sft_quickstart").main(str(tmp_path))
    assert (trainer.config.steps, trainer.config.batch_size, trainer.config.lr) == (10, 16, 3e-3)
    rows = read_rows(tmp_path / "metrics.csv")
    assert len(rows) == 10
    assert float(rows[-1]["loss"]) < float(rows[0]["loss"]), "ten SFT steps must lower the loss"
