"""Environments for multi-turn tasks whose reward depends on the conversation.

An environment is one object per conversation (a zero-argument factory makes them: TRL's
``GRPOTrainer(environment_factory=...)``) with this small protocol:

- ``reset(**row) -> str | None``: start a conversation on one dataset row (its columns, prompt
  included, as keywords); a string is appended to the prompt (the first message the policy
  reads; for chat prompts, to the last message's content);
- ``step(turn_text) -> (reply | None, done)``: read a policy turn; the reply is appended
  (escaped with :func:`escape_output`, tokenised as untrusted text) and read by the next turn;
  ``None`` or ``done`` ends the conversation (the turn is the last);
- ``reward(turns) -> float``: the conversation's score, from the :class:`Turn` s after the prompt
  (policy and environment, ending with the policy's last turn); used by :func:`environment_reward`.

An environment without ``step`` is TRL's kind: its public methods (all but ``reset`` and
``reward``) are its tools, called with ``<tool_call>`` JSON through
:class:`tdrl.llm.agents.CallableTools` in the trainer's process (their state persists between
calls; a timeout cannot stop them). A tool is one kind of environment: both are driven by the
one loop, :func:`tdrl.llm.agents.tool_rollout`, with one :class:`EnvironmentTool` per row.

:class:`GuessNumberEnv` is the example: a number-guessing game that answers "higher" / "lower".
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from tdrl.llm.agents.callables import CallableTools
from tdrl.llm.agents.conversation import Turn
from tdrl.llm.agents.tools import ToolResult, escape_output

__all__ = ["Environment", "EnvironmentTool", "GuessNumberEnv", "environment_reward", "start_environments"]


@runtime_checkable
class Environment(Protocol):
    """The protocol (see the module docstring); ``step`` and ``reward`` are optional for TRL's kind."""

    def reset(self, **row) -> str | None: ...


class EnvironmentTool:
    """One environment as the tool of one conversation row (``turn text -> ToolResult | None``).

    Args:
        env: an environment (``step``, or public methods as tools).
        timeout: seconds per method call (TRL's kind; not enforced: they run in this process).
    """

    def __init__(self, env, timeout: float = 2.0):
        self.env = env
        self.methods = None
        if not callable(getattr(env, "step", None)):
            fns = [getattr(env, n) for n, _ in inspect.getmembers(type(env), callable)
                   if not n.startswith("_") and n not in ("reset", "reward")]
            if not fns:
                raise ValueError(f"environment {type(env).__name__}: no step(turn_text) and no public methods to "
                                 "call as tools; give it one or the other")
            self.methods = CallableTools(fns, timeout=timeout, in_process=True)

    @property
    def schemas(self) -> list[dict]:
        return self.methods.schemas if self.methods is not None else []

    def __call__(self, turn_text: str) -> ToolResult | None:
        if self.methods is not None:
            return self.methods(turn_text)
        reply, done = self.env.step(turn_text)
        if reply is None or done:
            return None
        return ToolResult(escape_output(str(reply)))


def start_environments(factory: Callable[[], object], prompts: Sequence, columns: dict[str, list]
                       ) -> tuple[list, list]:
    """One fresh environment per row, reset on the row; the prompts with their first messages.

    Args:
        factory: makes one environment (a class, or a function).
        prompts: one per row (strings or chat-message lists).
        columns: the other dataset columns, each one value per row.

    Returns:
        ``(environments, prompts)``.

    Raises:
        TypeError: ``reset`` returned something other than a string or ``None``.
    """
    envs, out = [], []
    for i, prompt in enumerate(prompts):
        env = factory()
        first = env.reset(prompt=prompt, **{k: v[i] for k, v in columns.items()})
        if first is not None and not isinstance(first, str):
            raise TypeError(f"{type(env).__name__}.reset returned {type(first).__name__}; expected a string "
                            "(the first message) or None")
        if first:
            if isinstance(prompt, str):
                prompt = prompt + first
            else:
                prompt = [*prompt[:-1], {**prompt[-1], "content": prompt[-1]["content"] + first}]
        envs.append(env)
        out.append(prompt)
    return envs, out


def environment_reward(completions, environments, turns, **_) -> list[float]:
    """Each conversation's ``environment.reward(turns)`` (the default reward with an environment)."""
    return [float(env.reward(t)) for env, t in zip(environments, turns, strict=True)]


class GuessNumberEnv:
    """Guess a number in ``[low, high]``: the policy writes a number each turn, the game answers
    ``" higher\\n"`` / ``" lower\\n"``, and ends when the guess is right.

    ``reset(target=..., **row)`` takes the row's ``target`` column (so a group shares its game);
    the reward is ``1 / k`` when the ``k``-th guess is the first right one, else 0.
    """

    def __init__(self, low: int = 1, high: int = 8):
        self.low, self.high, self.target = low, high, None

    def reset(self, target: int, **row) -> str | None:
        self.target = int(target)
        return None

    @staticmethod
    def guess(text: str) -> int | None:
        """The first integer of ``text``, or ``None``."""
        m = re.search(r"-?\d+", text)
        return int(m.group()) if m else None

    def step(self, turn_text: str) -> tuple[str | None, bool]:
        g = self.guess(turn_text)
        if g is None:
            return " a number please\n", False
        if g == self.target:
            return None, True
        return (" higher\n" if g < self.target else " lower\n"), False

    def reward(self, turns: Sequence[Turn]) -> float:
        for k, text in enumerate((t.text for t in turns if t.from_policy), start=1):
            if self.guess(text) == self.target:
                return 1.0 / k
        return 0.0
