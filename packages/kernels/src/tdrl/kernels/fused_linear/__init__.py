"""Chunked fused LM head + token log-probs with O(chunk x V) memory."""

from __future__ import annotations

from .api import (
    fused_linear_cross_entropy,
    fused_linear_cross_entropy_reference,
    fused_linear_logprobs,
    fused_linear_logprobs_reference,
    fused_linear_pg_loss,
    fused_linear_pg_loss_reference,
)

__all__ = [
    "fused_linear_cross_entropy",
    "fused_linear_cross_entropy_reference",
    "fused_linear_logprobs",
    "fused_linear_logprobs_reference",
    "fused_linear_pg_loss",
    "fused_linear_pg_loss_reference",
]
