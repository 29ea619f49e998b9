"""Answer-checking rewards: the final number of a completion, or its ``\\boxed{}`` content.

Answers compare as numbers when both sides evaluate to one: plain numbers (``"1,234"``,
``"-3.5"``, ``"3/4"``, ``"50%"``) and LaTeX arithmetic (``\\frac{1}{2}``, ``\\dfrac12``,
``2\\sqrt{2}``, ``3 \\cdot 10^{2}``, ``\\pi``, ``x = 4``) through :func:`latex_value`, a small
parser that evaluates only numbers and arithmetic operators (never ``eval``); otherwise as
normalised text (spaces, ``$``, ``\\left``/``\\right``, ``\\text{}`` removed), so
``\\boxed{\\frac{1}{2}}`` scores 1 against the answer ``0.5``. Hugging Face's ``math-verify``
covers more (sets, intervals, symbolic equality); this covers the numeric answers of GSM8K-
and MATH-style data without a dependency.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Sequence

__all__ = ["extract_final_number", "extract_boxed", "parse_number", "latex_value", "answers_match", "math_answer_reward",
           "boxed_answer_reward"]

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


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.Pow: operator.pow, ast.USub: operator.neg, ast.UAdd: operator.pos}
_LATEX_SUBS = [
    (r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}", r"((\1)/(\2))"),  # \frac{a}{b}
    (r"\\[dt]?frac\s*(\d)\s*(\d)", r"((\1)/(\2))"),  # \frac12
    (r"\\sqrt\s*\{([^{}]*)\}", r"((\1)**0.5)"),
    (r"\\sqrt\s*(\d+)", r"((\1)**0.5)"),
    (r"\^\s*\{([^{}]*)\}", r"**(\1)"),
    (r"\^", "**"),
]


def _clean(text: str) -> str:
    s = str(text).strip().strip("$").strip()
    s = re.sub(r"\\text\s*\{([^{}]*)\}", r"\1", s)
    s = re.sub(r"\\(left|right|displaystyle|!|,|;|:| )", "", s)
    s = s.replace("\\%", "%").replace("\\$", "").replace("{,}", "")
    if "=" in s:  # "x = 4": the right-hand side
        s = s.rsplit("=", 1)[1]
    return s.strip().rstrip(".").strip()


def _evaluate(node):
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return float(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 64:
            raise ValueError("exponent too large")
        return _OPS[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_evaluate(node.operand))
    raise ValueError(f"not arithmetic: {ast.dump(node)[:60]}")


def latex_value(text: str) -> float | None:
    """The number a plain or LaTeX arithmetic answer stands for, or ``None``.

    ``"\\frac{1}{2}"`` -> 0.5, ``"-\\dfrac{3}{4}"`` -> -0.75, ``"2\\sqrt{2}"`` -> 2.828...,
    ``"3 \\cdot 10^{2}"`` -> 300, ``"50\\%"`` -> 0.5, ``"x = 4"`` -> 4, ``"1,234"`` -> 1234.
    """
    s = _clean(text)
    if not s or len(s) > 200:
        return None
    plain = parse_number(s.rstrip("%"))
    if plain is not None:
        return plain / 100 if s.endswith("%") else plain
    percent = s.endswith("%")
    s = s.rstrip("%")
    for pattern, repl in _LATEX_SUBS:
        for _ in range(4):  # nested fractions resolve from the inside out
            s, n = re.subn(pattern, repl, s)
            if not n:
                break
    s = (s.replace("\\cdot", "*").replace("\\times", "*").replace("\\div", "/").replace("\\pi", f"({math.pi})")
         .replace("{", "(").replace("}", ")").replace(",", ""))
    s = re.sub(r"(\d|\))\s*\(", r"\1*(", s)  # implicit product: 2(...), (..)(..)
    if re.search(r"[^0-9.+\-*/() eE]", s):
        return None
    try:
        value = _evaluate(ast.parse(s, mode="eval"))
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError, TypeError, RecursionError):
        return None
    if not math.isfinite(value):
        return None
    return value / 100 if percent else value


def answers_match(pred: str | None, answer) -> bool:
    """Whether a predicted answer equals the reference: as numbers (relative 1e-6) when both
    evaluate to one (:func:`latex_value`), else as normalised text."""
    if pred is None:
        return False
    a, p = latex_value(str(answer)), latex_value(pred)
    if a is not None and p is not None:
        return abs(a - p) <= 1e-6 * max(1.0, abs(a))
    return _clean(pred).replace(" ", "") == _clean(str(answer)).replace(" ", "")


_matches = answers_match


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
