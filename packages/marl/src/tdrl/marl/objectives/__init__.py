"""Multi-agent losses (MAPPO, IPPO, QMIX, VDN; MADDPG, IDDPG, MASAC, ISAC, IQL on core's losses), the multi-agent advantage and value norms."""

from __future__ import annotations

from .agent_losses import (
    AgentLoss, DDPGConfig, IDDPGConfig, IQLConfig, ISACConfig, MADDPGConfig, MASACConfig, SACConfig, agent_view,
)
from .advantage import MultiAgentGAE, expand_over_agents, multi_agent_gae
from .ppo import IPPOConfig, IPPOLoss, MAPPOConfig, MAPPOLoss, MultiAgentPPOKeys, masked_mean
from .qmix import QMIXConfig, QMIXLoss, ValueDecompositionKeys, VDNConfig, VDNLoss
from .value_norm import PopArt, ValueNorm

__all__ = [
    "MultiAgentGAE",
    "multi_agent_gae",
    "expand_over_agents",
    "MAPPOConfig",
    "IPPOConfig",
    "MAPPOLoss",
    "IPPOLoss",
    "MultiAgentPPOKeys",
    "masked_mean",
    "QMIXConfig",
    "VDNConfig",
    "QMIXLoss",
    "VDNLoss",
    "ValueDecompositionKeys",
    "ValueNorm",
    "AgentLoss",
    "agent_view",
    "DDPGConfig",
    "MADDPGConfig",
    "IDDPGConfig",
    "SACConfig",
    "MASACConfig",
    "ISACConfig",
    "IQLConfig",
    "PopArt",
]
