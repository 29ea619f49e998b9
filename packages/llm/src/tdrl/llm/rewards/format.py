"""Format rewards: does the completion have the expected shape?"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["regex_format_reward", "think_answer_format_reward", "number_only_format_reward"]


def regex_format_reward(pattern: str, flags: int = re.DOTALL):
    """A reward of 1.0 for completions that fully match ``pattern``, else 0.0.

    Args:
        pattern: a regular expression the whole (stripped) completion must match.
        flags: ``re`` flags.

    Returns:
        A reward callable ``(prompts, completions, **columns) -> list[float]``.
    """
    rx = re.compile(pattern, flags)

    def reward(prompts: Sequence, completions: Sequence[str], **_) -> list[float]:
        return [1.0 if rx.fullmatch(c.strip()) else 0.0 for c in completions]

    reward.__name__ = "regex_format_reward"
    return reward


think_answer_format_reward = regex_format_reward(r"<think>.*?</think>\s*<answer>.*?</answer>")
think_answer_format_reward.__name__ = "think_answer_format_reward"
number_only_format_reward = regex_format_reward(r"-?\d+(?:\.\d+)?")
number_only_format_reward.__name__ = "number_only_format_reward"
