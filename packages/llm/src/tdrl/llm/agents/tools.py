"""Tools a policy calls inside its turn: ``<python>code</python>`` run in the code sandbox.

A tool never hangs, and raises only when the machine cannot isolate code at all
(:class:`tdrl.llm.rewards.sandbox.SandboxUnavailable`: code is never run unconfined instead).
A malformed call, a program that times out, one whose sandbox is killed (memory, output,
signal) or fails, all come back as an error text that the model reads as the tool's output, and
are counted in :class:`ToolStats`. A program's output cannot forge the envelope or a turn: see
:class:`PythonTool`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from tdrl.llm.rewards.sandbox import SandboxUnavailable, check_sandbox_mode, run_python_sandboxed

__all__ = ["ERROR_KINDS", "TOOLS", "PythonTool", "ToolResult", "ToolStats", "escape_output", "parse_tool_call"]

ERROR_KINDS = ("malformed", "timeout", "killed", "failed", "sandbox", "unknown", "arguments", "raised")
"""Tool error kinds counted in :class:`ToolStats`: the first five from the code sandbox; ``unknown`` (a call
naming no tool given), ``arguments`` (arguments that do not bind to the callable's signature) and
``raised`` (the callable raised) from :class:`tdrl.llm.agents.CallableTools`."""


def parse_tool_call(text: str, tag: str = "python") -> tuple[str | None, str | None]:
    """The first ``<tag>...</tag>`` call of ``text``.

    Returns:
        ``(code, None)`` for a well-formed call, ``(None, None)`` when there is no call, and
        ``(None, reason)`` for a malformed one (an opening tag never closed, an empty call).
    """
    if not re.fullmatch(r"[A-Za-z_][\w-]*", tag):
        raise ValueError(f"parse_tool_call: tag={tag!r}; expected a name like 'python'")
    open_, close = f"<{tag}>", f"</{tag}>"
    start = text.find(open_)
    if start < 0:
        return None, ("a closing tag without its opening tag" if close in text else None)
    end = text.find(close, start + len(open_))
    if end < 0:
        return None, f"{open_} is never closed with {close}"
    code = text[start + len(open_):end].strip()
    if not code:
        return None, f"the {open_} call is empty"
    return code, None


_OUTPUT_TAG = re.compile(r"<(?=/?\s*(?:output|tool_call|tool_response))", re.IGNORECASE)


def escape_output(text: str) -> str:
    """``text`` with the ``<`` of every ``<output`` / ``</output`` (and ``<tool_call`` /
    ``<tool_response``; any case, spaces allowed) written ``&lt;``, so that a tool's output can
    neither close or open its envelope nor write a call that looks like the policy's."""
    return _OUTPUT_TAG.sub("&lt;", text)


@dataclass
class ToolResult:
    """What a tool call gave: ``text`` (shown to the model) and ``error`` (its kind, or ``None``)."""

    text: str
    error: str | None = None


@dataclass
class ToolStats:
    """Counts of tool calls and of their errors by kind (:data:`ERROR_KINDS`: ``malformed``,
    ``timeout``, ``killed``, ``failed``: a non-zero exit, ``sandbox``: the sandbox itself could not
    run; ``unknown``, ``arguments``, ``raised``: a callable tool's call named no tool, did not bind,
    or raised)."""

    calls: int = 0
    errors: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ERROR_KINDS, 0))
    conversations: int = 0  # conversations counted (set by a rollout)
    with_call: int = 0  # of them, those that called the tool at least once

    def add(self, result: ToolResult) -> None:
        self.calls += 1
        if result.error is not None:
            self.errors[result.error] += 1

    def merge(self, other: ToolStats) -> None:
        """Add ``other``'s counts to these."""
        self.calls += other.calls
        self.conversations += other.conversations
        self.with_call += other.with_call
        for k, v in other.errors.items():
            self.errors[k] = self.errors.get(k, 0) + v

    @property
    def call_rate(self) -> float:
        """The fraction of conversations that called the tool (0 when none were counted)."""
        return self.with_call / self.conversations if self.conversations else 0.0

    def as_metrics(self) -> dict[str, float]:
        out = {"tool_calls": float(self.calls), **{f"tool_errors/{k}": float(v) for k, v in self.errors.items()}}
        if self.conversations:
            out["tool_call_rate"] = self.call_rate
            out["tool_error_rate"] = sum(self.errors.values()) / max(1, self.calls)
        return out


class PythonTool:
    """Run the code of a ``<python>`` call in :func:`tdrl.llm.run_python_sandboxed`.

    The output shown to the model is ``<output>stdout</output>`` (at most ``max_chars``
    characters) or ``<output>error: ...</output>``. The program's text cannot close that
    envelope: every ``<output`` / ``</output`` in it (any case) has its ``<`` written ``&lt;``
    (:func:`escape_output`). Special-token strings in it (``<|im_end|>``) stay plain text as
    long as the caller tokenises tool text with ``split_special_tokens=True``, as
    :func:`tdrl.llm.agents.tool_rollout` does.

    Args:
        timeout: wall-clock seconds per call (the sandbox is killed after it).
        memory_mb: address-space limit per call.
        max_chars: characters of output kept for the model.
        tag: the call's tag (``<python>``).
        mode: the sandbox's mode (:func:`tdrl.llm.run_python_sandboxed`): ``"bwrap"``
            (default) isolated, and where bubblewrap cannot run a call raises
            :class:`tdrl.llm.rewards.sandbox.SandboxUnavailable` naming its error (the one
            exception to "a tool never raises": the run stops instead of training on error
            texts); ``"rlimit"``: NOT isolation, asked for by name.
    """

    def __init__(self, timeout: float = 2.0, memory_mb: int = 256, max_chars: int = 200, tag: str = "python",
                 mode: str = "bwrap"):
        for name, value in (("timeout", timeout), ("memory_mb", memory_mb), ("max_chars", max_chars)):
            if not value > 0:
                raise ValueError(f"PythonTool: {name}={value!r}; expected a positive number")
        parse_tool_call("", tag)  # checks the tag
        self.mode = check_sandbox_mode(mode, "PythonTool")
        self.timeout, self.memory_mb, self.max_chars, self.tag = timeout, memory_mb, max_chars, tag

    def _wrap(self, body: str, error: str | None) -> ToolResult:
        body = escape_output(body.strip())
        if len(body) > self.max_chars:
            body = body[: self.max_chars] + "..."
        return ToolResult(f"<output>{body}</output>", error)

    def __call__(self, turn_text: str) -> ToolResult | None:
        """The tool's answer to a policy turn, or ``None`` when the turn makes no call."""
        code, problem = parse_tool_call(turn_text, self.tag)
        if problem is not None:
            return self._wrap(f"error: malformed tool call: {problem}", "malformed")
        if code is None:
            return None
        try:
            res = run_python_sandboxed(code, timeout=self.timeout, memory_mb=self.memory_mb,
                                       max_output=4 * self.max_chars + 1024, mode=self.mode)
        except SandboxUnavailable:
            raise  # the machine cannot isolate code: a setup error that stops the run, not a per-call fault
        except Exception as exc:  # this call's sandbox failed: still an answer, never a crash
            return self._wrap(f"error: the sandbox could not run: {type(exc).__name__}: {exc}", "sandbox")
        if res.timed_out:
            return self._wrap(f"error: timed out after {self.timeout:g} s", "timeout")
        # killed by a signal: negative, or 128 + signal when a wrapper (bwrap's init, prlimit) reports it
        signum = -res.returncode if res.returncode < 0 else res.returncode - 128 if res.returncode > 128 else 0
        if signum or res.output_truncated:
            why = "its output was too long" if res.output_truncated else f"signal {signum}"
            return self._wrap(f"error: the sandbox was killed ({why})", "killed")
        if res.returncode != 0:
            last = (res.stderr.strip().splitlines() or [f"exit status {res.returncode}"])[-1]
            return self._wrap(f"error: {last}", "failed")
        return self._wrap(res.stdout, None)


TOOLS = {"python": PythonTool}
"""Tools by the name a config gives them (``GRPOConfig.tools``)."""
