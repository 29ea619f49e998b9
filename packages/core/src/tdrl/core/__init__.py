"""tdrl.core."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _dist_version

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

try:  # the version lives in packages/core/pyproject.toml; the installed metadata carries it
    __version__ = _dist_version("tdrl-core")
except PackageNotFoundError:  # imported from the source tree without an install
    __version__ = "0+unknown"

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
