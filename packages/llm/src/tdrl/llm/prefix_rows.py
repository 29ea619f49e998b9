"""A GRPO group as one row: its prompt once, then each completion, under a prefix-tree mask.

A round repeats each prompt for the ``G`` completions of its group. Running the distinct
prompts first and the completions against their shared KV cache (two forwards) runs each
prompt once, but every weight then gets two gradients (one per forward) that autograd adds,
and the weight-gradient matmuls see few tokens each. Here one forward does it: row ``u`` holds
prompt ``u`` (``P`` tokens, left-padded) followed by the completions of its group (``W`` tokens
each), and an additive mask lets a prompt token see the earlier prompt tokens and a completion
token see its prompt and the earlier tokens of its own completion, nothing else. Position ids
are those of the prompt + completion sequence, so each hidden state is the one the plain
forward of that row would give (up to float summation order).

The extra attention work (pairs masked out inside a row) is small while completions are short;
:func:`tree_is_cheaper` says when to use it.
"""

from __future__ import annotations

import torch

__all__ = ["prefix_tree_rows", "tree_is_cheaper"]


def tree_is_cheaper(prompt_len: int, width: int, per_prompt: int, hidden_size: int) -> bool:
    """Whether one row per prompt (``prompt_len + per_prompt * width`` tokens, every pair of
    which the attention computes) adds at most ~10% to a layer's matmul work over the prompt +
    KV-cache layout (``prompt_len**2 + per_prompt * width * (prompt_len + width)`` pairs):
    ``4 * hidden_size`` FLOPs a pair against ~``12 * hidden_size**2`` a token."""
    L = prompt_len + per_prompt * width
    extra = L * L - (prompt_len * prompt_len + per_prompt * width * (prompt_len + width))
    return 4 * hidden_size * extra <= 0.1 * 12 * hidden_size * hidden_size * L


def prefix_tree_rows(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, inverse: torch.Tensor,
                     completion_ids: torch.Tensor, completion_mask: torch.Tensor, dtype: torch.dtype = torch.float32):
    """One row per distinct prompt: the prompt, then the completions of its group.

    Args:
        prompt_ids, prompt_mask: ``[U, P]`` the distinct left-padded prompts
            (:func:`tdrl.llm.generation.unique_prompts`).
        inverse: ``[N]`` the prompt of each completion.
        completion_ids, completion_mask: ``[N, W]`` the completion tokens fed to the model (the
            last one is never an input) and their attention mask.
        dtype: the model's dtype (of the additive mask).

    Returns:
        ``(input_ids [U, L], position_ids [U, L], mask [U, 1, L, L], rows [N], cols [N, W + 1])``
        with ``L = P + S * W`` (``S``: the largest group); ``hidden[rows[:, None], cols]`` are
        the hidden states predicting each completion's tokens ``0 .. W`` (its prompt's last
        position, then its own positions).
    """
    U, P = prompt_ids.shape
    N, W = completion_ids.shape
    device = prompt_ids.device
    counts = torch.bincount(inverse, minlength=U)
    order = torch.argsort(inverse, stable=True)
    slot = torch.empty_like(inverse)
    slot[order] = torch.arange(N, device=device) - (counts.cumsum(0) - counts)[inverse[order]]
    S = int(counts.max())
    L = P + S * W
    cols_in = P + slot[:, None] * W + torch.arange(W, device=device)  # [N, W]
    rows2 = inverse[:, None].expand(N, W)
    ids = torch.zeros(U, L, dtype=prompt_ids.dtype, device=device)
    ids[:, :P] = prompt_ids
    ids[rows2, cols_in] = completion_ids
    pmask, cmask = prompt_mask.long(), completion_mask.long()
    real = torch.zeros(U, L, dtype=torch.bool, device=device)
    real[:, :P] = pmask.bool()
    real[rows2, cols_in] = cmask.bool()
    pos = torch.zeros(U, L, dtype=torch.long, device=device)
    pos[:, :P] = (pmask.cumsum(-1) - 1).clamp(min=0)
    # as the plain forward numbers them: cumsum over prompt + completion mask, minus one
    pos[rows2, cols_in] = (pmask.sum(-1)[inverse][:, None] + cmask.cumsum(-1) - 1).clamp(min=0)
    seg = torch.zeros(U, L, dtype=torch.long, device=device)  # 0: prompt, s + 1: completion slot s
    seg[rows2, cols_in] = slot[:, None] + 1
    causal = torch.ones(L, L, dtype=torch.bool, device=device).tril()
    same = (seg[:, None, :] == 0) | (seg[:, None, :] == seg[:, :, None])
    eye = torch.eye(L, dtype=torch.bool, device=device)  # no all-masked row (padding queries)
    allowed = (same & real[:, None, :] & causal) | eye
    mask = torch.where(allowed, torch.zeros((), dtype=dtype, device=device), torch.finfo(dtype).min)[:, None]
    cols = torch.cat([torch.full((N, 1), P - 1, dtype=cols_in.dtype, device=device), cols_in], dim=1)
    return ids, pos, mask, inverse, cols
