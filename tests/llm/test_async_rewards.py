"""Asynchronous rewards: coroutine reward functions (values, failures, cancellation at the
timeout) and code-execution rewards run on a bounded pool of sandboxed programs."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from tdrl.llm import code_execution_reward, compute_rewards, math_answer_reward
from tdrl.llm.rewards import thread_safe_reward
from tdrl.llm.rewards.compute import RewardFunctionError, is_async_reward, map_bounded


@pytest.mark.usefixtures("needs_bwrap")
def test_parallel_code_reward_is_faster_with_the_same_scores():
    """8 programs that each sleep 0.3 s, half failing their test: 4 workers take about a quarter
    of the sequential time (measured; >= 1.8x asked), and every score is the sequential one."""
    completions, tests = [], []
    for i in range(8):
        completions.append(f"```python\nimport time\ntime.sleep(0.3)\ndef f():\n    return {i}\n```")
        tests.append(f"assert f() == {i if i % 2 == 0 else -1}")
    expected = [1.0 if i % 2 == 0 else 0.0 for i in range(8)]
    seq, par = code_execution_reward(timeout=5.0, workers=1), code_execution_reward(timeout=5.0, workers=4)
    t0 = time.perf_counter()
    seq_scores = seq(None, completions, tests=tests)
    t_seq = time.perf_counter() - t0
    t0 = time.perf_counter()
    par_scores = par(None, completions, tests=tests)
    t_par = time.perf_counter() - t0
    assert seq_scores == expected and par_scores == expected
    assert t_seq >= 8 * 0.3  # the programs really ran one after another
    assert t_seq / t_par >= 1.8, (t_seq, t_par)


@pytest.mark.usefixtures("needs_bwrap")
def test_parallel_code_reward_keeps_the_per_program_timeout():
    reward = code_execution_reward(timeout=0.5, workers=4)
    completions = ["while True:\n    pass"] * 3 + ["x = 1"]
    t0 = time.perf_counter()
    assert reward(None, completions, tests=["assert x == 1"] * 4) == [0.0, 0.0, 0.0, 1.0]
    assert time.perf_counter() - t0 < 4.0  # the three spinners were killed together, not one by one


def test_bad_workers_are_refused():
    with pytest.raises(ValueError, match="workers=0"):
        code_execution_reward(workers=0)
    with pytest.raises(ValueError, match="workers=2.5"):
        map_bounded(str, [1], 2.5)


def test_map_bounded_keeps_order_and_raises_after_all_finished():
    done = []

    def work(x):
        time.sleep(0.05 * (3 - x))
        done.append(x)
        if x == 1:
            raise KeyError(x)
        return x * x

    assert map_bounded(lambda x: x * x, range(5), 3) == [0, 1, 4, 9, 16]
    with pytest.raises(KeyError):
        map_bounded(work, [0, 1, 2], 3)
    assert sorted(done) == [0, 1, 2]


def test_async_reward_equals_its_sync_twin():
    async def async_math(prompts, completions, answer, **_):
        await asyncio.sleep(0.01)
        return math_answer_reward(prompts, completions, answer=answer)

    async_math.__name__ = "async_math"
    assert is_async_reward(async_math) and not is_async_reward(math_answer_reward)
    prompts, completions = ["a", "b", "c", "d"], ["3", "x", "5.0", "the answer is 7"]
    cols = {"answer": ["3", "4", "5", "7"]}
    total_a, per_a, stats_a = compute_rewards([async_math], prompts, completions, cols, timeout=5.0)
    total_s, per_s, stats_s = compute_rewards([math_answer_reward], prompts, completions, cols, timeout=5.0)
    assert per_a.tolist() == per_s.tolist() == [[1.0], [0.0], [1.0], [1.0]]
    assert total_a.tolist() == total_s.tolist()
    assert stats_a["reward_errors"] == stats_s["reward_errors"] == 0.0


def test_async_reward_without_timeout_and_as_a_callable_object():
    class Scorer:
        async def __call__(self, prompts, completions, **_):
            return [float(len(c)) for c in completions]

    assert is_async_reward(Scorer())
    total, _, _ = compute_rewards([Scorer()], ["p", "q"], ["ab", "abc"], timeout=None)
    assert total.tolist() == [2.0, 3.0]


def test_hanging_coroutine_is_killed_at_its_timeout_and_scored_per_policy():
    """A coroutine reward runs in the killable worker (its loop there): past the timeout the
    worker is killed; marked ``thread_safe_reward`` it is awaited here and cancelled instead."""
    cancelled = []

    async def hangs(prompts, completions, **_):
        try:
            await asyncio.Event().wait()  # never set
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return [1.0] * len(completions)

    prompts, completions, cols = ["p", "q"], ["1", "2"], {"answer": ["1", "3"]}
    t0 = time.perf_counter()
    total, per_fn, stats = compute_rewards([hangs, math_answer_reward], prompts, completions, cols, timeout=0.3)
    assert time.perf_counter() - t0 < 2.0
    assert cancelled == []  # killed in its worker (a cancellation there would not reach this list)
    assert per_fn[:, 0].tolist() == [0.0, 0.0] and per_fn[:, 1].tolist() == [1.0, 0.0]
    assert stats["reward_timeouts"] == 1.0 and stats["reward_errors"] == 2.0
    with pytest.raises(RewardFunctionError, match="worker process was killed"):
        compute_rewards([hangs], prompts, completions, cols, timeout=0.3, on_error="raise")
    with pytest.raises(RewardFunctionError, match="cancelled"):
        compute_rewards([thread_safe_reward(hangs)], prompts, completions, cols, timeout=0.3, on_error="raise")
    assert cancelled == [True]  # marked: really cancelled, in this process


def test_async_reward_failures_follow_on_reward_error():
    async def fails_on_x(prompts, completions, **_):
        if "x" in completions:
            raise ValueError("cannot score x")
        return [1.0] * len(completions)

    async def always_fails(prompts, completions, **_):
        raise RuntimeError("broken reward")

    _, per_fn, stats = compute_rewards([fails_on_x], ["p"] * 3, ["a", "x", "b"], timeout=2.0)
    assert per_fn[:, 0].tolist() == [1.0, 0.0, 1.0] and stats["reward_errors"] == 1.0  # sporadic: 0, counted
    with pytest.raises(RewardFunctionError, match="always_fails failed on 2 of 2") as info:
        compute_rewards([always_fails], ["p"] * 2, ["a", "b"], timeout=2.0)
    assert isinstance(info.value.__cause__, RuntimeError)  # the traceback is chained
    _, _, stats = compute_rewards([always_fails], ["p"] * 2, ["a", "b"], timeout=2.0, on_error="zero")
    assert stats["reward_errors"] == 2.0


def test_grpo_trains_the_same_with_an_async_reward(tiny, task):
    """Two GRPO rounds on the tiny model: the coroutine twin of a reward gives the same rewards
    and the same weights as the plain function (fixed seed)."""
    import copy

    from tdrl.llm import GRPOConfig, GRPOTrainer

    def digits(prompts, completions, **_):
        return [sum(ch.isdigit() for ch in c) / 4.0 for c in completions]

    async def digits_async(prompts, completions, **_):
        await asyncio.sleep(0)
        return digits(prompts, completions)

    _, model, tok = tiny
    ds = task.splits(32, 4, seed=0)[0]
    cfg = dict(steps=2, prompts_per_step=4, group_size=4, max_new_tokens=4, lr=1e-2, seed=0, progress=False,
               reward_timeout=10.0)
    runs = []
    for fn in (digits, digits_async):
        trainer = GRPOTrainer(copy.deepcopy(model), tok, [fn], ds, GRPOConfig(**cfg))
        hist = trainer.train()
        runs.append(([m["reward"] for m in hist], [p.detach().clone() for p in trainer.model.parameters()]))
    assert runs[0][0] == runs[1][0]
    assert all(torch.equal(a, b) for a, b in zip(runs[0][1], runs[1][1]))
