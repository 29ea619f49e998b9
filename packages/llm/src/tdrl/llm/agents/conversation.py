"""A conversation as a rollout: the policy writes a turn, the tool answers, up to ``max_turns``
policy turns or a turn without a call (the answer); then the loss mask over its tokens.

The policy is any ``generate(context: str) -> str`` (a generator wrapped by the caller); the
conversation is a list of :class:`Turn` s, each from the policy or from the tool, so that only
the policy's tokens are trained (:func:`policy_token_mask`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from tensordict import TensorDict

from tdrl.llm import keys as K
from tdrl.llm.agents.tools import ToolStats

__all__ = ["Turn", "run_conversation", "policy_token_mask"]


@dataclass
class Turn:
    """One segment of a conversation: its text and whether the policy wrote it."""

    text: str
    from_policy: bool
    error: str | None = None


def run_conversation(generate: Callable[[str], str], prompt: str, tool, max_turns: int = 3,
                     stats: ToolStats | None = None) -> list[Turn]:
    """Alternate policy turns and tool answers.

    Args:
        generate: ``context -> turn text`` (the prompt plus every turn so far is the context).
        prompt: the first context.
        tool: ``turn text -> ToolResult | None`` (``None``: the turn made no call: it is the answer).
        max_turns: policy turns at most (``>= 1``).
        stats: counts of tool calls and errors (updated).

    Returns:
        The turns after the prompt, policy and tool interleaved, ending with a policy turn.
    """
    if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
        raise ValueError(f"run_conversation: max_turns={max_turns!r}; expected an integer >= 1")
    turns: list[Turn] = []
    context = prompt
    for k in range(max_turns):
        text = generate(context)
        turns.append(Turn(text, True))
        context += text
        if k == max_turns - 1:
            break
        result = tool(text)
        if result is None:
            break
        if stats is not None:
            stats.add(result)
        turns.append(Turn(result.text, False, result.error))
        context += result.text
    return turns


def tool_token_ids(tokenizer, text: str) -> list[int]:
    """The ids of untrusted ``text`` (a tool's output): special-token strings in it, such as
    ``<|im_start|>``, are split into ordinary tokens (``split_special_tokens=True``), never
    parsed into the special ids that delimit turns.

    Raises:
        TypeError: the tokenizer cannot split special tokens (a ``transformers`` tokenizer older
            than 4.36 or another kind): tool text would then be parsed; upgrade ``transformers``.
    """
    try:
        return tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    except TypeError as exc:
        raise TypeError(f"tool_token_ids: {type(tokenizer).__name__} does not take split_special_tokens=True "
                        f"({exc}); tool output would be parsed for special tokens. Use a transformers "
                        f"tokenizer (>= 4.36).") from None


def policy_token_mask(tokenizer, conversations: Sequence[Sequence[Turn]], pad_id: int | None = None,
                      device: torch.device | str = "cpu") -> TensorDict:
    """Tokenise each conversation's turns and mark which tokens the policy wrote (tool turns
    with :func:`tool_token_ids`: their special-token strings stay text).

    Returns:
        A TensorDict ``[N]`` with ``completion_ids`` ``[N, C]`` (right-padded), ``completion_mask``
        ``[N, C]`` (``True`` on policy tokens only: what the loss trains) and ``attention_mask``
        ``[N, C]`` (every real token, tool output included: what the model reads).
    """
    pad = pad_id if pad_id is not None else (tokenizer.pad_token_id or 0)
    rows, masks = [], []
    for conv in conversations:
        ids, own = [], []
        for turn in conv:
            t = (tokenizer(turn.text, add_special_tokens=False)["input_ids"] if turn.from_policy
                 else tool_token_ids(tokenizer, turn.text))
            ids += t
            own += [turn.from_policy] * len(t)
        rows.append(ids)
        masks.append(own)
    width = max((len(r) for r in rows), default=0)
    n = len(rows)
    out_ids = torch.full((n, width), pad, dtype=torch.long)
    out_mask = torch.zeros(n, width, dtype=torch.bool)
    attn = torch.zeros(n, width, dtype=torch.long)
    for i, (r, m) in enumerate(zip(rows, masks)):
        out_ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        out_mask[i, : len(m)] = torch.tensor(m, dtype=torch.bool)
        attn[i, : len(r)] = 1
    return TensorDict({K.COMPLETION_IDS: out_ids, K.COMPLETION_MASK: out_mask, "attention_mask": attn},
                      batch_size=[n], device=device)
