"""Value estimators: pure functions over ``[..., T, 1]`` and modules reading keys."""

from __future__ import annotations

from tdrl.core.values.estimators import GAE, TD0, AdvantageKeys, TDLambda, ValueEstimatorBase, ValueKeys, VTrace
from tdrl.core.values.functional import (
    discounted_cumsum,
    gae,
    kernels_available,
    td0_advantage,
    td0_return,
    td_lambda_return,
    vtrace,
)

TD0Estimator = TD0
"""TorchRL's name: the same class."""
TDLambdaEstimator = TDLambda
"""TorchRL's name: the same class."""

__all__ = [
    "GAE",
    "TD0",
    "TD0Estimator",
    "TDLambdaEstimator",
    "TDLambda",
    "VTrace",
    "ValueEstimatorBase",
    "AdvantageKeys",
    "ValueKeys",
    "discounted_cumsum",
    "gae",
    "kernels_available",
    "td0_advantage",
    "td0_return",
    "td_lambda_return",
    "vtrace",
]
