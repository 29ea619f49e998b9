"""Multi-agent networks: the batched multi-agent MLP, GRU and LSTM, and value-decomposition mixers."""

from __future__ import annotations

from .mixers import QMixer, VDNMixer
from .multiagent_mlp import MultiAgentMLP
from .recurrent import AgentRecurrentNet, MultiAgentGRU, MultiAgentLSTM, recurrent_layers, recurrent_view

__all__ = ["MultiAgentMLP", "AgentRecurrentNet", "MultiAgentGRU", "MultiAgentLSTM", "QMixer", "VDNMixer", "recurrent_layers", "recurrent_view"]
