"""A synthetic arithmetic task generated in code, with its verifier.

``"Q: 23+58="`` -> ``"81"`` (plain text), or with ``chat=True`` the conversational prompt
``[{"role": "user", "content": "What is 23 + 58? Answer with the number only."}]`` that a chat
model's template renders (TRL's conversational format). The dataset is a ``datasets.Dataset``
with ``"prompt"`` and ``"answer"`` columns; the verifier is
:func:`tdrl.llm.rewards.math_answer_reward`, which reads the final number of the completion and
compares it with ``answer``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["ArithmeticTask", "FunctionToolArithmeticTask", "ToolArithmeticTask"]


@dataclass
class ArithmeticTask:
    """Integer arithmetic problems ``a <op> b``.

    Args:
        min_value: smallest operand.
        max_value: largest operand (inclusive).
        ops: operators to draw from, among ``"+"``, ``"-"``, ``"*"``.
        chat: prompts as one user message (:meth:`chat_prompt`) instead of ``"Q: a+b="``.
    """

    min_value: int = 0
    max_value: int = 99
    ops: str = "+"
    chat: bool = False

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
    def chat_prompt(a: int, op: str, b: int) -> list[dict[str, str]]:
        """The problem as a conversation of one user turn (rendered by the tokenizer's chat template)."""
        return [{"role": "user", "content": f"What is {a} {op} {b}? Answer with the number only."}]

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
            prompt = self.chat_prompt(a, op, b) if self.chat else self.prompt(a, op, b)
            out.append({"prompt": prompt, "answer": ans, "completion": ans})
        return out

    def splits(self, n_train: int, n_test: int, seed: int = 0):
        """Disjoint train and held-out test sets (no test prompt appears in train).

        Returns:
            ``(train, test)`` ``datasets.Dataset`` objects.
        """
        import datasets

        test = self.rows(n_test, seed + 1)
        test_prompts = {str(r["prompt"]) for r in test}
        train, k = [], 0
        while len(train) < n_train:
            for r in self.rows(n_train, seed + 1000 + k):
                if str(r["prompt"]) not in test_prompts and len(train) < n_train:
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


@dataclass
class ToolArithmeticTask(ArithmeticTask):
    """Arithmetic too hard to do in the head, with the sandboxed Python tool at hand.

    ``"Q: 37*86="``: the policy may write ``<python>print(37*86)</python>`` (its turn ends with
    EOS), reads ``<output>3182</output>`` from :class:`tdrl.llm.agents.PythonTool`, and answers
    ``3182`` in its next turn. :meth:`demonstrations` gives SFT rows of both kinds (tool use and
    a direct answer) for a warm start; :meth:`corpus` covers the tool syntax so that a tiny
    tokenizer trained on it can write it. The corpus keeps each segment (prompt, call, output,
    answer) a text of its own, so the tokenizer learns no merge across a segment boundary and a
    conversation tokenised as one string equals its turns tokenised one by one.
    """

    min_value: int = 10
    max_value: int = 99
    ops: str = "*"
    call_tag = "<python>"  # what opens a call (the demonstrations' second row starts after it)

    def call(self, a: int, op: str, b: int) -> str:
        return f"<python>print({a}{op}{b})</python>"

    @staticmethod
    def tool_output(value) -> str:
        """What :class:`tdrl.llm.agents.PythonTool` answers for a program printing ``value``."""
        return f"<output>{value}</output>"

    def demonstrations(self, n: int, seed: int, tool_fraction: float, eos: str) -> list[dict]:
        """``n`` problems as SFT rows (``prompt``, ``completion``, ``answer``).

        Each problem gives three rows: its first turn, the call for a fraction ``tool_fraction``
        of the problems and the direct answer for the rest; the rest of the call after its opening
        tag (the prompt ends with ``<python>``); and the answer read from the tool's output (the
        prompt holds the call, ``eos`` and the output). Writing the call and reading the output
        are then learnt on every problem, whatever the first turn's mix.

        Args:
            eos: the tokenizer's EOS text (the end of the calling turn, as SFT ends every target).
        """
        if not 0.0 <= tool_fraction <= 1.0:
            raise ValueError(f"ToolArithmeticTask.demonstrations: tool_fraction={tool_fraction!r}; expected a number in [0, 1]")
        rng = random.Random(seed)
        out = []
        for _ in range(n):
            a, b = rng.randint(self.min_value, self.max_value), rng.randint(self.min_value, self.max_value)
            op = rng.choice(self.ops)
            p, ans = self.prompt(a, op, b), str(self.solve(a, op, b))
            first = self.call(a, op, b) if rng.random() < tool_fraction else ans
            out.append({"prompt": p, "completion": first, "answer": ans})
            tag = self.call_tag
            out.append({"prompt": p + tag, "completion": self.call(a, op, b)[len(tag):], "answer": ans})
            out.append({"prompt": p + self.call(a, op, b) + eos + self.tool_output(ans), "completion": ans, "answer": ans})
        return out

    def corpus(self) -> list[str]:
        texts = super().corpus()
        for a in range(self.min_value, self.max_value + 1, 7):
            for b in range(self.min_value, self.max_value + 1, 11):
                for op in self.ops:
                    texts += [self.prompt(a, op, b), self.call(a, op, b), self.tool_output(self.solve(a, op, b))]
        texts.append("<output>error: </output>")
        return texts


@dataclass
class FunctionToolArithmeticTask(ToolArithmeticTask):
    """:class:`ToolArithmeticTask` with a user's Python function as the tool (``multiply(a, b)``),
    called as ``<tool_call>{"name": "multiply", "arguments": {"a": 37, "b": 86}}</tool_call>``
    (:class:`tdrl.llm.agents.CallableTools`), which answers ``<output>3182</output>``.

    Args:
        tool_name: the function's name.
        arg_names: its two arguments' names, in order.
        preamble: the tools text the trainer shows before each plain prompt
            (:func:`tdrl.llm.agents.tools_prompt_text`); the demonstrations and the corpus hold it too.
    """

    tool_name: str = "multiply"
    arg_names: tuple[str, str] = ("a", "b")
    preamble: str = ""
    call_tag = "<tool_call>"

    def call(self, a: int, op: str, b: int) -> str:
        x, y = self.arg_names
        return f'<tool_call>{{"name": "{self.tool_name}", "arguments": {{"{x}": {a}, "{y}": {b}}}}}</tool_call>'

    def demonstrations(self, n: int, seed: int, tool_fraction: float, eos: str) -> list[dict]:
        """As :meth:`ToolArithmeticTask.demonstrations`, each prompt after the tools ``preamble``."""
        return [dict(r, prompt=self.preamble + r["prompt"]) for r in super().demonstrations(n, seed, tool_fraction, eos)]

    def corpus(self) -> list[str]:
        return super().corpus() + ([self.preamble] if self.preamble else [])
