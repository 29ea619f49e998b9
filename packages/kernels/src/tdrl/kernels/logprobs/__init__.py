"""Token log-probs and entropy from logits without a full log-softmax."""

from __future__ import annotations

from .api import token_logprobs, token_logprobs_reference

__all__ = ["token_logprobs", "token_logprobs_reference"]
