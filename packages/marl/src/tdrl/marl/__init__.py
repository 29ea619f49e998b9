"""tdrl.marl: multi-agent RL on VMAS and PettingZoo (MAPPO, IPPO, QMIX, VDN)."""

from __future__ import annotations

from tdrl.marl.envs import VmasEnv, group_agents, vmas_scenarios
from tdrl.marl.modules import MultiAgentMLP, QMixer, VDNMixer

__all__: list[str] = [
    "VmasEnv",
    "vmas_scenarios",
    "group_agents",
    "MultiAgentMLP",
    "QMixer",
    "VDNMixer",
]
