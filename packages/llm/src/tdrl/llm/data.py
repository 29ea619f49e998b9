"""Prompts and completions as TensorDicts; datasets through Hugging Face ``datasets``.

A dataset row is a mapping with a ``"prompt"`` column (a string, or a list of chat messages
``[{"role": ..., "content": ...}]`` rendered with the tokenizer's chat template) and any
extra columns (e.g. ``"answer"``) that reward functions receive as keyword arguments.
For SFT a row holds a ``"completion"`` (a string, or TRL's ``[{"role": "assistant", ...}]``),
or a whole conversation in a ``"messages"`` column (TRL's conversational format): each
assistant turn becomes one (prompt = the turns before it, completion = its content) example,
so the loss falls on the assistant turns only (:func:`conversation_pairs`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from tensordict import TensorDict

from tdrl.llm import keys as K

__all__ = [
    "load_prompt_dataset",
    "render_prompts",
    "tokenize_prompts",
    "concat_prompt_completion",
    "completion_texts",
    "PromptSampler",
    "tokenize_sft",
    "completion_text",
    "conversation_pairs",
    "expand_conversations",
]


def load_prompt_dataset(source: Any, split: str = "train", prompt_column: str = "prompt"):
    """Load prompts as a ``datasets.Dataset`` from a local file, a folder, or memory.

    Args:
        source: a ``datasets.Dataset``; a list of dicts; a dict of columns; or a local path
            to a ``.json``/``.jsonl``/``.csv``/``.parquet`` file or a dataset folder saved with
            ``save_to_disk``.
        split: the split to return when the source holds several.
        prompt_column: the column holding prompts; renamed to ``"prompt"`` when different.

    Returns:
        A ``datasets.Dataset`` with a ``"prompt"`` column.
    """
    import datasets

    if isinstance(source, datasets.DatasetDict):
        ds = source[split]
    elif isinstance(source, datasets.Dataset):
        ds = source
    elif isinstance(source, Mapping):
        ds = datasets.Dataset.from_dict(dict(source))
    elif isinstance(source, Sequence) and not isinstance(source, str):
        ds = datasets.Dataset.from_list(list(source))
    elif isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if os.path.isdir(path):
            loaded = datasets.load_from_disk(path)
            ds = loaded[split] if isinstance(loaded, datasets.DatasetDict) else loaded
        elif os.path.isfile(path):
            ext = path.rsplit(".", 1)[-1].lower()
            builder = {"jsonl": "json", "json": "json", "csv": "csv", "parquet": "parquet"}.get(ext)
            if builder is None:
                raise ValueError(
                    f"load_prompt_dataset: unsupported file type {ext!r} for {path!r}; "
                    "expected .json, .jsonl, .csv or .parquet"
                )
            ds = datasets.load_dataset(builder, data_files=path, split="train")
        else:
            raise FileNotFoundError(f"load_prompt_dataset: no file or folder at {path!r}")
    else:
        raise TypeError(
            "load_prompt_dataset: expected a datasets.Dataset, a list of rows, a dict of "
            f"columns or a local path, got {type(source).__name__}"
        )
    if prompt_column != "prompt":
        ds = ds.rename_column(prompt_column, "prompt")
    if "prompt" not in ds.column_names:
        raise KeyError(
            f"load_prompt_dataset: no 'prompt' column; columns are {ds.column_names}. "
            "Pass prompt_column= to name the prompt column."
        )
    return ds


def render_prompts(tokenizer, prompts: Sequence[Any], tools: Sequence[dict] | None = None, tools_text: str = "") -> list[str]:
    """Turn prompts into strings: chat-message lists go through the chat template.

    Args:
        tokenizer: a Hugging Face tokenizer.
        prompts: strings, or lists of ``{"role", "content"}`` messages.
        tools: JSON schemas of the function tools (:func:`tdrl.llm.agents.tool_schema`), given to a
            chat template that takes ``tools`` (its text mentions them).
        tools_text: the same tools as text (:func:`tdrl.llm.agents.tools_prompt_text`), shown
            otherwise: appended to the first system message (one is added when there is none)
            of a chat prompt, written before a plain-string prompt.

    Returns:
        One string per prompt, ready for tokenisation.
    """
    template = getattr(tokenizer, "chat_template", None)
    template_tools = bool(tools) and isinstance(template, str) and "tools" in template
    out = []
    for p in prompts:
        if isinstance(p, str):
            out.append(tools_text + p if tools and not template_tools else p)
        elif isinstance(p, Sequence):
            if template is None:
                raise ValueError(
                    "render_prompts: got chat messages but the tokenizer has no chat_template; "
                    "set tokenizer.chat_template or pass plain-string prompts"
                )
            messages, extra = list(p), {}
            if template_tools:
                extra["tools"] = list(tools)
            elif tools and tools_text:
                if messages and messages[0].get("role") == "system":
                    messages[0] = {**messages[0], "content": messages[0]["content"] + "\n" + tools_text}
                else:
                    messages.insert(0, {"role": "system", "content": tools_text})
            out.append(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **extra))
        else:
            raise TypeError(f"render_prompts: a prompt must be a str or a message list, got {type(p)}")
    return out


def tokenize_prompts(tokenizer, prompts: Sequence[str], device: torch.device | str = "cpu"):
    """Tokenise prompt strings, left-padded (generation continues from the right edge).

    Args:
        tokenizer: a Hugging Face tokenizer with a pad token.
        prompts: ``N`` strings.
        device: where the tensors go.

    Returns:
        ``(prompt_ids, prompt_mask)``, both ``[N, P]`` int64.
    """
    if tokenizer.pad_token_id is None:
        raise ValueError("tokenize_prompts: the tokenizer has no pad token; set tokenizer.pad_token")
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    try:
        enc = tokenizer(list(prompts), return_tensors="pt", padding=True, add_special_tokens=False)
    finally:
        tokenizer.padding_side = side
    return enc["input_ids"].to(device), enc["attention_mask"].to(device)


def concat_prompt_completion(td: TensorDict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Join prompt and completion into the model's input.

    Args:
        td: a rollout with ``PROMPT_IDS``/``PROMPT_MASK`` ``[N, P]`` and ``COMPLETION_IDS``/
            ``COMPLETION_MASK`` ``[N, C]`` (the attention mask of the completion is
            ``COMPLETION_ATTENTION_MASK`` when present: a multi-turn rollout's tool outputs).

    Returns:
        ``(input_ids, attention_mask, position_ids)``, each ``[N, P + C]``. Positions count only
        attended tokens, as ``generate`` does for left-padded prompts.
    """
    ids = torch.cat([td[K.PROMPT_IDS], td[K.COMPLETION_IDS]], dim=-1)
    attn = td.get(K.COMPLETION_ATTENTION_MASK, None)
    attn = td[K.COMPLETION_MASK] if attn is None else attn
    mask = torch.cat([td[K.PROMPT_MASK].long(), attn.long()], dim=-1)
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, position_ids


def completion_texts(tokenizer, completion_ids: torch.Tensor, completion_mask: torch.Tensor) -> list[str]:
    """Decode generated tokens (masked ones only), skipping special tokens.

    Args:
        completion_ids: ``[N, C]`` token ids.
        completion_mask: ``[N, C]`` bool.

    Returns:
        ``N`` strings.
    """
    # two bulk copies to Python lists instead of a tensor op per row
    rows = [[t for t, m in zip(r, mr) if m] for r, mr in zip(completion_ids.tolist(), completion_mask.bool().tolist())]
    return tokenizer.batch_decode(rows, skip_special_tokens=True)


class PromptSampler:
    """Endless, seeded, epoch-shuffled batches of dataset rows; shards across ranks.

    Args:
        dataset: a ``datasets.Dataset`` (or any sequence of dict rows).
        batch_size: rows per batch (per rank).
        seed: shuffling seed; the same on every rank.
        rank: this process's rank; it takes every ``world_size``-th row of each shuffled epoch.
        world_size: number of data-parallel ranks.
    """

    def __init__(self, dataset, batch_size: int, seed: int = 0, rank: int = 0, world_size: int = 1):
        if len(dataset) < batch_size * world_size:
            raise ValueError(
                f"PromptSampler: dataset has {len(dataset)} rows, fewer than batch_size*world_size="
                f"{batch_size * world_size}"
            )
        self.dataset, self.batch_size = dataset, batch_size
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.epoch, self.pos = 0, 0
        self._order = self._shuffle()

    def _shuffle(self) -> list[int]:
        g = torch.Generator().manual_seed(self.seed + 7919 * self.epoch)
        order = torch.randperm(len(self.dataset), generator=g).tolist()
        return order[self.rank :: self.world_size]

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.pos = state["epoch"], state["pos"]
        self._order = self._shuffle()

    def __iter__(self) -> Iterator[dict[str, list]]:
        return self

    def __next__(self) -> dict[str, list]:
        """Returns a dict of columns (lists of length ``batch_size``)."""
        if self.pos + self.batch_size > len(self._order):
            self.epoch, self.pos = self.epoch + 1, 0
            self._order = self._shuffle()
        idx = self._order[self.pos : self.pos + self.batch_size]
        self.pos += self.batch_size
        rows = [self.dataset[i] for i in idx]
        return {k: [r[k] for r in rows] for k in rows[0]}


def tokenize_sft(tokenizer, prompts: Sequence[str], completions: Sequence[str], device: torch.device | str = "cpu") -> TensorDict:
    """Tokenise (prompt, completion) pairs for supervised fine-tuning.

    The completion is followed by the EOS token (the model learns to stop). Prompt tensors are
    left-padded and completion tensors right-padded, the same layout as a GRPO rollout.

    Args:
        tokenizer: a Hugging Face tokenizer with pad and eos tokens.
        prompts: ``N`` prompt strings (already rendered).
        completions: ``N`` target strings.
        device: where the tensors go.

    Returns:
        TensorDict ``[N]`` with ``PROMPT_IDS``, ``PROMPT_MASK``, ``COMPLETION_IDS``,
        ``COMPLETION_MASK`` (bool).
    """
    if len(prompts) != len(completions):
        raise ValueError(f"tokenize_sft: {len(prompts)} prompts but {len(completions)} completions")
    prompt_ids, prompt_mask = tokenize_prompts(tokenizer, prompts, device)
    eos = tokenizer.eos_token_id
    rows = [tokenizer(c, add_special_tokens=False)["input_ids"] + ([eos] if eos is not None else []) for c in completions]
    C = max(len(r) for r in rows)
    ids = torch.full((len(rows), C), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), C), dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, : len(r)] = True
    return TensorDict(
        {K.PROMPT_IDS: prompt_ids, K.PROMPT_MASK: prompt_mask, K.COMPLETION_IDS: ids.to(device), K.COMPLETION_MASK: mask.to(device)},
        batch_size=[len(rows)],
        device=device,
    )


def completion_text(completion: Any) -> str:
    """A completion as text: a string as is; TRL's ``[{"role": "assistant", "content": ...}]``
    (one assistant message) as its content.

    Raises:
        ValueError: a message list that is not exactly one assistant message.
    """
    if isinstance(completion, str):
        return completion
    msgs = list(completion)
    if len(msgs) != 1 or not isinstance(msgs[0], Mapping) or msgs[0].get("role") != "assistant":
        raise ValueError(
            "completion_text: a conversational completion must be one assistant message "
            f"[{{'role': 'assistant', 'content': ...}}], got {msgs!r:.200}; put longer conversations "
            "in a 'messages' column instead"
        )
    return msgs[0]["content"]


def conversation_pairs(messages: Sequence[Mapping[str, str]]) -> list[tuple[list[dict], str]]:
    """One SFT example per assistant turn of a conversation.

    The prompt of turn ``i`` is the conversation before it (rendered later with the chat
    template and its generation prompt); the completion is the turn's content, followed by
    EOS in :func:`tokenize_sft`. Every token of the conversation outside the assistant turns
    is prompt, so the loss is on the assistant turns only (TRL's ``assistant_only_loss``).

    Args:
        messages: ``[{"role": ..., "content": ...}, ...]`` with at least one assistant turn.

    Returns:
        ``[(prompt_messages, completion_text), ...]``, one per assistant turn, in order.

    Raises:
        ValueError: no assistant turn, an assistant turn first, or a message without role/content.
    """
    msgs = [dict(m) for m in messages]
    for j, m in enumerate(msgs):
        if not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ValueError(f"conversation_pairs: message {j} has no string 'role' and 'content': {m!r:.200}")
    pairs = [(msgs[:i], m["content"]) for i, m in enumerate(msgs) if m["role"] == "assistant"]
    if not pairs:
        raise ValueError(f"conversation_pairs: no assistant turn to learn in {msgs!r:.200}")
    if not pairs[0][0]:
        raise ValueError("conversation_pairs: the conversation starts with an assistant turn; nothing prompts it")
    return pairs


def expand_conversations(dataset, messages_column: str = "messages", completion_column: str = "completion"):
    """A conversational SFT dataset as (prompt, completion) rows, one per assistant turn.

    Args:
        dataset: a ``datasets.Dataset`` with ``messages_column``.
        messages_column: the column of conversations.
        completion_column: the name of the completion column to write.

    Returns:
        A ``datasets.Dataset`` with ``"prompt"`` (message lists), ``completion_column`` and the
        other columns repeated for each turn.
    """
    import datasets

    if messages_column not in dataset.column_names:
        raise KeyError(f"expand_conversations: no {messages_column!r} column; columns are {dataset.column_names}")
    rows = []
    for row in dataset:
        for prompt, completion in conversation_pairs(row[messages_column]):
            extra = {k: v for k, v in row.items() if k not in (messages_column, "prompt", completion_column)}
            rows.append({**extra, "prompt": prompt, completion_column: completion})
    return datasets.Dataset.from_list(rows)
