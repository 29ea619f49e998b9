"""tdrl.core."""

from __future__ import annotations

from tdrl.kernels._dist import installed_version as _installed_version

from .envs import (
    EnvBase,
    EnvCreator,
    GymEnv,
    GymWrapper,
    ParallelEnv,
    PendulumEnv,
    SerialEnv,
    WorkerError,
    check_env_specs,
    step_mdp,
)
from .specs import Binary, Bounded, Categorical, Composite, MultiCategorical, MultiOneHot, OneHot, Unbounded
from .transforms import (
    ActionScaling,
    CatFrames,
    CatTensors,
    Compose,
    DoubleToFloat,
    DTypeCastTransform,
    InitTracker,
    ObservationNorm,
    RewardScaling,
    RewardSum,
    StepCounter,
    Transform,
    TransformedEnv,
    VecNorm,
    ActionMask,
    CenterCrop,
    ClipTransform,
    ExcludeTransform,
    FlattenObservation,
    FrameSkipTransform,
    GrayScale,
    NoopResetEnv,
    RenameTransform,
    Resize,
    Reward2GoTransform,
    RewardClipping,
    SelectTransform,
    SignTransform,
    TargetReturn,
    TensorDictPrimer,
    ToTensorImage,
    TrajCounter,
    UnsqueezeTransform,
    NextObservationDelta,
)

__version__ = _installed_version("tdrl-core")  # the version in this package's pyproject.toml

__all__: list[str] = [
    "__version__",
    # specs
    "Binary", "Bounded", "Categorical", "Composite", "MultiCategorical", "MultiOneHot", "OneHot", "Unbounded",
    # envs
    "EnvBase", "EnvCreator", "GymEnv", "GymWrapper", "ParallelEnv", "PendulumEnv", "SerialEnv", "WorkerError",
    "check_env_specs", "step_mdp",
    # transforms
    "ActionScaling", "CatFrames", "CatTensors", "Compose", "DoubleToFloat", "DTypeCastTransform",
    "InitTracker", "ObservationNorm", "RewardScaling", "RewardSum", "StepCounter", "Transform",
    "TransformedEnv", "VecNorm",
    "ActionMask", "CenterCrop", "ClipTransform", "ExcludeTransform", "FlattenObservation", "FrameSkipTransform", "GrayScale", "NoopResetEnv", "RenameTransform", "Resize", "Reward2GoTransform", "RewardClipping", "SelectTransform", "SignTransform", "TargetReturn", "TensorDictPrimer", "ToTensorImage", "TrajCounter", "UnsqueezeTransform",
    "NextObservationDelta",
]
