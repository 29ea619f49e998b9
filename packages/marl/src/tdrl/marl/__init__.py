"""tdrl.marl: multi-agent RL on VMAS and PettingZoo (MAPPO, IPPO, QMIX, VDN, MADDPG, IDDPG, MASAC, ISAC, IQL)."""

from __future__ import annotations

from tdrl.kernels._dist import installed_version as _installed_version

from tdrl.marl.envs import VmasEnv, group_agents, vmas_scenarios
from tdrl.marl.modules import MultiAgentGRU, MultiAgentLSTM, MultiAgentMLP, QMixer, VDNMixer
from tdrl.marl.objectives import (
    AgentLoss, IDDPGConfig, IQLConfig, ISACConfig, MADDPGConfig, MASACConfig, IPPOConfig, IPPOLoss, MAPPOConfig, MAPPOLoss, MultiAgentGAE, PopArt, QMIXConfig, QMIXLoss,
    ValueNorm, VDNConfig, VDNLoss, multi_agent_gae,
)
from tdrl.marl.algorithms import (
    ALGORITHMS, make_groups, make_iddpg, make_ippo, make_iql, make_isac, make_maddpg, make_mappo, make_masac, make_qmix,
    make_vdn,
)
from tdrl.marl.loops import GroupPolicies, TrainConfig, evaluate, train_off_policy, train_on_policy
from tdrl.marl.vectorised import SeedStackedModule, make_vectorised_groups, make_vectorised_on_policy
from tdrl.marl.envs import PettingZooEnv, pettingzoo_tasks
from tdrl.marl.runner import TASKS, BenchConfig, BenchmarkFailed, run_benchmark
from tdrl.marl.checks import TeamRewardCheck, ZeroTeamRewardError
from tdrl.marl.tasks import BENCHMARL_PETTINGZOO_TASKS, BENCHMARL_VMAS_TASKS, make_task_env, resolve_task, task_spec

__version__ = _installed_version("tdrl-marl")  # the version in this package's pyproject.toml

__all__: list[str] = [
    "__version__",
    "VmasEnv",
    "vmas_scenarios",
    "group_agents",
    "MultiAgentMLP",
    "MultiAgentGRU",
    "MultiAgentLSTM",
    "QMixer",
    "VDNMixer",
    "MAPPOConfig",
    "IPPOConfig",
    "QMIXConfig",
    "VDNConfig",
    "MAPPOLoss",
    "IPPOLoss",
    "QMIXLoss",
    "VDNLoss",
    "MultiAgentGAE",
    "multi_agent_gae",
    "ValueNorm",
    "PopArt",
    "ALGORITHMS",
    "make_mappo",
    "make_ippo",
    "make_qmix",
    "make_vdn",
    "make_groups",
    "make_maddpg",
    "make_iddpg",
    "make_masac",
    "make_isac",
    "make_iql",
    "MADDPGConfig",
    "IDDPGConfig",
    "MASACConfig",
    "ISACConfig",
    "IQLConfig",
    "AgentLoss",
    "GroupPolicies",
    "TrainConfig",
    "train_on_policy",
    "train_off_policy",
    "evaluate",
    "SeedStackedModule",
    "make_vectorised_on_policy",
    "make_vectorised_groups",
    "PettingZooEnv",
    "pettingzoo_tasks",
    "TASKS",
    "BenchConfig",
    "run_benchmark",
    "BenchmarkFailed",
    "BENCHMARL_VMAS_TASKS",
    "BENCHMARL_PETTINGZOO_TASKS",
    "task_spec",
    "resolve_task",
    "make_task_env",
    "TeamRewardCheck",
    "ZeroTeamRewardError",
]
