"""Multi-agent networks: the batched multi-agent MLP and value-decomposition mixers."""

from __future__ import annotations

from .mixers import QMixer, VDNMixer
from .multiagent_mlp import MultiAgentMLP

__all__ = ["MultiAgentMLP", "QMixer", "VDNMixer"]
