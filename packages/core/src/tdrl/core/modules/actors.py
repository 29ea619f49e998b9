"""TensorDict actors and critics built on ``tensordict.nn``.

* :class:`Actor` -- deterministic ``observation -> action`` (DDPG/TD3).
* :class:`ProbabilisticActor` -- a params module followed by a distribution
  (``ProbabilisticTensorDictSequential``); samples under ``InteractionType.RANDOM``,
  uses the distribution's ``deterministic_sample`` under ``DETERMINISTIC``.
* :class:`ValueOperator` -- ``V(s)`` or ``Q(s, a)`` head.
* :class:`QValueModule`, :class:`DuelingHead`, :class:`QValueActor` -- discrete Q-learning.
"""

from __future__ import annotations

from typing import Sequence

import torch
from tensordict import TensorDictBase
from tensordict.nn import (
    InteractionType,
    NormalParamExtractor,
    ProbabilisticTensorDictModule,
    ProbabilisticTensorDictSequential,
    TensorDictModule,
    TensorDictModuleBase,
    TensorDictSequential,
)
from torch import Tensor, nn

from tdrl.core import keys as K
from tdrl.core.values._utils import NestedKey, require

__all__ = [
    "Actor",
    "ProbabilisticActor",
    "ValueOperator",
    "QValueModule",
    "DuelingHead",
    "QValueActor",
    "NormalParamExtractor",
]


class Actor(TensorDictModule):
    """Deterministic actor: ``module(*in_keys) -> action``.

    Args:
        module: network mapping observations to actions (e.g. an ``MLP`` ending in ``Tanh``).
        in_keys: default ``["observation"]``. out_keys: default ``["action"]``.
    """

    def __init__(
        self,
        module: nn.Module,
        in_keys: Sequence[NestedKey] = (K.OBSERVATION,),
        out_keys: Sequence[NestedKey] = (K.ACTION,),
    ) -> None:
        super().__init__(module, in_keys=list(in_keys), out_keys=list(out_keys))


class ProbabilisticActor(ProbabilisticTensorDictSequential):
    """Stochastic policy: ``params_module`` writes the distribution parameters, then an
    action is drawn and (by default) its log-prob written to ``"action_log_prob"``.

    Args:
        params_module: a ``TensorDictModule`` writing the distribution's parameter keys.
        distribution_class: e.g. :class:`TanhNormal`, :class:`IndependentNormal`,
            :class:`MaskedCategorical`.
        in_keys: parameter keys, a list (``["loc", "scale"]``) or a dict mapping the
            distribution's argument names to keys (``{"logits": "logits", "mask":
            "action_mask"}``).
        distribution_kwargs: constant keyword arguments (e.g. ``{"low": -2, "high": 2}``).
        out_keys: default ``["action"]``.
        return_log_prob: write ``action_log_prob`` (needed by PPO/A2C).
        default_interaction_type: used when no ``set_interaction_type`` is active.

    Example:
        >>> net = TensorDictModule(nn.Sequential(MLP(3, 2), NormalParamExtractor()),
        ...                        in_keys=["observation"], out_keys=["loc", "scale"])
        >>> actor = ProbabilisticActor(net, TanhNormal, distribution_kwargs={"low": -2., "high": 2.})
    """

    def __init__(
        self,
        params_module: TensorDictModuleBase,
        distribution_class: type,
        in_keys: Sequence[NestedKey] | dict[str, NestedKey] = (K.LOC, K.SCALE),
        distribution_kwargs: dict | None = None,
        out_keys: Sequence[NestedKey] = (K.ACTION,),
        return_log_prob: bool = True,
        default_interaction_type: InteractionType = InteractionType.RANDOM,
    ) -> None:
        dist_module = ProbabilisticTensorDictModule(
            in_keys=dict(in_keys) if isinstance(in_keys, dict) else list(in_keys),
            out_keys=list(out_keys),
            distribution_class=distribution_class,
            distribution_kwargs=distribution_kwargs or {},
            return_log_prob=return_log_prob,
            default_interaction_type=default_interaction_type,
        )
        super().__init__(params_module, dist_module)


class ValueOperator(TensorDictModule):
    """Critic head: ``V(s)`` (``out_keys=["state_value"]``, the default) or ``Q(s, a)``
    (``in_keys=["observation", "action"], out_keys=["state_action_value"]``). Several
    in_keys are passed as separate arguments (an :class:`MLP` concatenates them).
    """

    def __init__(
        self,
        module: nn.Module,
        in_keys: Sequence[NestedKey] = (K.OBSERVATION,),
        out_keys: Sequence[NestedKey] = (K.STATE_VALUE,),
    ) -> None:
        super().__init__(module, in_keys=list(in_keys), out_keys=list(out_keys))


class DuelingHead(nn.Module):
    """Dueling Q head (Wang et al., 2016, arXiv:1511.06581):
    ``Q = V + A - mean_a A`` from shared features.

    Args:
        in_features: feature size. n_actions: number of actions.
        num_cells: hidden sizes of the value and advantage streams.
        activation: activation class.

    Shapes: ``[*B, in_features]`` -> ``[*B, n_actions]``.
    """

    def __init__(
        self,
        in_features: int,
        n_actions: int,
        num_cells: Sequence[int] = (64,),
        activation: type[nn.Module] = nn.ReLU,
    ) -> None:
        super().__init__()
        from tdrl.core.modules.models import MLP

        self.value = MLP(in_features, 1, num_cells, activation)
        self.advantage = MLP(in_features, n_actions, num_cells, activation)

    def forward(self, features: Tensor) -> Tensor:
        adv = self.advantage(features)
        return self.value(features) + adv - adv.mean(-1, keepdim=True)


class QValueModule(TensorDictModuleBase):
    """Greedy action from ``action_value`` ``[*B, n]``: writes ``action`` (int64 ``[*B]``,
    or one-hot ``[*B, n]`` with ``one_hot=True``) and ``chosen_action_value`` ``[*B, 1]``.
    An optional ``action_mask`` key (``[*B, n]`` bool) excludes disallowed actions.
    """

    def __init__(
        self,
        action_value_key: NestedKey = K.ACTION_VALUE,
        action_key: NestedKey = K.ACTION,
        chosen_action_value_key: NestedKey = "chosen_action_value",
        action_mask_key: NestedKey | None = None,
        one_hot: bool = False,
    ) -> None:
        super().__init__()
        self.in_keys = [action_value_key] + ([action_mask_key] if action_mask_key else [])
        self.out_keys = [action_key, chosen_action_value_key]
        self.action_value_key, self.action_key = action_value_key, action_key
        self.chosen_key, self.mask_key = chosen_action_value_key, action_mask_key
        self.one_hot = one_hot

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        q = require(td, self.action_value_key, type(self).__name__)
        if self.mask_key is not None:
            mask = require(td, self.mask_key, type(self).__name__)
            q = q.masked_fill(~mask.bool(), torch.finfo(q.dtype).min)
        index = q.argmax(-1)
        chosen = q.gather(-1, index.unsqueeze(-1))
        action = (
            nn.functional.one_hot(index, q.shape[-1]).to(q.dtype) if self.one_hot else index
        )
        td.set(self.action_key, action)
        td.set(self.chosen_key, chosen)
        return td


class QValueActor(TensorDictSequential):
    """``observation -> action_value -> greedy action``.

    Args:
        module: network ``[*B, obs] -> [*B, n_actions]`` (use a :class:`DuelingHead` at the
            end for a dueling DQN).
        in_keys: default ``["observation"]``.
        action_mask_key: optional mask key; one_hot: write one-hot actions.
    """

    def __init__(
        self,
        module: nn.Module,
        in_keys: Sequence[NestedKey] = (K.OBSERVATION,),
        action_mask_key: NestedKey | None = None,
        one_hot: bool = False,
    ) -> None:
        net = TensorDictModule(module, in_keys=list(in_keys), out_keys=[K.ACTION_VALUE])
        super().__init__(net, QValueModule(action_mask_key=action_mask_key, one_hot=one_hot))
