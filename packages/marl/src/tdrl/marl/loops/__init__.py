"""The multi-agent training loops: :func:`train_on_policy` (MAPPO, IPPO) and
:func:`train_off_policy` (QMIX, VDN, MADDPG, IDDPG, MASAC, ISAC, IQL), on what they share (:mod:`.common`),
and their checkpoints (:mod:`.restore`: resume, evaluate-only, render)."""

from __future__ import annotations

from .common import (EpisodeReturns, GroupPolicies, TrainConfig, collect, evaluate, evaluate_groups,
                     evaluate_per_env, with_episode_returns)
from .off_policy import off_policy_optimizer, off_policy_update, train_off_policy
from .on_policy import on_policy_optimizer, on_policy_update, train_on_policy
from .restore import load_parts, render_episode, resume_training, save_training, training_objects

__all__ = ["TrainConfig", "collect", "with_episode_returns", "EpisodeReturns", "evaluate", "evaluate_per_env",
           "evaluate_groups", "GroupPolicies", "on_policy_optimizer", "on_policy_update", "train_on_policy",
           "off_policy_optimizer", "off_policy_update", "train_off_policy", "training_objects", "save_training",
           "resume_training", "load_parts", "render_episode"]
