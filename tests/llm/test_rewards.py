"""Reward functions: answer extraction, format, failing rewards, and the code sandbox."""

from __future__ import annotations

import time

import pytest
import torch

from tdrl.llm import (
    code_execution_reward,
    compute_rewards,
    math_answer_reward,
    number_only_format_reward,
    run_python_sandboxed,
    think_answer_format_reward,
)
from tdrl.llm.rewards import extract_boxed, extract_final_number, parse_number


def test_math_answer_extraction():
    assert extract_final_number("so 12+3 = 15.") == "15"
    assert extract_final_number("total: -1,234.5 dollars") == "-1,234.5"
    assert extract_final_number("no digits") is None
    assert extract_boxed(r"thus \boxed{\frac{1}{2}} and \boxed{42}") == "42"
    assert extract_boxed(r"\boxed{\frac{1}{2}}") == r"\frac{1}{2}"
    assert parse_number("3/4") == 0.75 and parse_number("1,000") == 1000.0 and parse_number("x") is None
    r = math_answer_reward(None, ["81", "the answer is 81.0", r"\boxed{80} not 81", "18", ""], answer=["81"] * 5)
    assert r == [1.0, 1.0, 0.0, 0.0, 0.0]


def test_format_rewards():
    assert number_only_format_reward(None, ["42", " -3 ", "4 2", "x"]) == [1.0, 1.0, 0.0, 0.0]
    assert think_answer_format_reward(None, ["<think>a\nb</think> <answer>3</answer>", "<answer>3</answer>"]) == [1.0, 0.0]


def test_failing_reward_gives_zero_and_is_counted():
    def broken(prompts, completions, **kw):
        raise RuntimeError("boom")

    def half_nan(prompts, completions, **kw):
        return [float("nan"), 2.0]

    total, per_fn, stats = compute_rewards(
        [math_answer_reward, broken, half_nan], ["p", "q"], ["1", "2"], {"answer": ["1", "3"]}, weights=[1.0, 1.0, 0.5],
        on_error="zero",  # the default, "raise_if_all", stops at a function failing on the whole batch
    )
    torch.testing.assert_close(total, torch.tensor([1.0, 1.0]))  # 1 + 0 + 0.5*0 ; 0 + 0 + 0.5*2
    assert stats["reward_errors"] == 3.0  # two samples of `broken`, one NaN
    assert per_fn.shape == (2, 3)


@pytest.mark.usefixtures("needs_bwrap")
def test_sandbox_runs_code_and_captures_output():
    res = run_python_sandboxed("print(sum(range(10)))")
    assert res.ok and res.stdout.strip() == "45"
    res = run_python_sandboxed("raise SystemExit(3)")
    assert res.returncode == 3 and not res.ok


@pytest.mark.usefixtures("needs_bwrap")
def test_sandbox_kills_infinite_loop():
    t = time.perf_counter()
    res = run_python_sandboxed("while True:\n    pass\n", timeout=1.0)
    assert not res.ok and (res.timed_out or res.returncode < 0)
    assert time.perf_counter() - t < 10


@pytest.mark.usefixtures("needs_bwrap")
def test_sandbox_kills_memory_bomb():
    res = run_python_sandboxed("x = bytearray(4 * 1024**3)\nprint('allocated')", memory_mb=256, timeout=10)
    assert not res.ok and "allocated" not in res.stdout
    assert "MemoryError" in res.stderr or res.returncode < 0
    res = run_python_sandboxed("x = []\nwhile True:\n    x.append(' ' * 10**6)", memory_mb=256, timeout=10)
    assert not res.ok


@pytest.mark.usefixtures("needs_bwrap")
def test_sandbox_has_no_network():
    code = (
        "import socket\n"
        "try:\n"
        "    s = socket.create_connection(('1.1.1.1', 53), timeout=2)\n"
        "    print('connected')\n"
        "except OSError as e:\n"
        "    print('blocked')\n"
    )
    res = run_python_sandboxed(code, timeout=5)
    assert res.stdout.strip() == "blocked"


@pytest.mark.usefixtures("needs_bwrap")
def test_code_execution_reward():
    reward = code_execution_reward(timeout=2.0)
    completions = [
        "```python\ndef add(a, b):\n    return a + b\n```",
        "```python\ndef add(a, b):\n    return a - b\n```",
        "def add(a, b):\n    while True: pass",
    ]
    tests = ["assert add(2, 3) == 5"] * 3
    assert reward(None, completions, tests=tests) == [1.0, 0.0, 0.0]


@pytest.mark.usefixtures("needs_bwrap")
@pytest.mark.parametrize("bad", ["import os; os.fork()", "open('/tmp/../etc/passwd').read()"])
def test_sandbox_survives_odd_programs(bad):
    res = run_python_sandboxed(bad, timeout=3)
    assert isinstance(res.returncode, int)


def test_reward_functions_are_called_trl_style_or_positionally():
    """TRL's ``f(completions, **kwargs)`` gets keywords, ``f(p, c, answer)`` positions, and a
    signature that takes neither is refused at once, naming the function and the columns."""

    def trl_style(completions, **kwargs):
        return [float(c == a) for c, a in zip(completions, kwargs["answer"])]

    def positional(p, c, answer):
        return [2.0 * (x == y) for x, y in zip(c, answer)]

    total, per_fn, stats = compute_rewards(
        [trl_style, positional], ["p", "q"], ["1", "2"], {"answer": ["1", "3"]}
    )
    torch.testing.assert_close(per_fn, torch.tensor([[1.0, 2.0], [0.0, 0.0]]))
    torch.testing.assert_close(total, torch.tensor([3.0, 0.0]))
    assert stats["reward_errors"] == 0.0

    def no_columns(prompts, completions):
        return [0.0] * len(completions)

    with pytest.raises(TypeError, match=r"no_columns\(prompts, completions\).*\['answer'\].*\*\*kwargs"):
        compute_rewards([no_columns], ["p"], ["1"], {"answer": ["1"]})


def test_code_reward_mode_is_reachable_and_fails_closed(monkeypatch, tmp_path):
    """Issue 39: code_execution_reward exposed no mode, and without a working bubblewrap ran completions unconfined."""
    from tdrl.llm.rewards import sandbox

    with pytest.raises(ValueError, match="mode='off'"):
        code_execution_reward(mode="off")
    monkeypatch.setattr(sandbox, "_bwrap_problem", lambda: "bwrap: No permissions to create new namespace")
    marker = tmp_path / "ran"
    reward = code_execution_reward(timeout=2.0)
    with pytest.raises(sandbox.SandboxUnavailable, match="No permissions to create new namespace"):
        reward(None, [f"open({str(marker)!r}, 'w').write('x')"], tests=["pass"])
    assert not marker.exists()
    # a setup error, not a sample's: never scored 0 and trained on, whatever on_error says
    with pytest.raises(sandbox.SandboxUnavailable):
        compute_rewards([reward], ["p"], [f"open({str(marker)!r}, 'w').write('x')"], {"tests": ["pass"]},
                        timeout=5.0, on_error="zero")
    assert not marker.exists()
    monkeypatch.setattr(sandbox, "_fallback_warned", True)
    with pytest.warns(RuntimeWarning, match="NOT isolation"):
        assert code_execution_reward(timeout=2.0, mode="rlimit")(None, ["x = 1"], tests=["assert x == 1"]) == [1.0]


@pytest.fixture
def release():
    """An Event set at teardown, so that a reward left hanging in its thread ends with the test."""
    import threading

    ev = threading.Event()
    yield ev
    ev.set()


def test_hanging_reward_times_out_scores_zero_and_is_counted(release, caplog):
    def stuck_reward(prompts, completions, **kw):
        release.wait()  # "forever": until the test ends
        return [1.0] * len(completions)

    t = time.monotonic()
    with caplog.at_level("WARNING"):
        total, per_fn, stats = compute_rewards(
            [stuck_reward, math_answer_reward], ["p", "q"], ["1", "2"], {"answer": ["1", "3"]}, timeout=0.5
        )
    assert time.monotonic() - t < 0.5 + 1.0
    torch.testing.assert_close(total, torch.tensor([1.0, 0.0]))  # the hung one gives 0, the other counts
    assert stats["reward_timeouts"] == 1.0 and stats["reward_errors"] == 2.0
    assert "stuck_reward did not return within 0.5 s" in caplog.text


def test_reward_timeout_keeps_errors_and_values_of_a_fast_reward():
    def boom(prompts, completions, **kw):
        raise RuntimeError("boom")

    total, _, stats = compute_rewards([math_answer_reward, boom], ["p"], ["1"], {"answer": ["1"]}, timeout=5.0,
                                      on_error="zero")
    assert total.tolist() == [1.0] and stats["reward_errors"] == 1.0 and stats["reward_timeouts"] == 0.0
    _, _, stats = compute_rewards([math_answer_reward], ["p"], ["1"], {"answer": ["1"]}, timeout=None)
    assert stats["reward_errors"] == 0.0
    with pytest.raises(ValueError, match="timeout=-1"):
        compute_rewards([math_answer_reward], ["p"], ["1"], {"answer": ["1"]}, timeout=-1)
