"""The PPO / GRPO clipped token loss with k3 KL and masked reductions."""

from __future__ import annotations

from .api import pg_token_loss
from .reference import pg_token_loss_reference

__all__ = ["pg_token_loss", "pg_token_loss_reference"]
