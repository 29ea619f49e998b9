"""Losses (one file each) and target-network updaters.

A loss returns a TensorDict: its ``loss_*`` entries are summed for the gradient
(:func:`total_loss`), the other entries are detached diagnostics.
"""

from __future__ import annotations

from tdrl.core.objectives.a2c import A2CLoss
from tdrl.core.objectives.bc import BCKeys, BCLoss, GaussianBCLoss
from tdrl.core.objectives.common import DISTANCE_KINDS, BootstrapKeys, LossModule, distance_loss, group_optimizers, make_target, total_loss
from tdrl.core.objectives.cql import CQLLoss
from tdrl.core.objectives.ddpg import DDPGLoss, QKeys
from tdrl.core.objectives.discrete_sac import DiscreteSACLoss
from tdrl.core.objectives.dreamer import DreamerConfig, DreamerV3, kl_balance
from tdrl.core.objectives.dqn import DQNKeys, DQNLoss
from tdrl.core.objectives.dt import DTKeys, DTLoss, returns_to_go, sample_windows
from tdrl.core.objectives.iql import IQLLoss
from tdrl.core.objectives.ppo import PPOKeys, PPOLoss
from tdrl.core.objectives.redq import REDQLoss
from tdrl.core.objectives.sac import EntropyTemperature, SACLoss
from tdrl.core.objectives.targets import HardUpdate, SoftUpdate
from tdrl.core.objectives.td3 import TD3Loss
from tdrl.core.objectives.td3_bc import TD3BCLoss

ClipPPOLoss = PPOLoss
"""TorchRL's name of the clipped PPO loss: the same class."""

__all__ = [
    "LossModule",
    "BootstrapKeys",
    "DISTANCE_KINDS",
    "distance_loss",
    "group_optimizers",
    "total_loss",
    "make_target",
    "PPOLoss",
    "ClipPPOLoss",
    "PPOKeys",
    "A2CLoss",
    "DQNLoss",
    "DreamerV3",
    "DreamerConfig",
    "kl_balance",
    "DQNKeys",
    "DDPGLoss",
    "TD3Loss",
    "SACLoss",
    "REDQLoss",
    "DiscreteSACLoss",
    "EntropyTemperature",
    "IQLLoss",
    "CQLLoss",
    "BCLoss",
    "GaussianBCLoss",
    "BCKeys",
    "TD3BCLoss",
    "DTLoss",
    "DTKeys",
    "returns_to_go",
    "sample_windows",
    "QKeys",
    "SoftUpdate",
    "HardUpdate",
]
