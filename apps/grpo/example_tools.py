"""An example of your own tool for ``apps/grpo/train.py tool=apps/grpo/example_tools.py:multiply``
(the ``user_tools_tiny`` recipe): a plain function whose type hints and docstring become the JSON
schema the prompt shows (``transformers.utils.get_json_schema``)."""

from __future__ import annotations


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first factor.
        b: the second factor.

    Returns:
        The product a * b.
    """
    return a * b
