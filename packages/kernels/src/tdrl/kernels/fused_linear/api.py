"""Public chunked fused linear + log-prob: Triton row kernels on CUDA, torch elsewhere."""

from __future__ import annotations

import torch

from .._dispatch import torch_reference, use_triton
from ..logprobs.reference import default_chunk_rows, rows_backward, rows_forward
from .cross_entropy import fused_linear_cross_entropy_impl
from .pg_loss import fused_linear_pg_loss_impl
from .reference import fused_linear_logprobs_impl

#: logits elements per chunk on the Triton path (2048 rows at V = 152k: ~0.6 GB in bf16).
TRITON_CHUNK_ELEMENTS = 1 << 29


def _row_functions(hidden: torch.Tensor, weight: torch.Tensor, chunk_size: int | None, *others):
    """The softmax row functions for these inputs (Triton on CUDA, torch otherwise) and the
    chunk size (bigger by default with Triton's rows)."""
    if not use_triton(hidden, weight, *others):
        return rows_forward, rows_backward, chunk_size
    from ..logprobs.triton import rows_backward_triton, rows_forward_triton

    if chunk_size is None and hidden.is_cuda:
        # The Triton rows read the logits in their own dtype and write the gradient in place,
        # so a chunk costs one [chunk, V] buffer: take bigger chunks (fewer, better-shaped
        # matmuls; fewer read-modify-writes of grad_weight).
        n_rows = hidden.numel() // max(hidden.shape[-1], 1)
        chunk_size = default_chunk_rows(n_rows, weight.shape[0], hidden.device, TRITON_CHUNK_ELEMENTS)
    return rows_forward_triton, rows_backward_triton, chunk_size


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

    With a frozen head (``weight`` and ``bias`` need no gradient, ``hidden`` does, no
    entropy: LoRA / adapter fine-tuning) the forward also forms ``d logp / d hidden`` chunk
    by chunk (``[N, H]``, saved instead of ``hidden``) and the backward only scales it: two
    matmuls in all, as many as the full-logits path, instead of three.

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
    fwd, bwd, chunk_size = _row_functions(hidden, weight, chunk_size, targets, bias)
    return fused_linear_logprobs_impl(
        hidden, weight, targets, bias, temperature, chunk_size, return_entropy, fwd, bwd
    )


def fused_linear_pg_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    old_logp: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    ref_logp: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    beta: float = 0.0,
    reduction: str = "token",
    max_len: int | None = None,
    chunk_size: int | None = None,
    return_entropy: bool = False,
    return_logprobs: bool = False,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO / GRPO token loss straight from hidden states and the LM head, in 3 matmuls.

    Equal to ``pg_token_loss(fused_linear_logprobs(hidden, weight, targets, bias,
    temperature), old_logp, advantages, mask, ref_logp, eps_low, eps_high, beta, reduction,
    max_len)`` (same loss, same statistics, same gradients), but the gradients to
    ``hidden``, ``weight`` and ``bias`` are computed chunk by chunk during the forward, where
    the per-token ``d loss / d logp`` is already known; the backward only scales them by the
    upstream scalar gradient. So no chunk's logits are recomputed (three matmuls instead of
    four) and peak extra memory stays ``O(chunk_size x V)``. Only the tokens inside ``mask``
    go through the LM head (the padding of ragged completions costs nothing).
    See :mod:`tdrl.kernels.fused_linear.pg_loss`. On CUDA the softmax rows run in Triton.

    Args:
        hidden: ``[B, T, H]`` final hidden states (the positions that predict ``targets``).
        weight: ``[V, H]`` LM head weight (same dtype as ``hidden``).
        targets: ``[B, T]`` sampled token ids (negative ids: log-prob 0, no gradient).
        old_logp: ``[B, T]`` log-probs under the sampling policy (constants), or ``None``
            for the on-policy single update: the current log-probs, detached (ratio 1, the
            gradient of ``-A * logp``), without computing them in a separate pass.
        advantages: ``[B]`` or ``[B, T]`` advantages (constants).
        mask: ``[B, T]`` bool/float mask of the tokens that count.
        ref_logp: optional ``[B, T]`` reference-model log-probs for the k3 KL term.
        bias: optional ``[V]`` LM head bias.
        temperature: logits are divided by it, > 0.
        eps_low, eps_high: clip range ``[1 - eps_low, 1 + eps_high]`` of the ratio.
        beta: weight of the KL penalty.
        reduction: ``"token"``, ``"sequence"`` or ``"constant"``, as in
            :func:`tdrl.kernels.pg_token_loss`.
        max_len: the constant length of ``"constant"``; defaults to ``T``.
        chunk_size: rows (tokens) per chunk; defaults as in :func:`fused_linear_logprobs`.
        return_entropy: add ``stats["entropy"]``, the mean over the masked tokens (weighted by
            a float mask) of the entropy of the tempered distribution (a diagnostic: no
            gradient flows through it).
        return_logprobs: add ``stats["logp"]``, the detached ``[B, T]`` log-probs (0 off the
            mask), for metrics that need them without a second pass.

    Returns:
        ``(loss, stats)``: a float32 (float64 for float64 ``hidden``) scalar with gradients
        to ``hidden``, ``weight`` and ``bias``, and detached scalars ``clip_frac``, ``kl``,
        ``ratio_mean`` (as :func:`tdrl.kernels.pg_token_loss`), plus ``entropy`` / ``logp``
        when requested.
    """
    fwd, bwd, chunk_size = _row_functions(
        hidden, weight, chunk_size, targets, bias, old_logp, advantages, mask, ref_logp
    )
    return fused_linear_pg_loss_impl(
        hidden, weight, targets, old_logp, advantages, mask, ref_logp, bias, temperature,
        eps_low, eps_high, beta, reduction, max_len, chunk_size, return_entropy, return_logprobs,
        fwd, bwd,
    )


def fused_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    bias: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    temperature: float = 1.0,
    reduction: str = "mean",
    chunk_size: int | None = None,
) -> torch.Tensor:
    """Masked next-token cross-entropy (the SFT loss) straight from hidden states and the LM
    head, in 3 matmuls and ``O(chunk_size x V)`` extra memory.

    Equal to ``F.cross_entropy(hidden @ weight.T + bias, targets, ignore_index=-100)`` (mean
    over the non-ignored tokens) and, with ``mask``, to ``-sum(mask * logp) / sum(mask)``
    where ``logp = fused_linear_logprobs(hidden, weight, targets, bias, temperature)``; the
    gradients to ``hidden``, ``weight`` and ``bias`` are computed chunk by chunk during the
    forward, where ``d loss / d logp`` is already known, so no chunk's logits are recomputed
    (two matmuls with a frozen head). Tokens with weight 0 (masked out or a negative target)
    do not go through the LM head. See :mod:`tdrl.kernels.fused_linear.cross_entropy`.

    Args:
        hidden: ``[..., H]`` hidden states (the positions that predict ``targets``).
        weight: ``[V, H]`` LM head weight (same dtype as ``hidden``).
        targets: ``[...]`` token ids; negative ids (``-100``) are ignored.
        bias: optional ``[V]`` LM head bias.
        mask: optional ``[...]`` bool or non-negative float weights of the tokens.
        temperature: logits are divided by it, > 0.
        reduction: ``"mean"`` (divide by the total weight; 0 when it is 0) or ``"sum"``.
        chunk_size: rows (tokens) per chunk; defaults as in :func:`fused_linear_logprobs`.

    Returns:
        A float32 (float64 for float64 ``hidden``) scalar with gradients to ``hidden``,
        ``weight`` and ``bias``; one backward per forward.
    """
    fwd, bwd, chunk_size = _row_functions(hidden, weight, chunk_size, targets, bias, mask)
    return fused_linear_cross_entropy_impl(
        hidden, weight, targets, bias, mask, temperature, reduction, chunk_size, fwd, bwd
    )


fused_linear_logprobs_reference = torch_reference(fused_linear_logprobs)
fused_linear_pg_loss_reference = torch_reference(fused_linear_pg_loss)
fused_linear_cross_entropy_reference = torch_reference(fused_linear_cross_entropy)
