"""Test-passing reward for generated Python code, run in :mod:`tdrl.llm.rewards.sandbox`."""

from __future__ import annotations

import re
from collections.abc import Sequence

from tdrl.llm.rewards.sandbox import SandboxResult, run_python_sandboxed, sandbox_mode

__all__ = ["SandboxResult", "run_python_sandboxed", "sandbox_mode", "extract_code", "code_execution_reward"]


_FENCE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)


def extract_code(text: str) -> str:
    """The last fenced code block of ``text`` (```python ...```), or the whole text."""
    blocks = _FENCE.findall(text)
    return blocks[-1] if blocks else text


def code_execution_reward(timeout: float = 5.0, memory_mb: int = 512):
    """A reward that runs each completion's code followed by its tests in the sandbox.

    The dataset must have a ``tests`` column: a string of Python (e.g. ``assert`` lines) run
    after the completion's code. The reward is 1.0 when the program exits with status 0
    within the limits, else 0.0.

    Args:
        timeout: per-program wall-clock seconds.
        memory_mb: per-program address-space limit.

    Returns:
        A reward callable ``(prompts, completions, tests, **columns) -> list[float]``.
    """

    def reward(prompts: Sequence, completions: Sequence[str], tests: Sequence[str], **_) -> list[float]:
        out = []
        for c, t in zip(completions, tests, strict=True):
            res = run_python_sandboxed(extract_code(c) + "\n\n" + t + "\n", timeout=timeout, memory_mb=memory_mb)
            out.append(1.0 if res.ok else 0.0)
        return out

    reward.__name__ = "code_execution_reward"
    return reward
