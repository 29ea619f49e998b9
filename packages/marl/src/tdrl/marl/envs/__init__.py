"""Multi-agent environments: VMAS and PettingZoo as tdrl ``EnvBase`` subclasses."""

from __future__ import annotations

from ._groups import group_agents
from .pettingzoo import PettingZooEnv, pettingzoo_tasks
from .vmas import VmasEnv, vmas_scenarios

__all__ = ["PettingZooEnv", "pettingzoo_tasks", "VmasEnv", "vmas_scenarios", "group_agents"]
