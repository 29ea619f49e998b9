"""Canonical TensorDict keys of LLM rollouts (see docs/ARCHITECTURE.md, "Data contract").

A rollout holds one row per completion, batch ``(n_prompts * group_size,)``. Prompt tensors
are left-padded to a common length ``P``; completion tensors are right-padded to ``C``.
Per-token quantities of the completion (masks, log-probs) are ``[N, C]`` and aligned with
``COMPLETION_IDS``: entry ``t`` is about the ``t``-th generated token.
"""

from __future__ import annotations

PROMPT_IDS = "prompt_ids"  # [N, P] int64, left-padded
PROMPT_MASK = "prompt_mask"  # [N, P] int64 attention mask of the prompt
COMPLETION_IDS = "completion_ids"  # [N, C] int64, right-padded
COMPLETION_MASK = "completion_mask"  # [N, C] bool, tokens the policy produced (EOS included)
# [N, C] bool, every real completion token the model reads: policy tokens and, in a multi-turn
# rollout, the tool outputs between them (absent: the same as COMPLETION_MASK)
COMPLETION_ATTENTION_MASK = "completion_attention_mask"
SAMPLE_LOG_PROB = "sample_log_prob"  # [N, C] float, generator's log-probs of its tokens
OLD_LOG_PROB = "old_log_prob"  # [N, C] float, trainer's log-probs before the update
REF_LOG_PROB = "ref_log_prob"  # [N, C] float, reference model's log-probs
REWARD = "reward"  # [N] float, summed (weighted) reward of the completion
ADVANTAGE = "advantage"  # [N] float, group-normalised advantage
GROUP_ID = "group_id"  # [N] int64, index of the prompt the completion answers
# SFT rows (tdrl.llm.packing): whole sequences, right-padded, several examples per row when packed
INPUT_IDS = "input_ids"  # [R, L] int64 token ids
POSITION_IDS = "position_ids"  # [R, L] int64, restarting at 0 for each example of a row
SEGMENT_IDS = "segment_ids"  # [R, L] int64, 1.. the example each token belongs to, 0 padding
LOSS_MASK = "loss_mask"  # [R, L] bool, tokens that are targets of the loss

__all__ = [name for name in dir() if name.isupper()]
