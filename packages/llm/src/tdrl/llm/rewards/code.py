"""Test-passing reward for generated Python code, run in :mod:`tdrl.llm.rewards.sandbox`."""

from __future__ import annotations

import re
from collections.abc import Sequence

from tdrl.llm.rewards.compute import map_bounded
from tdrl.llm.rewards.workers import thread_safe_reward
from tdrl.llm.rewards.sandbox import SandboxResult, check_sandbox_mode, run_python_sandboxed, sandbox_mode

__all__ = ["SandboxResult", "run_python_sandboxed", "sandbox_mode", "extract_code", "code_execution_reward"]


_FENCE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)


def extract_code(text: str) -> str:
    """The last fenced code block of ``text`` (```python ...```), or the whole text."""
    blocks = _FENCE.findall(text)
    return blocks[-1] if blocks else text


def code_execution_reward(timeout: float = 5.0, memory_mb: int = 512, workers: int = 4, mode: str = "bwrap"):
    """A reward that runs each completion's code followed by its tests in the sandbox.

    The dataset must have a ``tests`` column: a string of Python (e.g. ``assert`` lines) run
    after the completion's code. The reward is 1.0 when the program exits with status 0
    within the limits, else 0.0.

    Programs run ``workers`` at a time (threads, each waiting on its own sandboxed process),
    every one under the same per-program limits; a batch therefore takes about
    ``ceil(N / workers)`` program times instead of ``N``. Keep the batch's worst case,
    ``ceil(N / workers) * (timeout + 1)`` s, under ``GRPOConfig.reward_timeout``.

    Args:
        timeout: per-program wall-clock seconds.
        memory_mb: per-program address-space limit.
        workers: programs run at once (``1``: one after another).
        mode: the sandbox's mode (:func:`run_python_sandboxed`): ``"bwrap"`` (default) runs
            every program isolated or raises :class:`tdrl.llm.rewards.sandbox.SandboxUnavailable`
            (the batch fails: no completion is run unconfined); ``"rlimit"`` runs them
            without isolation, for trusted code only.

    Returns:
        A reward callable ``(prompts, completions, tests, **columns) -> list[float]``. It is
        marked :func:`tdrl.llm.rewards.compute.thread_safe_reward`: its waits are bounded by
        each program's own timeout, so it runs in a thread of the trainer rather than a
        worker process.

    Raises:
        ValueError: a limit is not positive, ``workers`` is not an integer >= 1, or ``mode``
            is unknown.
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"code_execution_reward: workers={workers!r}; expected an integer >= 1")
    for name, value in (("timeout", timeout), ("memory_mb", memory_mb)):
        if not value > 0:
            raise ValueError(f"code_execution_reward: {name}={value!r}; expected a positive number")
    check_sandbox_mode(mode, "code_execution_reward")

    def run_one(pair) -> float:
        c, t = pair
        res = run_python_sandboxed(extract_code(c) + "\n\n" + t + "\n", timeout=timeout, memory_mb=memory_mb,
                                   mode=mode)
        return 1.0 if res.ok else 0.0

    def reward(prompts: Sequence, completions: Sequence[str], tests: Sequence[str], **_) -> list[float]:
        return map_bounded(run_one, list(zip(completions, tests, strict=True)), workers)

    reward.__name__ = "code_execution_reward"
    return thread_safe_reward(reward)
