"""Asynchronous GRPO (one step off-policy): round k+1 generated in a background thread with a
snapshot of the weights while round k trains, corrected by truncated importance sampling."""

from __future__ import annotations

import pytest

from tdrl.llm import GRPOConfig, GRPOLossConfig, GRPOTrainer


def digit_fraction_reward(prompts, completions, **_):
    return [sum(ch.isdigit() for ch in c) / 4.0 for c in completions]


def test_async_grpo_raises_reward_one_step_off_policy(tiny, task):
    _, model, tok = tiny
    ds = task.splits(128, 16, seed=0)[0]
    cfg = GRPOConfig(steps=15, prompts_per_step=8, group_size=8, max_new_tokens=4, lr=1e-2, seed=0, progress=False,
                     async_generation=True, loss=GRPOLossConfig(tis_cap=2.0))
    trainer = GRPOTrainer(model, tok, [digit_fraction_reward], ds, cfg)
    rounds = []
    orig = trainer.rollout

    def spy(batch, generator=None):  # which weights generated each round: the snapshot, never the live model
        rounds.append(generator is trainer._async_generator)
        return orig(batch, generator)

    trainer.rollout = spy
    hist = trainer.train()
    first = sum(m["reward"] for m in hist[:3]) / 3
    last = sum(m["reward"] for m in hist[-3:]) / 3
    assert last > first + 0.15, f"mean reward did not rise enough: {first:.3f} -> {last:.3f}"
    assert len(rounds) == 16 and all(rounds)  # 15 trained + the one started for a 16th step
    assert trainer._pending is None


def test_async_generation_refuses_a_custom_generator(tiny, task):
    from tdrl.llm.generation import HFGenerator

    _, model, tok = tiny
    with pytest.raises(ValueError, match="async_generation=True needs the default generator"):
        GRPOTrainer(model, tok, [digit_fraction_reward], task.splits(8, 2, seed=0)[0],
                    GRPOConfig(async_generation=True, progress=False), generator=HFGenerator(model, tok))
