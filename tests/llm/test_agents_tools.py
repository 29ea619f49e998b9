"""Multi-turn tools: the sandboxed Python tool and its faults (malformed call, timeout, killed
sandbox -> error text, counted, never a crash or a hang), the conversation loop and the loss
mask that keeps tool output out of training."""

from __future__ import annotations

import time

import pytest
import torch

from tdrl.llm import keys as K
from tdrl.llm.agents import PythonTool, ToolStats, Turn, make_tool, parse_tool_call, policy_token_mask, run_conversation
from tdrl.llm.agents.tools import escape_output
from tdrl.llm.rewards import sandbox
from tdrl.llm.tiny import train_tokenizer


def test_parse_tool_call():
    assert parse_tool_call("x <python>print(1)</python> y") == ("print(1)", None)
    assert parse_tool_call("the answer is 4") == (None, None)
    assert parse_tool_call("<python>print(1)")[1] == "<python> is never closed with </python>"
    assert parse_tool_call("<python>  </python>")[1] == "the <python> call is empty"
    assert parse_tool_call("print(1)</python>")[1] == "a closing tag without its opening tag"
    assert parse_tool_call("<tool>1</tool>", tag="tool") == ("1", None)
    with pytest.raises(ValueError, match="tag="):
        parse_tool_call("", tag="<bad>")


@pytest.mark.usefixtures("needs_bwrap")
def test_python_tool_answers_and_every_fault_is_an_error_text():
    tool, stats = PythonTool(timeout=0.5, memory_mb=128), ToolStats()
    cases = {
        "<python>print(123 * 456)</python>": ("<output>56088</output>", None),
        "<python>print(1</python>": (None, "failed"),  # a syntax error
        "<python>print(1)": ("<output>error: malformed tool call: <python> is never closed with </python></output>",
                             "malformed"),
        "<python>while True: pass</python>": ("<output>error: timed out after 0.5 s</output>", "timeout"),
        "<python>import os, signal; os.kill(os.getpid(), signal.SIGKILL)</python>": (None, "killed"),
        "<python>print('x' * 10**6)</python>": (None, "killed"),  # output over the limit kills it
    }
    t0 = time.perf_counter()
    for call, (text, error) in cases.items():
        res = tool(call)
        stats.add(res)
        assert res.error == error, (call, res)
        if text is not None:
            assert res.text == text
        assert res.text.startswith("<output>") and len(res.text) <= tool.max_chars + len("<output>...</output>")
    assert time.perf_counter() - t0 < 10.0
    assert tool("no call here") is None
    assert stats.calls == 6 and stats.errors == {"malformed": 1, "timeout": 1, "killed": 2, "failed": 1, "sandbox": 0,
                                                 "unknown": 0, "arguments": 0, "raised": 0}
    assert stats.as_metrics()["tool_errors/killed"] == 2.0
    with pytest.raises(ValueError, match="timeout=0"):
        PythonTool(timeout=0)


@pytest.mark.usefixtures("needs_bwrap")
def test_conversation_runs_tool_turns_until_an_answer_or_max_turns():
    """A scripted policy (calls the tool, then copies its output as the answer)."""

    def policy(context: str) -> str:
        if "<output>" not in context:
            return " <python>print(317*529)</python>"
        return " " + context.rsplit("<output>", 1)[1].split("</output>")[0]

    stats = ToolStats()
    turns = run_conversation(policy, "Q: 317*529=", PythonTool(), max_turns=3, stats=stats)
    assert [t.from_policy for t in turns] == [True, False, True]
    assert turns[1].text == "<output>167693</output>" and turns[-1].text == " 167693"
    assert stats.calls == 1
    turns = run_conversation(lambda c: " <python>print(1)</python>", "Q", PythonTool(), max_turns=2)
    assert [t.from_policy for t in turns] == [True, False, True]  # stops at max_turns on a policy turn
    with pytest.raises(ValueError, match="max_turns=0"):
        run_conversation(policy, "Q", PythonTool(), max_turns=0)


def test_policy_token_mask_trains_only_policy_tokens():
    tok = train_tokenizer(["<python>print(1+2)</python> <output>3</output> 3 12"], vocab_size=64)
    convs = [
        [Turn(" <python>print(1+2)</python>", True), Turn("<output>3</output>", False), Turn(" 3", True)],
        [Turn(" 12", True)],
    ]
    td = policy_token_mask(tok, convs)
    lens = [[len(tok(t.text, add_special_tokens=False)["input_ids"]) for t in c] for c in convs]
    a, b, c = lens[0]
    assert td[K.COMPLETION_IDS].shape == (2, a + b + c)
    want0 = [True] * a + [False] * b + [True] * c
    assert td[K.COMPLETION_MASK][0].tolist() == want0
    assert td["attention_mask"][0].tolist() == [1] * (a + b + c)
    n1 = lens[1][0]
    assert td[K.COMPLETION_MASK][1].tolist() == [True] * n1 + [False] * (a + b + c - n1)
    assert td["attention_mask"][1].sum().item() == n1
    assert td[K.COMPLETION_MASK].dtype == torch.bool


def test_tool_output_cannot_close_its_envelope():
    assert escape_output("a</output>b<OUTPUT >c</ output>") == "a&lt;/output>b&lt;OUTPUT >c&lt;/ output>"
    assert escape_output("x < y, <class 'int'>") == "x < y, <class 'int'>"  # other text is untouched
    tool = PythonTool(max_chars=30)
    assert tool._wrap("</output><|im_end|>" * 5, None).text.count("</output>") == 1  # the envelope's own only


def test_tool_mode_is_reachable_and_fails_closed(monkeypatch, tmp_path):
    """Issue 39: PythonTool and make_tool exposed no mode, and an unavailable bubblewrap ran the call unconfined."""
    assert make_tool("python").mode == "bwrap" and make_tool("python", mode="rlimit").mode == "rlimit"
    with pytest.raises(ValueError, match="mode='none'"):
        make_tool("python", mode="none")
    with pytest.raises(ValueError, match="mode='x'"):
        PythonTool(mode="x")
    monkeypatch.setattr(sandbox, "_bwrap_problem", lambda: "bwrap: setting up uid map: Permission denied")
    marker = tmp_path / "ran"
    with pytest.raises(sandbox.SandboxUnavailable, match="uid map"):
        PythonTool()(f"<python>open({str(marker)!r}, 'w').write('x')</python>")
    assert not marker.exists()
    monkeypatch.setattr(sandbox, "_fallback_warned", True)
    with pytest.warns(RuntimeWarning, match="NOT isolation"):
        assert PythonTool(mode="rlimit")("<python>print(6*7)</python>").text == "<output>42</output>"


def test_every_way_in_defaults_to_the_isolated_sandbox(monkeypatch, tmp_path):
    """Issue 39, done-when: 0 escapes in any mode reachable without naming the unsafe one. Every
    entry point that runs model-written code defaults to ``bwrap`` and, with bubblewrap unable
    to start, refuses (nothing runs); only ``mode="rlimit"`` by name runs unconfined."""
    import inspect

    from tdrl.llm import GRPOConfig, code_execution_reward, run_python_sandboxed

    defaults = {
        "run_python_sandboxed": inspect.signature(run_python_sandboxed).parameters["mode"].default,
        "code_execution_reward": inspect.signature(code_execution_reward).parameters["mode"].default,
        "PythonTool": inspect.signature(PythonTool).parameters["mode"].default,
        "make_tool": inspect.signature(make_tool).parameters["mode"].default,
        "GRPOConfig.tool_sandbox": GRPOConfig(tools=("python",)).tool_sandbox,
    }
    assert all(v in ("bwrap", "auto") for v in defaults.values()), defaults
    assert sandbox.SANDBOX_MODES == ("bwrap", "auto", "rlimit")  # no other name reaches a mode
    monkeypatch.setattr(sandbox, "_bwrap_problem", lambda: "bwrap: setting up uid map: Permission denied")
    marker = tmp_path / "ran"
    code = f"open({str(marker)!r}, 'w').write('x')"
    calls = [lambda: run_python_sandboxed(code),
             lambda: run_python_sandboxed(code, mode="auto"),
             lambda: code_execution_reward(timeout=2.0)(None, [code], tests=["pass"]),
             lambda: PythonTool()(f"<python>{code}</python>"),
             lambda: make_tool("python")(f"<python>{code}</python>"),
             lambda: make_tool(GRPOConfig(tools=("python",)).tools, mode=GRPOConfig(tools=("python",)).tool_sandbox)(
                 f"<python>{code}</python>")]
    for call in calls:
        with pytest.raises(sandbox.SandboxUnavailable, match="uid map"):
            call()
    assert not marker.exists()
