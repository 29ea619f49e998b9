"""The answer checker on LaTeX and numbers, reward functions loaded by name, and a trainer's
log_dir that never truncates an earlier run."""

from __future__ import annotations

import math

import pytest

from tdrl.llm import SFTConfig, SFTTrainer, compute_rewards
from tdrl.llm.rewards import answers_match, latex_value, load_reward, math_answer_reward, weighted_reward


@pytest.mark.parametrize(("text", "value"), [
    (r"\frac{1}{2}", 0.5), (r"-\dfrac{3}{4}", -0.75), (r"\tfrac12", 0.5), (r"\frac{\frac{1}{2}}{2}", 0.25),
    (r"2\sqrt{2}", 2 * math.sqrt(2)), (r"3 \cdot 10^{2}", 300.0), (r"50\%", 0.5), ("x = 4", 4.0), ("1,234", 1234.0),
    (r"\left(\frac{1}{4}\right)", 0.25), (r"$\pi$", math.pi), ("3/4", 0.75), ("2^{1000}", None), ("1/0", None),
    ("__import__('os')", None), ("yes", None),
])
def test_latex_value_by_hand(text, value):
    got = latex_value(text)
    assert got == (None if value is None else pytest.approx(value))


def test_answer_checker_handles_latex_and_numbers():
    completions = [r"so the answer is \boxed{\frac{1}{2}}", r"\boxed{0.5}", "The answer is 12.", r"\boxed{\text{yes}}",
                   r"\boxed{\frac{1}{3}}", "no number here"]
    answers = ["0.5", r"\frac12", "12", "yes", "0.33", "7"]
    assert math_answer_reward(None, completions, answers) == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0]
    assert answers_match(r"\dfrac{6}{4}", "1.5") and not answers_match("x+1", "x+2")


def test_rewards_load_by_name_and_combine(tmp_path):
    (tmp_path / "user_rw.py").write_text("def long(completions, **kw):\n    return [float(len(c)) for c in completions]\n"
                                         "VALUE = 3\n")
    fn = load_reward(f"{tmp_path / 'user_rw.py'}:long")
    assert fn(["ab", "abc"]) == [2.0, 3.0]
    assert load_reward("tdrl.llm.rewards:math_answer_reward") is math_answer_reward
    with pytest.raises(ValueError, match="'VALUE' is a int, not a function"):
        load_reward(f"{tmp_path / 'user_rw.py'}:VALUE")
    both = weighted_reward([fn, math_answer_reward], [0.5, 2.0])
    assert both(prompts=["p", "q"], completions=["12", "abcd"], answer=["12", "1"]) == [0.5 * 2 + 2.0, 0.5 * 4]



def test_the_weighted_sum_calls_each_function_as_training_does():
    """weighted_reward (the GRPO app's held-out score) called its functions with bind_reward
    alone: chat prompts gave user functions text where training gives TRL's message lists, and
    an ``async def`` reward returned an unawaited coroutine. It now goes through compute_rewards."""
    import asyncio

    def reads_messages(completions, **_):
        return [float(len(c[0]["content"])) for c in completions]

    async def later(completions, **_):
        await asyncio.sleep(0)
        return [1.0] * len(completions)

    chat = [[{"role": "user", "content": "2+2?"}], [{"role": "user", "content": "3+3?"}]]
    both = weighted_reward([reads_messages, later, math_answer_reward], [1.0, 10.0, 100.0])
    assert both(prompts=chat, completions=["4", "six"], answer=["4", "6"]) == [1.0 + 10 + 100, 3.0 + 10]
    total, per_fn, _ = compute_rewards([reads_messages, later, math_answer_reward], chat, ["4", "six"],
                                       {"answer": ["4", "6"]}, [1.0, 10.0, 100.0], timeout=None)
    assert both(prompts=chat, completions=["4", "six"], answer=["4", "6"]) == total.tolist()  # as training scores


def test_a_reused_log_dir_keeps_the_earlier_run(tiny, task, tmp_path):
    _, model, tok = tiny
    train, _ = task.splits(16, 2, seed=0)
    logs = tmp_path / "sft"
    SFTTrainer(model, tok, train, SFTConfig(steps=2, batch_size=8, progress=False, log_dir=str(logs))).train()
    first = (logs / "metrics.csv").read_text()
    again = SFTTrainer(model, tok, train, SFTConfig(steps=1, batch_size=8, progress=False, log_dir=str(logs)))
    again.train()
    assert (logs / "metrics.csv").read_text() == first and len(first.splitlines()) == 3  # header + 2 steps
    assert again.config.log_dir == str(tmp_path / "sft-1")
    assert len((tmp_path / "sft-1" / "metrics.csv").read_text().splitlines()) == 2
