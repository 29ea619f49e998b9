"""Any Python callable as a tool: its JSON schema, the call format, and one dispatcher for all tools.

As in TRL (``GRPOTrainer(tools=[fn, ...])``) and ``transformers`` (``apply_chat_template(tools=)``),
a tool is a plain function whose signature (type hints) and Google-style docstring (``Args:``)
become a JSON schema (:func:`tool_schema`, ``transformers.utils.get_json_schema``); a function
it cannot describe is refused when the tools are built, with the reason.

The policy calls a tool as Hermes / Qwen chat templates (and TRL) do::

    <tool_call>{"name": "multiply", "arguments": {"a": 37, "b": 86}}</tool_call>

and reads ``<output>3182</output>`` (the same envelope as :class:`tdrl.llm.agents.PythonTool`;
the value JSON-encoded unless it is a string; escaped with :func:`escape_output`, so a tool's
text can neither close the envelope nor forge a call or a turn). Every call of a turn is run, in
order. A call that is not JSON, names no tool given, has arguments that do not bind to the
signature, raises or passes its timeout comes back as an ``<output>error: ...</output>`` text
counted in :class:`ToolStats` (``malformed``, ``unknown``, ``arguments``, ``raised``,
``timeout``).

Where a callable runs: by default in a worker process forked from the trainer and killed at
``timeout`` (:func:`tdrl.llm.rewards.workers.call_in_worker`: the function's side effects stay
in the worker); a function marked :func:`tdrl.llm.rewards.thread_safe_reward` runs in the
calling thread instead (no fork; a timeout cannot stop it); with ``sandbox=True`` its source is
run in the code sandbox (:func:`tdrl.llm.run_python_sandboxed`), for a self-contained function
(module-level, importing what it needs inside its body) whose arguments and result are JSON.
"""

from __future__ import annotations

import inspect
import json
import re
import textwrap
from collections.abc import Callable, Sequence

from tdrl.llm.agents.tools import TOOLS, PythonTool, ToolResult, escape_output
from tdrl.llm.rewards.sandbox import check_sandbox_mode, run_python_sandboxed
from tdrl.llm.rewards.workers import RewardTimeout, call_in_worker, can_fork, runs_in_thread

__all__ = ["CallableTools", "make_tool", "parse_tool_calls", "tool_schema", "tools_prompt_text"]

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
_CALL = re.compile(re.escape(CALL_OPEN) + r"(.*?)(?:" + re.escape(CALL_CLOSE) + r"|$)", re.DOTALL)


def tool_schema(fn: Callable) -> dict:
    """The JSON schema of ``fn`` (``{"type": "function", "function": {"name", "description",
    "parameters"}}``), as ``transformers.utils.get_json_schema`` writes it.

    Raises:
        ValueError: ``fn`` cannot be described (no docstring, an argument without a type hint or
            without its line in ``Args:``, a lambda), naming the reason and what to write.
    """
    from transformers.utils import get_json_schema

    name = getattr(fn, "__name__", type(fn).__name__)
    try:
        return get_json_schema(fn)
    except Exception as exc:
        raise ValueError(f"tool {name!r} cannot be described as a JSON schema: {exc}. A tool is a named function "
                         "with a type hint on every argument and a Google-style docstring: a summary line, then "
                         "'Args:' with one 'name: description' line per argument (transformers' get_json_schema)") from exc


def tools_prompt_text(schemas: Sequence[dict]) -> str:
    """The tools as text, for a tokenizer whose chat template does not take ``tools=``: one line per
    tool, ``name(arg: type, ...): description``, then how to call one. This is the one format
    used (a system message for chat prompts, a preamble for plain-string prompts)."""
    lines = ["Tools:"]
    for s in schemas:
        f = s["function"]
        args = ", ".join(f"{k}: {v.get('type', 'any')}" for k, v in f.get("parameters", {}).get("properties", {}).items())
        lines.append(f"{f['name']}({args}): {f.get('description', '')}".rstrip(": "))
    lines.append(f'Call a tool as {CALL_OPEN}{{"name": NAME, "arguments": {{...}}}}{CALL_CLOSE}')
    return "\n".join(lines) + "\n"


def parse_tool_calls(text: str) -> list[tuple[str | None, dict | None, str | None]]:
    """Every ``<tool_call>...</tool_call>`` of ``text`` (a call never closed runs to the end of the text).

    Returns:
        One ``(name, arguments, None)`` per well-formed call, ``(None, None, reason)`` per malformed
        one (not JSON, not an object with a string ``name`` and an object ``arguments``); ``[]``
        when the text makes no call.
    """
    out = []
    for m in _CALL.finditer(text):
        body = m.group(1).strip()
        try:
            call = json.loads(body)
        except ValueError as exc:
            out.append((None, None, f"the call is not JSON ({exc})"))
            continue
        if isinstance(call, list) and len(call) == 1:  # SmolLM2 / some templates write a one-call list
            call = call[0]
        args = call.get("arguments", {}) if isinstance(call, dict) else None
        if isinstance(args, str):  # OpenAI's spelling: the arguments as a JSON string
            try:
                args = json.loads(args)
            except ValueError:
                args = None
        if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not isinstance(args, dict):
            out.append((None, None, 'expected {"name": "<tool>", "arguments": {...}}'))
            continue
        out.append((call["name"], args, None))
    return out


def _source(fn: Callable) -> str:
    name = getattr(fn, "__name__", "")
    if not name.isidentifier() or not inspect.isfunction(fn):
        raise ValueError(f"tool {fn!r}: sandbox=True runs a named function's source; this is not one")
    try:
        src = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError) as exc:
        raise ValueError(f"tool {name!r}: sandbox=True needs its source ({exc})") from exc
    return re.sub(r"\A(\s*@.*\n)+", "", src)  # decorators are not run in the sandbox


class CallableTools:
    """One dispatcher for every tool of a rollout: Python callables called with ``<tool_call>``
    JSON, and optionally the sandboxed code tool (``<python>``) beside them.

    Args:
        fns: the callables (named functions or bound methods; names must differ).
        timeout: seconds per call.
        sandbox: run each callable's source in the code sandbox (see the module docstring).
        mode: the sandbox's mode (``"bwrap"`` isolated; ``"rlimit"`` NOT isolation, by name).
        code_tool: a :class:`PythonTool` answering ``<python>`` calls in turns without a ``<tool_call>``.
        in_process: call every callable in the calling thread (no fork, no kill at the timeout):
            for an environment's methods, whose state must persist between calls.
        max_chars: characters of each output kept for the model.

    Raises:
        ValueError: a callable without a schema (:func:`tool_schema`), two with one name, or
            ``sandbox=True`` for one whose source cannot be read.
    """

    def __init__(self, fns: Sequence[Callable], timeout: float = 2.0, sandbox: bool = False, mode: str = "bwrap",
                 code_tool: PythonTool | None = None, in_process: bool = False, max_chars: int = 200):
        if not timeout > 0:
            raise ValueError(f"CallableTools: timeout={timeout!r}; expected a positive number of seconds")
        self.schemas = [tool_schema(fn) for fn in fns]
        names = [s["function"]["name"] for s in self.schemas]
        if len(set(names)) != len(names):
            raise ValueError(f"CallableTools: tool names {names} repeat; give each function its own name")
        self.fns = dict(zip(names, fns))
        self.signatures = {n: inspect.signature(fn) for n, fn in self.fns.items()}
        self.mode = check_sandbox_mode(mode, "CallableTools")
        self.sources = {n: _source(fn) for n, fn in self.fns.items()} if sandbox else None
        self.timeout, self.code_tool, self.in_process, self.max_chars = timeout, code_tool, in_process, max_chars

    @property
    def names(self) -> list[str]:
        return list(self.fns)

    def _wrap(self, body: str, error: str | None) -> ToolResult:
        body = escape_output(body.strip())
        if len(body) > self.max_chars:
            body = body[: self.max_chars] + "..."
        return ToolResult(f"<output>{body}</output>", error)

    def call(self, name: str, arguments: dict) -> ToolResult:
        """Run one call; every failure is an error text (never raises)."""
        if name not in self.fns:
            return self._wrap(f"error: unknown tool {name!r}; the tools are {self.names}", "unknown")
        try:
            bound = self.signatures[name].bind(**arguments)
        except TypeError as exc:
            return self._wrap(f"error: bad arguments for {name}: {exc}", "arguments")
        fn = self.fns[name]
        try:
            if self.sources is not None:
                value = self._run_sandboxed(name, arguments)
            elif self.in_process or runs_in_thread(fn) or not can_fork():
                value = fn(*bound.args, **bound.kwargs)
            else:
                value = call_in_worker(lambda: fn(*bound.args, **bound.kwargs), self.timeout, name=f"tool {name}")
        except RewardTimeout:
            return self._wrap(f"error: {name} timed out after {self.timeout:g} s", "timeout")
        except TimeoutError as exc:
            return self._wrap(f"error: {exc}", "timeout")
        except Exception as exc:
            return self._wrap(f"error: {name} raised {type(exc).__name__}: {exc}", "raised")
        return self._wrap(value if isinstance(value, str) else json.dumps(value, default=str), None)

    def _run_sandboxed(self, name: str, arguments: dict):
        program = (self.sources[name] + "\nimport json as _json\n"
                   f"print(_json.dumps({name}(**_json.loads({json.dumps(arguments)!r})), default=str))\n")
        res = run_python_sandboxed(program, timeout=self.timeout, max_output=4 * self.max_chars + 1024, mode=self.mode)
        if res.timed_out:
            raise TimeoutError(f"{name} timed out after {self.timeout:g} s in the sandbox")
        if res.returncode != 0:
            last = (res.stderr.strip().splitlines() or [f"exit status {res.returncode}"])[-1]
            raise RuntimeError(last)
        return json.loads(res.stdout.strip().splitlines()[-1])

    def __call__(self, turn_text: str) -> ToolResult | None:
        """The answer to a policy turn: every call's output in order (one error kind counted: the
        first), or ``None`` when the turn calls no tool (it is the answer)."""
        calls = parse_tool_calls(turn_text)
        if not calls:
            return self.code_tool(turn_text) if self.code_tool is not None else None
        results = [self._wrap(f"error: malformed tool call: {why}", "malformed") if why else self.call(name, args)
                   for name, args, why in calls]
        error = next((r.error for r in results if r.error), None)
        return ToolResult("".join(r.text for r in results), error)


def make_tool(names, timeout: float = 2.0, mode: str = "bwrap", sandbox: bool = False):
    """The tool a config names, or ``None`` for no tool.

    Args:
        names: tool names (keys of :data:`TOOLS`) and / or Python callables (any number: one
            :class:`tdrl.llm.agents.CallableTools` dispatches ``<tool_call>`` JSON calls to the
            callables and ``<python>`` calls to the code tool), or one of them.
        timeout: seconds per call.
        mode: the code sandbox's mode (``"bwrap"``: isolated, the default; ``"rlimit"``: NOT
            isolation, asked for by name).
        sandbox: run the callables' source in the code sandbox (default: in a killable worker process).

    Raises:
        ValueError: an unknown name or mode, or a callable without a schema (naming why).
    """
    check_sandbox_mode(mode, "make_tool")
    names = [names] if isinstance(names, str) or callable(names) else list(names or ())
    fns = [n for n in names if callable(n)]
    named = [n for n in names if not callable(n)]
    unknown = [n for n in named if n not in TOOLS]
    if unknown:
        raise ValueError(f"tools={names!r}: unknown tool(s) {unknown}; expected names among {sorted(TOOLS)} "
                         "or Python functions")
    if len(set(named)) < len(named):
        raise ValueError(f"tools={names!r}: a tool is named twice")
    code = TOOLS[named[0]](timeout=timeout, mode=mode) if named else None
    if not fns:
        return code
    return CallableTools(fns, timeout=timeout, sandbox=sandbox, mode=mode, code_tool=code)
