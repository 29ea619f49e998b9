"""A synthetic arithmetic task generated in code, with its verifier.

``"Q: 23+58="`` -> ``"81"``. The dataset is a ``datasets.Dataset`` with ``"prompt"`` and
``"answer"`` columns; the verifier is :func:`tdrl.llm.rewards.math_answer_reward`, which
reads the final number of the completion and compares it with ``answer``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["ArithmeticTask"]


@dataclass
class ArithmeticTask:
    """Integer arithmetic problems ``a <op> b``.

    Args:
        min_value: smallest operand.
        max_value: largest operand (inclusive).
        ops: operators to draw from, among ``"+"``, ``"-"``, ``"*"``.
    """

    min_value: int = 0
    max_value: int = 99
    ops: str = "+"

    def __post_init__(self):
        if self.min_value > self.max_value:
            raise ValueError(f"ArithmeticTask: min_value {self.min_value} > max_value {self.max_value}")
        bad = set(self.ops) - set("+-*")
        if not self.ops or bad:
            raise ValueError(f"ArithmeticTask: ops must be made of '+', '-', '*', got {self.ops!r}")

    @staticmethod
    def prompt(a: int, op: str, b: int) -> str:
        return f"Q: {a}{op}{b}="

    @staticmethod
    def solve(a: int, op: str, b: int) -> int:
        return {"+": a + b, "-": a - b, "*": a * b}[op]

    def rows(self, n: int, seed: int) -> list[dict]:
        """``n`` random problems as dict rows (``prompt``, ``answer``, ``completion``)."""
        rng = random.Random(seed)
        out = []
        for _ in range(n):
            a = rng.randint(self.min_value, self.max_value)
            b = rng.randint(self.min_value, self.max_value)
            op = rng.choice(self.ops)
            ans = str(self.solve(a, op, b))
            out.append({"prompt": self.prompt(a, op, b), "answer": ans, "completion": ans})
        return out

    def splits(self, n_train: int, n_test: int, seed: int = 0):
        """Disjoint train and held-out test sets (no test prompt appears in train).

        Returns:
            ``(train, test)`` ``datasets.Dataset`` objects.
        """
        import datasets

        test = self.rows(n_test, seed + 1)
        test_prompts = {r["prompt"] for r in test}
        train, k = [], 0
        while len(train) < n_train:
            for r in self.rows(n_train, seed + 1000 + k):
                if r["prompt"] not in test_prompts and len(train) < n_train:
                    train.append(r)
            k += 1
            if k > 100:
                raise ValueError("ArithmeticTask.splits: too few distinct problems for these sizes")
        return datasets.Dataset.from_list(train), datasets.Dataset.from_list(test)

    def corpus(self) -> list[str]:
        """Texts covering every character the task uses, for tokenizer training."""
        texts = [self.prompt(a, op, b) + str(self.solve(a, op, b)) for a in range(0, 100, 7) for b in range(0, 100, 11) for op in "+-*"]
        texts.append("0123456789 +-*=Q: A: -")
        return texts
