"""tdrl.core."""

from __future__ import annotations

from .envs import (
    EnvBase,
    GymEnv,
    GymWrapper,
    ParallelEnv,
    PendulumEnv,
    SerialEnv,
    WorkerError,
    check_env_specs,
    step_mdp,
)
from .specs import Binary, Bounded, Categorical, Composite, MultiCategorical, OneHot, Unbounded
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
)

__all__: list[str] = [
    # specs
    "Binary", "Bounded", "Categorical", "Composite", "MultiCategorical", "OneHot", "Unbounded",
    # envs
    "EnvBase", "GymEnv", "GymWrapper", "ParallelEnv", "PendulumEnv", "SerialEnv", "WorkerError",
    "check_env_specs", "step_mdp",
    # transforms
    "ActionScaling", "CatFrames", "CatTensors", "Compose", "DoubleToFloat", "DTypeCastTransform",
    "InitTracker", "ObservationNorm", "RewardScaling", "RewardSum", "StepCounter", "Transform",
    "TransformedEnv", "VecNorm",
]
