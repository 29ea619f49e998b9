"""Soft actor-critic for discrete actions (Christodoulou, 2019, arXiv:1910.07207):
expectations over actions are exact sums over the policy's probabilities."""

from __future__ import annotations

import math

import torch
from tensordict import TensorDict, TensorDictBase
from torch import Tensor

from tdrl.core.objectives._nets import get_dist, run_module
from tdrl.core.objectives.common import LossModule, check_distance
from tdrl.core.objectives.ddpg import QKeys
from tdrl.core.objectives.dqn import gather_action_value
from tdrl.core.objectives.sac import EntropyTemperature
from tdrl.core.torchrl_names import accept_torchrl_names

__all__ = ["DiscreteSACLoss"]


def _probs_logp(dist) -> tuple[Tensor, Tensor]:
    logits = getattr(dist, "logits", None)
    if logits is None:
        raise TypeError(
            f"DiscreteSACLoss needs a categorical distribution with .logits, got "
            f"{type(dist).__name__}."
        )
    logp = torch.log_softmax(logits, -1)
    # masked actions have probability 0; keep their log-prob finite so 0 * logp == 0
    return logp.exp(), logp.clamp_min(-1e6)


@accept_torchrl_names
class DiscreteSACLoss(LossModule):
    """Discrete SAC with clipped double-Q and automatic entropy tuning.

    Args:
        actor: probabilistic actor over ``n`` actions (``MaskedCategorical`` /
            ``OneHotCategorical``) with ``get_dist(td)``.
        qvalue: network writing ``action_value`` ``[*B, n]`` from the observation;
            ``num_qvalue_nets`` copies are made.
        num_actions: ``n``. gamma: discount.
        alpha_init, fixed_alpha: temperature. target_entropy_weight: target entropy is
            ``weight * log(n)`` (0.98 in the paper). loss_function, check_finite: as SAC.

    Returns ``loss_actor``, ``loss_qvalue``, ``loss_alpha`` and diagnostics.
    """

    Keys = QKeys

    def __init__(
        self,
        actor,
        qvalue,
        *,
        num_actions: int,
        gamma: float = 0.99,
        num_qvalue_nets: int = 2,
        alpha_init: float = 1.0,
        fixed_alpha: bool = False,
        target_entropy_weight: float = 0.98,
        loss_function: str = "l2",
        check_finite: bool = False,
    ) -> None:
        super().__init__(check_finite)
        self.actor = actor
        self._add_critics(qvalue, num_qvalue_nets)
        self.num_actions, self.gamma = int(num_actions), float(gamma)
        self.loss_function = check_distance(loss_function)
        self.temperature = EntropyTemperature(
            alpha_init, target_entropy_weight * math.log(num_actions), fixed_alpha
        )

    def _qs(self, nets, td, detach_params=False) -> Tensor:
        return run_module(
            nets, td, self.tensor_keys.action_value, type(self).__name__, None, detach_params
        )

    def qvalue_loss(self, td: TensorDictBase) -> dict[str, Tensor]:
        qs = self._qs(self.qvalue, td)  # [n_nets, *B, n]
        action = self._get(td, "action")
        if action.is_floating_point():
            action = action.expand_as(qs)
        else:
            action = action.expand(qs.shape[0], *action.shape)
        q_a = gather_action_value(qs, action)  # [n_nets, *B, 1]
        next_td = self._next_td(td)
        with torch.no_grad():
            probs, logp = _probs_logp(get_dist(self.actor, next_td))
            next_q = self._qs(self.target_qvalue, next_td).min(0).values
            next_v = (probs * (next_q - self.temperature.alpha * logp)).sum(-1, keepdim=True)
            target = self._bootstrap(td, next_v, self.gamma)
        return self._ensemble_critic_terms(td, q_a, target)

    def actor_loss(self, td: TensorDictBase) -> dict[str, Tensor]:
        probs, logp = _probs_logp(get_dist(self.actor, td))
        with torch.no_grad():
            q = self._qs(self.qvalue, td).min(0).values
        loss = (probs * (self.temperature.alpha * logp - q)).sum(-1).mean()
        expected_logp = (probs * logp).sum(-1)
        out = {"loss_actor": loss, "entropy": -expected_logp.mean(), "alpha": self.temperature.alpha}
        loss_alpha = self.temperature.loss(expected_logp)
        if loss_alpha is not None:
            out["loss_alpha"] = loss_alpha
        return out

    def forward(self, td: TensorDictBase) -> TensorDict:
        return self._output({**self.actor_loss(td), **self.qvalue_loss(td)})
