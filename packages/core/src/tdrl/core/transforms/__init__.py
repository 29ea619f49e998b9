"""Transforms: rewrite what an environment returns (and takes), and its specs.

Wrap an env with ``TransformedEnv(env, Compose(...))``. One file per family: ``base``
(Transform, Compose), ``env`` (TransformedEnv), ``norm`` (ObservationNorm, VecNorm,
RewardScaling), ``episode`` (RewardSum, StepCounter, InitTracker), ``tensors``
(DTypeCastTransform, DoubleToFloat, CatTensors, CatFrames), ``action`` (ActionScaling).
"""

from __future__ import annotations

from .action import ActionScaling
from .base import Compose, Transform
from .env import TransformedEnv
from .episode import InitTracker, RewardSum, StepCounter
from .norm import ObservationNorm, RewardScaling, VecNorm
from .tensors import CatFrames, CatTensors, DoubleToFloat, DTypeCastTransform

__all__ = [
    "ActionScaling",
    "CatFrames",
    "CatTensors",
    "Compose",
    "DTypeCastTransform",
    "DoubleToFloat",
    "InitTracker",
    "ObservationNorm",
    "RewardScaling",
    "RewardSum",
    "StepCounter",
    "Transform",
    "TransformedEnv",
    "VecNorm",
]
