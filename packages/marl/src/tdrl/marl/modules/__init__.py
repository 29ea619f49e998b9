"""Multi-agent networks: the batched multi-agent MLP and GRU, and value-decomposition mixers."""

from __future__ import annotations

from .mixers import QMixer, VDNMixer
from .multiagent_mlp import MultiAgentMLP
from .recurrent import MultiAgentGRU

__all__ = ["MultiAgentMLP", "MultiAgentGRU", "QMixer", "VDNMixer"]
