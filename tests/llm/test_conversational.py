"""TRL's conversational formats and reward-function failures, on the tiny embedded model.

The tiny tokenizer has no chat template; the tests give a copy of it a minimal one
(``<|user|>`` / ``<|assistant|>`` markers, EOS after each assistant turn).
"""

from __future__ import annotations

import copy
import logging

import datasets
import pytest
import torch

from tdrl.llm import (
    GRPOConfig,
    GRPOTrainer,
    RewardFunctionError,
    SFTConfig,
    SFTTrainer,
    compute_rewards,
    conversation_pairs,
    math_answer_reward,
    render_prompts,
    tokenize_sft,
)
from tdrl.llm.rewards import thread_safe_reward

TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}<|assistant|>{{ m['content'] }}{{ eos_token }}"
    "{% else %}<|{{ m['role'] }}|>{{ m['content'] }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture
def chat_tok(tiny):
    folder, model, tok = tiny
    tok = copy.deepcopy(tok)  # the session's tokenizer is shared with other tests
    assert tok.chat_template is None  # else this file tests the wrong thing
    tok.chat_template = TEMPLATE
    return model, tok


def _chat_rows(n: int = 16) -> list[dict]:
    rows = []
    for i in range(n):
        a, b = i % 10, (3 * i) % 10
        rows.append({"prompt": [{"role": "user", "content": f"Q: {a}+{b}="}], "answer": str(a + b)})
    return rows


def test_arithmetic_task_chat_prompts_render_through_the_template(chat_tok):
    from tdrl.llm import ArithmeticTask, render_prompts

    _, tok = chat_tok
    train, test = ArithmeticTask(max_value=9, chat=True).splits(40, 10, seed=0)
    row = test[0]
    a, b = (int(x) for x in row["prompt"][0]["content"].removeprefix("What is ").split("?")[0].split(" + "))
    assert row["prompt"] == [{"role": "user", "content": f"What is {a} + {b}? Answer with the number only."}]
    assert row["answer"] == str(a + b)
    assert render_prompts(tok, [row["prompt"]]) == [f"<|user|>What is {a} + {b}? Answer with the number only.<|assistant|>"]
    held_out = {str(p) for p in test["prompt"]}
    assert not held_out & {str(p) for p in train["prompt"]}  # disjoint, as for plain prompts


# ------------------------------------------------------------------------- SFT on messages
def test_conversation_pairs_cover_exactly_the_assistant_turns(chat_tok):
    _, tok = chat_tok
    conv = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Q: 1+2="},
        {"role": "assistant", "content": "3"},
        {"role": "user", "content": "Q: 4+4="},
        {"role": "assistant", "content": "8"},
    ]
    pairs = conversation_pairs(conv)
    assert [c for _, c in pairs] == ["3", "8"]
    assert [len(p) for p, _ in pairs] == [2, 4]
    full = tok.apply_chat_template(conv, tokenize=False)
    prompts = render_prompts(tok, [p for p, _ in pairs])
    for (prompt_msgs, completion), prompt in zip(pairs, prompts):
        # prompt + completion + EOS is exactly the conversation up to the end of that turn
        assert full.startswith(prompt + completion + tok.eos_token)
    td = tokenize_sft(tok, prompts, [c for _, c in pairs])
    for i, target in enumerate(["3", "8"]):
        learned = td["completion_ids"][i][td["completion_mask"][i]].tolist()
        assert learned == tok(target, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    # no token of a user turn is a learned token: the second prompt holds the first answer and both questions
    assert "Q: 4+4=" in tok.decode(td["prompt_ids"][1]) and "3" in tok.decode(td["prompt_ids"][1])
    with pytest.raises(ValueError, match="no assistant turn"):
        conversation_pairs([{"role": "user", "content": "x"}])
    with pytest.raises(ValueError, match="starts with an assistant turn"):
        conversation_pairs([{"role": "assistant", "content": "x"}])


def test_sft_trains_on_a_messages_column(chat_tok):
    model, tok = chat_tok
    torch.manual_seed(0)
    convs = []
    for r in _chat_rows(16):
        a = int(r["answer"])
        convs.append({"messages": r["prompt"] + [{"role": "assistant", "content": r["answer"]},
                                                  {"role": "user", "content": "Q: 0+0="},
                                                  {"role": "assistant", "content": "0"}], "id": a})
    ds = datasets.Dataset.from_list(convs)
    cfg = SFTConfig(steps=30, batch_size=8, lr=1e-2, warmup_steps=0, progress=False)
    trainer = SFTTrainer(model, tok, ds, cfg)
    assert len(trainer.sampler.dataset) == 32  # two assistant turns per conversation
    assert trainer.sampler.dataset.column_names == ["id", "prompt", "completion"]
    hist = trainer.train()
    first, last = sum(h["loss"] for h in hist[:3]) / 3, sum(h["loss"] for h in hist[-3:]) / 3
    assert last < 0.7 * first, (first, last)
    with pytest.raises(KeyError, match="no 'completion' .*'messages' or 'text' column"):
        SFTTrainer(model, tok, datasets.Dataset.from_list([{"prompt": "x"}] * 8), cfg)


def test_sft_accepts_trl_conversational_prompt_completion(chat_tok):
    model, tok = chat_tok
    rows = [{"prompt": r["prompt"], "completion": [{"role": "assistant", "content": r["answer"]}]} for r in _chat_rows(8)]
    trainer = SFTTrainer(model, tok, datasets.Dataset.from_list(rows), SFTConfig(steps=1, batch_size=8, progress=False))
    m = trainer.step()
    assert m["loss"] > 0 and torch.isfinite(torch.tensor(m["loss"]))


# ------------------------------------------------------------------------- GRPO on messages
def test_grpo_hands_trl_rewards_message_lists_and_tdrl_rewards_text(chat_tok):
    model, tok = chat_tok
    seen: dict[str, list] = {}

    def trl_style(completions, answer, **kwargs):  # TRL's documented accuracy-reward shape
        seen["trl"] = completions
        return [1.0 if c[0]["content"].strip() == a else 0.0 for c, a in zip(completions, answer)]

    def tracking_text(prompts, completions, **_):
        seen["text"] = completions
        return [0.0] * len(completions)

    tracking_text.text_completions = True
    # they record what they were given: in the caller's memory, so they run in threads, not forked workers
    thread_safe_reward(trl_style)
    thread_safe_reward(tracking_text)
    ds = datasets.Dataset.from_list(_chat_rows())
    cfg = GRPOConfig(steps=1, prompts_per_step=2, group_size=4, max_new_tokens=4, progress=False)
    trainer = GRPOTrainer(model, tok, [trl_style, math_answer_reward, tracking_text], ds, cfg)
    m = trainer.step()
    assert m["reward_errors"] == 0.0
    assert len(seen["trl"]) == 8 and all(c[0]["role"] == "assistant" and len(c) == 1 for c in seen["trl"])
    assert [c[0]["content"] for c in seen["trl"]] == seen["text"] == trainer.last_completions
    # the rendered prompt went through the chat template
    assert "reward/trl_style" in m and "reward/math_answer_reward" in m


def test_grpo_stops_at_a_reward_that_fails_on_the_whole_batch(chat_tok):
    model, tok = chat_tok

    def text_only(completions, **kwargs):  # written for strings; the prompts are conversational
        return [float(c.strip() == "1") for c in completions]

    ds = datasets.Dataset.from_list(_chat_rows())
    cfg = GRPOConfig(steps=1, prompts_per_step=2, group_size=2, max_new_tokens=2, progress=False)
    trainer = GRPOTrainer(model, tok, [text_only], ds, cfg)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(RewardFunctionError, match=r"text_only failed on 4 of 4 .*c\[0\]\['content'\]") as info:
        trainer.step()
    assert isinstance(info.value.__cause__, AttributeError)  # the traceback of the real error is kept
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # no update on zeros
    # the same config with on_reward_error="zero" trains on (and counts)
    cfg0 = GRPOConfig(steps=1, prompts_per_step=2, group_size=2, max_new_tokens=2, progress=False, on_reward_error="zero")
    m = GRPOTrainer(model, tok, [text_only], ds, cfg0).step()
    assert m["reward_errors"] == 4.0
    with pytest.raises(ValueError, match="on_reward_error='sometimes'"):
        GRPOConfig(on_reward_error="sometimes")


# ------------------------------------------------------------------------- failure policy
def _flaky(prompts, completions, **_):
    """Breaks on the whole batch whenever one completion is "bad" (as real parsing code does)."""
    return [1.0 / (c != "bad") for c in completions]  # ZeroDivisionError on "bad"


def test_sporadic_failures_score_zero_are_counted_and_logged_once(caplog):
    logged: set[str] = set()
    with caplog.at_level(logging.WARNING, logger="tdrl.llm.rewards.compute"):
        total, per_fn, stats = compute_rewards([_flaky], ["p"] * 4, ["a", "bad", "c", "d"], logged=logged)
        assert total.tolist() == [1.0, 0.0, 1.0, 1.0]  # the others still scored, one by one
        assert stats["reward_errors"] == 1.0
        compute_rewards([_flaky], ["p"] * 2, ["bad", "x"], logged=logged)
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert len(tracebacks) == 1 and "ZeroDivisionError" in caplog.text and "1 of 4" in caplog.text
    assert logged == {"_flaky"}


def test_failure_policies():
    with pytest.raises(RewardFunctionError, match="_flaky failed on 2 of 2") as info:
        compute_rewards([_flaky], ["p"] * 2, ["bad", "bad"])
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    total, _, stats = compute_rewards([_flaky], ["p"] * 2, ["bad", "bad"], on_error="zero")
    assert total.tolist() == [0.0, 0.0] and stats["reward_errors"] == 2.0
    with pytest.raises(RewardFunctionError, match="raised on this batch of 3"):
        compute_rewards([_flaky], ["p"] * 3, ["ok", "bad", "ok"], on_error="raise")
    with pytest.raises(ValueError, match="on_error='never'"):
        compute_rewards([_flaky], ["p"], ["a"], on_error="never")


# ------------------------------------------------------------------------- model given by name
def test_trainers_load_a_model_given_as_a_path(tiny, task):
    folder, _, _ = tiny
    ds = datasets.Dataset.from_list(task.rows(16, seed=0))
    g = GRPOTrainer(str(folder), reward_fns=[math_answer_reward], train_dataset=ds,
                    config=GRPOConfig(steps=1, prompts_per_step=2, group_size=2, max_new_tokens=2, progress=False))
    assert g.tokenizer.pad_token is not None and next(g.model.parameters()).shape[0] == len(g.tokenizer)
    assert "reward" in g.step()
    s = SFTTrainer(folder, train_dataset=ds, config=SFTConfig(steps=1, batch_size=4, progress=False))
    assert s.step()["loss"] > 0
    with pytest.raises(TypeError, match="a tokenizer is needed"):
        SFTTrainer(s.model, train_dataset=ds)
