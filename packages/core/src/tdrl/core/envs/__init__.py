"""Environments: ``EnvBase`` and its implementations (Gymnasium, batched torch, multi-process)."""

from __future__ import annotations

from .common import EnvBase, make_done_spec, step_mdp
from .gym import GymEnv, GymWrapper, gym_space_to_spec
from .pendulum import PendulumEnv

__all__ = [
    "EnvBase",
    "GymEnv",
    "GymWrapper",
    "PendulumEnv",
    "gym_space_to_spec",
    "make_done_spec",
    "step_mdp",
]
