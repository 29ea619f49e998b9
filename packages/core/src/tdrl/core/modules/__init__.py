"""Networks, actors, critics, distributions, exploration, recurrent and world-model modules."""

from __future__ import annotations

from tdrl.core.modules.actors import (
    Actor,
    DuelingHead,
    NormalParamExtractor,
    ProbabilisticActor,
    QValueActor,
    QValueModule,
    RandomPolicy,
    ValueOperator,
)
from tdrl.core.modules.decision_transformer import DecisionTransformer, DecisionTransformerPolicy
from tdrl.core.modules.distributions import (
    IndependentNormal,
    MaskedCategorical,
    OneHotCategorical,
    TanhNormal,
)
from tdrl.core.modules.exploration import (
    AdditiveGaussianModule,
    EGreedyModule,
    ExplorationType,
    OrnsteinUhlenbeckModule,
    set_exploration_type,
)
from tdrl.core.modules.models import MLP, ConvNet
from tdrl.core.modules.recurrent import GRUModule, LSTMModule, rnn_layers
from tdrl.core.modules.world_model import (
    RSSM,
    DreamerActor,
    ReturnNormalizer,
    TwoHot,
    straight_through_sample,
    symexp,
    symlog,
    unimix_logits,
)

OrnsteinUhlenbeckProcessModule = OrnsteinUhlenbeckModule
"""TorchRL's name: the same class."""

__all__ = [
    "MLP",
    "ConvNet",
    "Actor",
    "ProbabilisticActor",
    "ValueOperator",
    "QValueModule",
    "QValueActor",
    "RandomPolicy",
    "DuelingHead",
    "NormalParamExtractor",
    "IndependentNormal",
    "TanhNormal",
    "MaskedCategorical",
    "OneHotCategorical",
    "EGreedyModule",
    "AdditiveGaussianModule",
    "OrnsteinUhlenbeckModule",
    "ExplorationType",
    "set_exploration_type",
    "OrnsteinUhlenbeckProcessModule",
    "GRUModule",
    "LSTMModule",
    "rnn_layers",
    "RSSM",
    "DreamerActor",
    "ReturnNormalizer",
    "TwoHot",
    "straight_through_sample",
    "symexp",
    "symlog",
    "unimix_logits",
    "DecisionTransformer",
    "DecisionTransformerPolicy",
]
