"""Answer-checking rewards: the final number of a completion, or its ``\\boxed{}`` content."""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["extract_final_number", "extract_boxed", "parse_number", "math_answer_reward", "boxed_answer_reward"]

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?")


def parse_number(text: str) -> float | None:
    """Parse ``"1,234"``, ``"-3.5"`` or ``"3/4"`` to a float; ``None`` when it is not a number."""
    s = text.strip().replace(",", "").replace("$", "")
    try:
        if "/" in s:
            num, den = s.split("/", 1)
            return float(num) / float(den)
        return float(s)
    except (ValueError, ZeroDivisionError):
        return None


def extract_final_number(text: str) -> str | None:
    """The last number in ``text`` (``"... so 12+3 = 15."`` -> ``"15"``), or ``None``."""
    found = _NUMBER.findall(text)
    return found[-1] if found else None


def extract_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` in ``text`` (braces balanced), or ``None``."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i, depth = start + len("\\boxed{"), 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
    return None


def _matches(pred: str | None, answer) -> bool:
    if pred is None:
        return False
    a, p = parse_number(str(answer)), parse_number(pred)
    if a is not None and p is not None:
        return abs(a - p) <= 1e-6 * max(1.0, abs(a))
    return pred.strip() == str(answer).strip()


def math_answer_reward(prompts: Sequence, completions: Sequence[str], answer: Sequence, **_) -> list[float]:
    """1.0 when the completion's answer equals ``answer``, else 0.0.

    The answer is the ``\\boxed{}`` content when there is one, otherwise the final number.

    Args:
        prompts: unused (part of the reward-function signature).
        completions: ``N`` generated texts.
        answer: ``N`` reference answers (a dataset column).

    Returns:
        ``N`` floats.
    """
    out = []
    for c, a in zip(completions, answer, strict=True):
        pred = extract_boxed(c)
        if pred is None:
            pred = extract_final_number(c)
        out.append(1.0 if _matches(pred, a) else 0.0)
    return out


def boxed_answer_reward(prompts: Sequence, completions: Sequence[str], answer: Sequence, **_) -> list[float]:
    """1.0 only when a ``\\boxed{}`` answer is present and equals ``answer``."""
    return [1.0 if _matches(extract_boxed(c), a) else 0.0 for c, a in zip(completions, answer, strict=True)]
