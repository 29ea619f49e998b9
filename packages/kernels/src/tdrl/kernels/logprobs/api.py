"""Public token log-probs: Triton on CUDA, the chunked torch reference elsewhere."""

from __future__ import annotations

import torch

from .._dispatch import torch_reference, use_triton
from .reference import rows_backward, rows_forward, token_logprobs_impl


def token_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    return_entropy: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities of target tokens (and the entropy) from logits.

    Equivalent to ``log_softmax(logits / temperature).gather(-1, targets)`` but never
    materialises a second ``[B, T, V]`` tensor: the Triton kernel streams the vocabulary in
    blocks with an online max / sum-exp, the torch path works on row chunks. The backward
    recomputes the softmax instead of storing it.

    Args:
        logits: ``[B, T, V]`` (any leading shape) logits, float32 / bfloat16 / float16.
        targets: ``[B, T]`` integer token ids; negative ids (e.g. ``-100``) give log-prob 0.
        temperature: the logits are divided by it (sampling temperature), > 0.
        return_entropy: also return the entropy of ``softmax(logits / temperature)``.

    Returns:
        ``[B, T]`` float32 log-probs (float64 for float64 logits), or ``(logp, entropy)``.
        Both are differentiable with respect to ``logits``.
    """
    if use_triton(logits, targets):
        from .triton import rows_backward_triton, rows_forward_triton

        n_rows = targets.numel()
        return token_logprobs_impl(
            logits, targets, temperature, return_entropy,
            rows_forward_triton, rows_backward_triton, max(1, n_rows),
        )
    return token_logprobs_impl(
        logits, targets, temperature, return_entropy, rows_forward, rows_backward, None
    )


token_logprobs_reference = torch_reference(token_logprobs)
