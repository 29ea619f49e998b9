"""GRU / LSTM sequences over ``[N, T]`` with ``is_init`` resets (Triton, CPU, fused torch, reference)."""

from __future__ import annotations

from .api import gru_sequence, lstm_sequence
from .cpu import clear_workspaces
from .reference import gru_reference, lstm_reference

__all__ = ["clear_workspaces", "gru_reference", "gru_sequence", "lstm_reference", "lstm_sequence"]
