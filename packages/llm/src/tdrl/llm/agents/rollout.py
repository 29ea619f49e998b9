"""Multi-turn tool rollouts in token space: the conversation as an environment over TensorDicts.

TorchRL's view of a conversation (a chat environment whose state is the history, the policy's
turn the action, a tool transform that appends its output to the history) is kept here in the
shape the GRPO trainer already consumes: one batched loop over turns whose state is each row's
growing token sequence, and whose result is the trainer's rollout TensorDict, so
``GRPOTrainer.rollout`` swaps one ``generator.generate`` call for :func:`tool_rollout` and
nothing else changes downstream. A step is:

1. the policy writes a turn (the generator continues every open conversation from its last
   token, up to EOS or ``max_new_tokens``);
2. the tool reads each turn: a turn without a call is the answer and closes the conversation;
   a call is run (in parallel over the batch, bounded) and its output is tokenised and
   appended, read by the policy's next turn but never trained;
3. after ``max_turns`` policy turns the conversation closes whatever the last turn held.

Token ids are kept exactly as sampled (never decoded and re-encoded), so the sampling
log-probs line up with the ids the trainer scores; only the tool's text is tokenised, with
special-token strings split into ordinary tokens (never parsed), so a program that prints
``<|im_end|><|im_start|>user`` cannot put a turn boundary into the context.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDict

from tdrl.llm import keys as K
from tdrl.llm.agents.conversation import Turn, tool_token_ids
from tdrl.llm.agents.tools import ToolStats

__all__ = ["ToolRollout", "tool_rollout"]


@dataclass
class ToolRollout:
    """What :func:`tool_rollout` returns.

    Attributes:
        td: ``[N]`` with ``COMPLETION_IDS`` / ``COMPLETION_MASK`` (policy tokens) /
            ``COMPLETION_ATTENTION_MASK`` (policy and tool tokens) / ``SAMPLE_LOG_PROB`` (0 off
            the policy's tokens), all ``[N, C]``, right-padded after the conversation.
        turns: each row's conversation after the prompt (:class:`Turn` s, policy and tool).
        stats: tool calls and errors of this batch.
    """

    td: TensorDict
    turns: list[list[Turn]]
    stats: ToolStats

    @property
    def conversations(self) -> list[str]:
        """Each row's text after the prompt, tool outputs included (what the model read)."""
        return ["".join(t.text for t in conv) for conv in self.turns]

    @property
    def final_turns(self) -> list[str]:
        """Each row's last policy turn: its answer."""
        return [conv[-1].text for conv in self.turns]


def _left_pad(rows: list[list[int]], pad: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
            mask[i, width - len(r):] = 1
    return ids.to(device), mask.to(device)


@torch.no_grad()
def tool_rollout(generator, tokenizer, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, tool, max_turns: int = 3,
                 workers: int = 4, greedy: bool = False) -> ToolRollout:
    """Run every prompt row as a conversation with ``tool``.

    Args:
        generator: a :class:`tdrl.llm.generation.Generator` (one turn per call).
        tokenizer: tokenises the tool's outputs and decodes the turns.
        prompt_ids, prompt_mask: ``[N, P]`` left-padded prompts.
        tool: ``turn text -> ToolResult | None`` (``None``: no call, the turn is the answer);
            it must never raise (:class:`tdrl.llm.agents.PythonTool` answers errors as text). Or
            one such callable per row (a list of ``N``): e.g. one
            :class:`tdrl.llm.agents.EnvironmentTool` per conversation.
        max_turns: policy turns at most (``>= 1``; 1 is the single-turn rollout).
        workers: tool calls run at once.
        greedy: decode greedily (evaluation).

    Returns:
        A :class:`ToolRollout`.
    """
    from tdrl.llm.rewards.compute import map_bounded

    if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
        raise ValueError(f"tool_rollout: max_turns={max_turns!r}; expected an integer >= 1")
    if prompt_ids.shape != prompt_mask.shape or prompt_ids.ndim != 2:
        raise ValueError(f"tool_rollout: prompt_ids {tuple(prompt_ids.shape)} and prompt_mask "
                         f"{tuple(prompt_mask.shape)} must be the same [N, P]")
    per_row = isinstance(tool, (list, tuple))
    if per_row and len(tool) != prompt_ids.shape[0]:
        raise ValueError(f"tool_rollout: {len(tool)} tools for {prompt_ids.shape[0]} rows; give one tool or one per row")
    device = prompt_ids.device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    n = prompt_ids.shape[0]
    prompts = [prompt_ids[i][prompt_mask[i].bool()].tolist() for i in range(n)]
    ids: list[list[int]] = [[] for _ in range(n)]
    own: list[list[bool]] = [[] for _ in range(n)]
    logp: list[list[float]] = [[] for _ in range(n)]
    turns: list[list[Turn]] = [[] for _ in range(n)]
    stats = ToolStats()
    active = list(range(n))
    for k in range(max_turns):
        ctx_ids, ctx_mask = _left_pad([prompts[i] + ids[i] for i in active], pad, device)
        out = generator.generate(ctx_ids, ctx_mask, greedy=greedy)
        cids, cmask, clp = out[K.COMPLETION_IDS].cpu(), out[K.COMPLETION_MASK].cpu(), out[K.SAMPLE_LOG_PROB].cpu()
        texts = []
        for j, i in enumerate(active):
            m = int(cmask[j].sum())
            tok = cids[j, :m].tolist()
            ids[i] += tok
            own[i] += [True] * m
            logp[i] += clp[j, :m].tolist()
            texts.append(tokenizer.decode(tok, skip_special_tokens=True))
            turns[i].append(Turn(texts[-1], True))
        if k == max_turns - 1:
            break
        calls = [(tool[i] if per_row else tool, t) for i, t in zip(active, texts)]
        results = map_bounded(lambda c: c[0](c[1]), calls, workers)
        still = []
        for i, res in zip(active, results, strict=True):
            if res is None:
                continue
            stats.add(res)
            tok = tool_token_ids(tokenizer, res.text)
            ids[i] += tok
            own[i] += [False] * len(tok)
            logp[i] += [0.0] * len(tok)
            turns[i].append(Turn(res.text, False, res.error))
            still.append(i)
        active = still
        if not active:
            break
    stats.conversations = n
    stats.with_call = sum(any(not t.from_policy for t in conv) for conv in turns)
    width = max(1, max(len(r) for r in ids))
    out_ids = torch.full((n, width), pad, dtype=torch.long)
    out_own = torch.zeros(n, width, dtype=torch.bool)
    out_attn = torch.zeros(n, width, dtype=torch.bool)
    out_lp = torch.zeros(n, width, dtype=torch.float32)
    for i in range(n):
        L = len(ids[i])
        if L:
            out_ids[i, :L] = torch.tensor(ids[i], dtype=torch.long)
            out_own[i, :L] = torch.tensor(own[i], dtype=torch.bool)
            out_attn[i, :L] = True
            out_lp[i, :L] = torch.tensor(logp[i], dtype=torch.float32)
    td = TensorDict({K.COMPLETION_IDS: out_ids, K.COMPLETION_MASK: out_own, K.COMPLETION_ATTENTION_MASK: out_attn,
                     K.SAMPLE_LOG_PROB: out_lp}, batch_size=[n]).to(device)
    return ToolRollout(td, turns, stats)
