"""SFT examples as whole token sequences: tokenisation, ``max_length`` truncation and packing.

An example is one token sequence with a loss mask (TRL's ``completion_mask``): a prompt +
completion pair (the completion and its EOS are targets; with ``completion_only_loss=False``
every token is), or a plain text (TRL's ``dataset_text_field``; every token is a target).
Examples longer than ``max_length`` keep their first ``max_length`` tokens (TRL's truncation).

Rows are built in one of two ways (:func:`collate`):

- one example per row, right-padded to the longest (``packing=False``);
- packing: examples are placed into rows of ``max_length`` tokens by best-fit decreasing
  (:func:`pack_lengths`, TRL's ``packing_strategy="bfd"``), so short examples stop wasting most
  of a padded batch. Attention never crosses examples: position ids restart at 0 for each
  example and the model gets a block-diagonal causal mask (:func:`block_causal_mask`), and the
  token that ends one example does not predict the first token of the next.

A row TensorDict holds :data:`~tdrl.llm.keys.INPUT_IDS`, ``POSITION_IDS``, ``SEGMENT_IDS``
(the example each token belongs to, 0 for padding) and ``LOSS_MASK``, all ``[R, L]``;
:class:`tdrl.llm.losses.SFTLoss` reads it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tensordict import TensorDict

from tdrl.llm import keys as K

__all__ = ["Example", "tokenize_example", "tokenize_text", "truncate", "pack_lengths", "collate", "block_causal_mask",
           "target_mask"]

Example = tuple[list[int], list[bool]]
"""``(token ids, loss mask)`` of one example, equal lengths."""


def _eos(tokenizer) -> list[int]:
    return [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []


def tokenize_example(tokenizer, prompt: str, completion: str, completion_only_loss: bool = True) -> Example:
    """One prompt + completion example; the completion is followed by EOS.

    Prompt and completion are tokenised separately (as :func:`tdrl.llm.data.tokenize_sft` does),
    so the boundary between them is exact.

    Args:
        tokenizer: a Hugging Face tokenizer.
        prompt: the rendered prompt string.
        completion: the target string.
        completion_only_loss: targets are the completion and EOS only (TRL's default for
            prompt-completion data); ``False``: every token.

    Returns:
        ``(ids, loss_mask)``.
    """
    p = tokenizer(prompt, add_special_tokens=False)["input_ids"] if prompt else []
    c = tokenizer(completion, add_special_tokens=False)["input_ids"] + _eos(tokenizer)
    return p + c, [not completion_only_loss] * len(p) + [True] * len(c)


def tokenize_text(tokenizer, text: str) -> Example:
    """One plain-text example (language modelling: every token, and the EOS after it, is a target)."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"] + _eos(tokenizer)
    return ids, [True] * len(ids)


def truncate(example: Example, max_length: int | None) -> Example:
    """The first ``max_length`` tokens of ``example`` (``None``: unchanged)."""
    if max_length is None:
        return example
    return example[0][:max_length], example[1][:max_length]


def pack_lengths(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Best-fit decreasing bin packing of examples into rows of ``capacity`` tokens.

    Args:
        lengths: each example's token count, each ``<= capacity``.
        capacity: tokens per row.

    Returns:
        Rows as lists of example indices; every index appears once. Fewer rows than examples
        whenever two examples fit together.
    """
    if any(n > capacity for n in lengths):
        raise ValueError(f"pack_lengths: an example of {max(lengths)} tokens exceeds the row capacity {capacity}; "
                         "truncate examples to max_length first")
    rows: list[list[int]] = []
    free: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda j: -lengths[j]):
        fits = [r for r, f in enumerate(free) if f >= lengths[i]]
        if fits:
            r = min(fits, key=lambda r: free[r])
            rows[r].append(i)
            free[r] -= lengths[i]
        else:
            rows.append([i])
            free.append(capacity - lengths[i])
    return rows


def collate(examples: Sequence[Example], pad_id: int, rows: Sequence[Sequence[int]] | None = None,
            device: torch.device | str = "cpu") -> TensorDict:
    """Examples laid out as right-padded rows.

    Args:
        examples: ``(ids, loss_mask)`` pairs.
        pad_id: the padding token id.
        rows: example indices per row (from :func:`pack_lengths`); ``None``: one example per row.
        device: where the tensors go.

    Returns:
        TensorDict ``[R]`` with ``INPUT_IDS``, ``POSITION_IDS``, ``SEGMENT_IDS`` (1.. per example
        within its row, 0 padding) and ``LOSS_MASK`` (bool), each ``[R, L]``, ``L`` the longest row.
    """
    rows = [[i] for i in range(len(examples))] if rows is None else rows
    width = max(1, max(sum(len(examples[i][0]) for i in row) for row in rows))
    shape = (len(rows), width)
    ids = torch.full(shape, pad_id, dtype=torch.long)
    pos = torch.zeros(shape, dtype=torch.long)
    seg = torch.zeros(shape, dtype=torch.long)
    loss = torch.zeros(shape, dtype=torch.bool)
    for r, row in enumerate(rows):
        at = 0
        for s, i in enumerate(row, start=1):
            tok, m = examples[i]
            n = len(tok)
            ids[r, at : at + n] = torch.tensor(tok, dtype=torch.long)
            pos[r, at : at + n] = torch.arange(n)
            seg[r, at : at + n] = s
            loss[r, at : at + n] = torch.tensor(m, dtype=torch.bool)
            at += n
    return TensorDict({K.INPUT_IDS: ids, K.POSITION_IDS: pos, K.SEGMENT_IDS: seg, K.LOSS_MASK: loss},
                      batch_size=[len(rows)]).to(device)


def block_causal_mask(segment_ids: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Additive attention mask: each token attends to the earlier tokens of its own example.

    Args:
        segment_ids: ``[R, L]``, 0 for padding.
        dtype: the model's dtype.

    Returns:
        ``[R, 1, L, L]``: 0 where query ``i`` may attend key ``j`` (same example, ``j <= i``), the
        dtype's minimum elsewhere. A padding query attends itself only (no all-masked row, which
        would give NaN in softmax); padding is never a key of a real token.
    """
    L = segment_ids.shape[-1]
    causal = torch.ones(L, L, dtype=torch.bool, device=segment_ids.device).tril()
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    real = segment_ids[:, None, :] > 0
    eye = torch.eye(L, dtype=torch.bool, device=segment_ids.device)
    allowed = (same & real & causal) | eye
    zero = torch.zeros((), dtype=dtype, device=segment_ids.device)
    return torch.where(allowed, zero, torch.finfo(dtype).min)[:, None]


def target_mask(td: TensorDict) -> torch.Tensor:
    """``[R, L - 1]`` bool: whether the hidden state at ``t`` is trained to predict token ``t + 1``
    (token ``t + 1`` is a target of the same example as token ``t``)."""
    seg = td[K.SEGMENT_IDS]
    return td[K.LOSS_MASK][:, 1:] & (seg[:, 1:] == seg[:, :-1]) & (seg[:, 1:] > 0)
