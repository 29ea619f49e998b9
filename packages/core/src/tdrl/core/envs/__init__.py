"""Environments: ``EnvBase`` and its implementations (Gymnasium, DeepMind Control, EnvPool,
batched torch, multi-process)."""

from __future__ import annotations

from .check import check_env_specs
from .common import EnvBase, make_done_spec, step_mdp
from .gym import GymEnv, GymWrapper, gym_space_to_spec
from .gym_backend import set_gym_backend
from .batched import SerialEnv
from .parallel import ParallelEnv, WorkerError
from .pendulum import PendulumEnv
from .dm_control import DMControlEnv, parse_dmc_id
from .factory import TORCH_ENVS, EnvCreator, action_kind, env_rng_state, make_env
from .envpool import EnvPoolEnv

__all__ = [
    "make_env",
    "set_gym_backend",
    "EnvCreator",
    "action_kind",
    "env_rng_state",
    "TORCH_ENVS",
    "EnvBase",
    "DMControlEnv",
    "EnvPoolEnv",
    "GymEnv",
    "GymWrapper",
    "ParallelEnv",
    "PendulumEnv",
    "SerialEnv",
    "WorkerError",
    "check_env_specs",
    "gym_space_to_spec",
    "parse_dmc_id",
    "make_done_spec",
    "step_mdp",
]
