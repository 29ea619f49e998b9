"""Reverse discounted scans over time: discounted cumulative sum and GAE."""

from __future__ import annotations

from .api import discounted_cumsum, discounted_cumsum_reference, gae, gae_reference

__all__ = ["discounted_cumsum", "discounted_cumsum_reference", "gae", "gae_reference"]
