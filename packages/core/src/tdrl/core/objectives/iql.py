"""Implicit Q-learning for offline RL (Kostrikov et al., 2021, arXiv:2110.06169)."""

from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase
from torch import Tensor

from tdrl.core.objectives._nets import get_dist, run_module
from tdrl.core.objectives.common import LossModule, check_distance
from tdrl.core.objectives.ddpg import QKeys
from tdrl.core.torchrl_names import accept_torchrl_names

__all__ = ["IQLLoss", "expectile_loss"]


def expectile_loss(diff: Tensor, expectile: float) -> Tensor:
    """Asymmetric squared loss ``|tau - 1(diff < 0)| * diff^2`` (element-wise)."""
    weight = torch.where(diff > 0, expectile, 1.0 - expectile)
    return weight * diff.pow(2)


@accept_torchrl_names
class IQLLoss(LossModule):
    """IQL: expectile value regression, SARSA-style critic, advantage-weighted actor.

    Args:
        actor: probabilistic actor with ``get_dist(td)``.
        qvalue: critic writing ``state_action_value`` (``num_qvalue_nets`` copies; frozen
            targets updated with ``SoftUpdate``).
        value: state-value module writing ``state_value`` ``[*B, 1]``.
        gamma: discount. expectile: tau in (0.5, 1). temperature: beta of the
            advantage weights ``exp(beta * (Q - V))``, clipped at ``max_weight``.
        num_qvalue_nets, loss_function, check_finite: as in :class:`SACLoss`.

    Returns ``loss_actor``, ``loss_qvalue``, ``loss_value`` and diagnostics.
    """

    Keys = QKeys

    def __init__(
        self,
        actor,
        qvalue,
        value,
        *,
        gamma: float = 0.99,
        expectile: float = 0.7,
        temperature: float = 3.0,
        max_weight: float = 100.0,
        num_qvalue_nets: int = 2,
        loss_function: str = "l2",
        check_finite: bool = False,
    ) -> None:
        super().__init__(check_finite)
        if not 0.0 < expectile < 1.0:
            raise ValueError(f"expectile must be in (0, 1), got {expectile}.")
        self.actor, self.value = actor, value
        self._add_critics(qvalue, num_qvalue_nets)
        self.gamma, self.expectile = float(gamma), float(expectile)
        self.temperature, self.max_weight = float(temperature), float(max_weight)
        self.loss_function = check_distance(loss_function)

    def _v(self, td: TensorDictBase) -> Tensor:
        return run_module(self.value, td, self.tensor_keys.state_value, type(self).__name__)

    def _target_q(self, td: TensorDictBase) -> Tensor:
        with torch.no_grad():
            return run_module(
                self.target_qvalue, td, self.tensor_keys.state_action_value, type(self).__name__
            ).min(0).values

    def value_loss(self, td: TensorDictBase) -> dict[str, Tensor]:
        v = self._v(td)
        diff = self._target_q(td) - v
        return {"loss_value": expectile_loss(diff, self.expectile).mean(), "value_mean": v.mean()}

    def qvalue_loss(self, td: TensorDictBase) -> dict[str, Tensor]:
        k = self.tensor_keys
        qs = run_module(self.qvalue, td, k.state_action_value, type(self).__name__)
        with torch.no_grad():
            target = self._bootstrap(td, self._v(self._next_td(td)), self.gamma)
        return self._ensemble_critic_terms(td, qs, target, target_mean=False)

    def actor_loss(self, td: TensorDictBase) -> dict[str, Tensor]:
        with torch.no_grad():
            adv = self._target_q(td) - self._v(td)
            weight = torch.exp(self.temperature * adv).clamp(max=self.max_weight)
        dist = get_dist(self.actor, td)
        log_prob = dist.log_prob(self._get(td, "action")).reshape(weight.shape)
        return {"loss_actor": -(weight * log_prob).mean(), "weight_mean": weight.mean()}

    def forward(self, td: TensorDictBase) -> TensorDict:
        return self._output({**self.actor_loss(td), **self.qvalue_loss(td), **self.value_loss(td)})
