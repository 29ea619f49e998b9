"""Transforms: rewrite what an environment returns (and takes), and its specs.

Wrap an env with ``TransformedEnv(env, Compose(...))``. One file per family: ``base``
(Transform, Compose), ``env`` (TransformedEnv), ``norm`` (ObservationNorm, VecNorm,
RewardScaling), ``episode`` (RewardSum, StepCounter, InitTracker), ``tensors``
(DTypeCastTransform, DoubleToFloat, CatTensors, CatFrames), ``action`` (ActionScaling), ``keys``
(RenameTransform, ExcludeTransform, SelectTransform, TensorDictPrimer), ``values``
(ClipTransform, RewardClipping, SignTransform, UnsqueezeTransform, FlattenObservation),
``returns`` (TargetReturn, Reward2GoTransform), ``steps`` (FrameSkipTransform, NoopResetEnv,
ActionMask), ``multistep`` (MultiStepTransform, a replay buffer's), ``delta``
(NextObservationDelta: next observations stored as low-precision deltas), ``pixels`` (ToTensorImage, Resize, GrayScale, CenterCrop); ``TrajCounter`` is
in ``episode``.
"""

from __future__ import annotations

from .action import ActionDiscretizer, ActionScaling, FlattenAction
from .base import Compose, Transform
from .delta import NextObservationDelta
from .env import TransformedEnv
from .episode import InitTracker, RewardSum, StepCounter, TrajCounter
from .multistep import MultiStepTransform
from .keys import ExcludeTransform, RenameTransform, SelectTransform, TensorDictPrimer
from .norm import ObservationNorm, RewardScaling, VecNorm
from .pixels import CenterCrop, Crop, GrayScale, Resize, ToTensorImage, VideoRecorder
from .returns import Reward2GoTransform, TargetReturn
from .steps import ActionMask, FrameSkipTransform, NoopResetEnv
from .tensors import CatFrames, CatTensors, DoubleToFloat, DTypeCastTransform, TimeMaxPool
from .values import (
    BinarizeReward,
    LineariseRewards,
    ClipTransform,
    FlattenObservation,
    PermuteTransform,
    RewardClipping,
    SignTransform,
    SqueezeTransform,
    UnsqueezeTransform,
)

__all__ = [
    "ActionMask",
    "ActionScaling",
    "CatFrames",
    "CatTensors",
    "CenterCrop",
    "ClipTransform",
    "Compose",
    "DoubleToFloat",
    "DTypeCastTransform",
    "ExcludeTransform",
    "FlattenObservation",
    "FrameSkipTransform",
    "GrayScale",
    "InitTracker",
    "NoopResetEnv",
    "ObservationNorm",
    "RenameTransform",
    "Resize",
    "Reward2GoTransform",
    "RewardClipping",
    "RewardScaling",
    "RewardSum",
    "SelectTransform",
    "SignTransform",
    "StepCounter",
    "TargetReturn",
    "TensorDictPrimer",
    "ToTensorImage",
    "VideoRecorder",
    "Crop",
    "TrajCounter",
    "Transform",
    "TransformedEnv",
    "UnsqueezeTransform",
    "SqueezeTransform",
    "PermuteTransform",
    "BinarizeReward",
    "LineariseRewards",
    "ActionDiscretizer",
    "FlattenAction",
    "TimeMaxPool",
    "MultiStepTransform",
    "NextObservationDelta",
    "VecNorm",
]
