"""Public chunked fused linear + log-prob: Triton row kernels on CUDA, torch elsewhere."""

from __future__ import annotations

import torch

from .._dispatch import use_triton
from ..logprobs.reference import default_chunk_rows, rows_backward, rows_forward
from .reference import fused_linear_logprobs_impl

#: logits elements per chunk on the Triton path (2048 rows at V = 152k: ~0.6 GB in bf16).
TRITON_CHUNK_ELEMENTS = 1 << 29


def fused_linear_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    return_entropy: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Token log-probs straight from hidden states and the LM head, chunk by chunk.

    Same value as ``log_softmax((hidden @ weight.T + bias) / temperature).gather(targets)``
    with peak extra memory ``O(chunk_size x V)`` instead of ``O(N x V)``, in the forward and
    the backward (which recomputes each chunk's logits). The matmuls run on torch (cuBLAS
    on GPU); the softmax statistics and their gradient run in Triton on CUDA.

    Args:
        hidden: ``[N, H]`` (any leading shape) final hidden states.
        weight: ``[V, H]`` LM head weight (same dtype as ``hidden``).
        targets: ``[N]`` integer token ids; negative ids give log-prob 0.
        bias: optional ``[V]`` LM head bias.
        temperature: logits are divided by it, > 0.
        chunk_size: rows per chunk; by default a power of two that keeps a chunk of logits
            near 4M elements on CPU, 64M with the torch path on CUDA and 512M with the
            Triton path (which keeps no float32 copy of the chunk).
        return_entropy: also return the entropy of each row's distribution.

    Returns:
        ``[N]`` float32 log-probs, or ``(logp, entropy)``; gradients flow to ``hidden``,
        ``weight`` and ``bias``.
    """
    if use_triton(hidden, weight, targets, bias):
        from ..logprobs.triton import rows_backward_triton, rows_forward_triton

        fwd, bwd = rows_forward_triton, rows_backward_triton
        if chunk_size is None and hidden.is_cuda:
            # The Triton rows read the logits in their own dtype and write the gradient in
            # place, so a chunk costs one [chunk, V] buffer: take bigger chunks (fewer,
            # better-shaped matmuls; fewer read-modify-writes of grad_weight).
            n_rows = hidden.numel() // max(hidden.shape[-1], 1)
            chunk_size = default_chunk_rows(n_rows, weight.shape[0], hidden.device, TRITON_CHUNK_ELEMENTS)
    else:
        fwd, bwd = rows_forward, rows_backward
    return fused_linear_logprobs_impl(
        hidden, weight, targets, bias, temperature, chunk_size, return_entropy, fwd, bwd
    )
