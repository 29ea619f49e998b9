"""Advantage actor-critic (Mnih et al., 2016, arXiv:1602.01783)."""

from __future__ import annotations

from tensordict import TensorDict, TensorDictBase

from tdrl.core.objectives._nets import get_dist, run_module
from tdrl.core.objectives.common import LossModule, check_distance
from tdrl.core.objectives.ppo import PPOKeys, align_advantage, critic_loss, entropy_terms
from tdrl.core.torchrl_names import accept_torchrl_names

__all__ = ["A2CLoss"]


@accept_torchrl_names
class A2CLoss(LossModule):
    """``-log pi(a|s) * A`` policy gradient, a critic loss and an entropy bonus.

    Args:
        actor: probabilistic actor with ``get_dist(td)``. critic: value module or ``None``.
        entropy_coef, critic_coef: weights. loss_critic_type: ``"l2"``/``"mse"``/``"l1"``/``"smooth_l1"`` (:func:`distance_loss`).
        normalize_advantage: standardise the advantage. check_finite: raise on NaN/inf terms.

    Reads ``action``, ``advantage``, ``value_target`` (same keys as :class:`PPOLoss`).
    Returns ``loss_objective``, ``loss_critic``, ``loss_entropy`` and diagnostics.
    """

    Keys = PPOKeys

    def __init__(
        self,
        actor,
        critic=None,
        *,
        entropy_coef: float = 0.01,
        entropy_bonus: bool = True,
        critic_coef: float = 0.5,
        loss_critic_type: str = "l2",
        normalize_advantage: bool = False,
        check_finite: bool = False,
    ) -> None:
        super().__init__(check_finite)
        self.actor, self.critic = actor, critic
        self.entropy_coef, self.critic_coef = entropy_coef, critic_coef
        self.entropy_bonus = entropy_bonus
        self.loss_critic_type, self.normalize_advantage = check_distance(loss_critic_type), normalize_advantage

    def forward(self, td: TensorDictBase) -> TensorDict:
        terms: dict = {}
        dist = get_dist(self.actor, td)
        lp = dist.log_prob(self._get(td, "action"))
        adv = align_advantage(self._get(td, "advantage"), lp).detach()
        if self.normalize_advantage and adv.numel() > 1:
            adv = (adv - adv.mean()) / adv.std().clamp_min(1e-8)
        terms["loss_objective"] = -(lp * adv).mean()
        terms.update(entropy_terms(dist, self.entropy_coef, self.entropy_bonus, lp.device))
        if self.critic is not None and self.critic_coef:
            value = run_module(self.critic, td, self.tensor_keys.value, type(self).__name__)
            target = self._get(td, "value_target").detach()
            loss, _ = critic_loss(value, target, kind=self.loss_critic_type)
            terms["loss_critic"] = self.critic_coef * loss
        return self._output(terms)
