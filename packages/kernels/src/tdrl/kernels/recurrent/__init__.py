"""GRU / LSTM sequences over ``[N, T]`` with ``is_init`` resets (Triton, fused torch, reference)."""

from __future__ import annotations

from .api import gru_sequence, lstm_sequence
from .reference import gru_reference, lstm_reference

__all__ = ["gru_reference", "gru_sequence", "lstm_reference", "lstm_sequence"]
