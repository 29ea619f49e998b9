"""Soft actor-critic for continuous actions (Haarnoja et al., 2018, arXiv:1812.05905),
with clipped double-Q and automatic entropy tuning."""

from __future__ import annotations

import math

import torch
from tensordict import TensorDict, TensorDictBase
from torch import Tensor, nn

from tdrl.core.objectives._nets import get_dist, sample_with_log_prob
from tdrl.core.objectives.common import LossModule, check_distance
from tdrl.core.objectives.ddpg import QKeys
from tdrl.core.torchrl_names import accept_torchrl_names

__all__ = ["EntropyTemperature", "SACLoss"]


class EntropyTemperature(nn.Module):
    """The entropy temperature ``alpha`` of SAC, fixed or tuned towards a target entropy.

    Args:
        alpha_init: initial alpha.
        target_entropy: desired policy entropy (``-action_dim`` for continuous SAC).
        fixed: keep alpha constant (no ``loss_alpha``).
        min_alpha, max_alpha: optional clamp of alpha.
    """

    def __init__(
        self,
        alpha_init: float,
        target_entropy: float,
        fixed: bool = False,
        min_alpha: float | None = None,
        max_alpha: float | None = None,
    ) -> None:
        super().__init__()
        if alpha_init <= 0:
            raise ValueError(f"alpha_init must be > 0, got {alpha_init}.")
        log_alpha = torch.tensor(math.log(alpha_init))
        if fixed:
            self.register_buffer("log_alpha", log_alpha)
        else:
            self.log_alpha = nn.Parameter(log_alpha)
        self.target_entropy, self.fixed = float(target_entropy), fixed
        self.min_log = None if min_alpha is None else math.log(min_alpha)
        self.max_log = None if max_alpha is None else math.log(max_alpha)

    @property
    def alpha(self) -> Tensor:
        """Detached current alpha (a scalar tensor)."""
        log_alpha = self.log_alpha.detach()
        if self.min_log is not None or self.max_log is not None:
            log_alpha = log_alpha.clamp(self.min_log, self.max_log)
        return log_alpha.exp()

    def alpha_for(self, like: Tensor) -> Tensor:
        """Detached alpha broadcastable to ``like`` (``[*B, ...]``); a subclass may give each
        block of rows its own (e.g. :class:`~tdrl.core.train.seeds.StackedTemperature`)."""
        return self.alpha

    def loss(self, log_prob: Tensor) -> Tensor | None:
        """``-log_alpha * (E[log pi] + target_entropy)``; ``log_prob`` is detached here.

        Args:
            log_prob: ``E_pi[log pi(.|s)]`` per state, any shape.
        """
        if self.fixed:
            return None
        return -(self.log_alpha * (log_prob.detach() + self.target_entropy)).mean()


@accept_torchrl_names
class SACLoss(LossModule):
    """SAC (v2, no separate value network).

    Args:
        actor: probabilistic actor with ``get_dist(td)`` (e.g. :class:`TanhNormal`).
        qvalue: critic writing ``state_action_value`` ``[*B, 1]``; ``num_qvalue_nets``
            copies are made (the first is ``qvalue``, the others re-initialised).
        gamma: discount. num_qvalue_nets: critics (min over them in targets).
        alpha_init: initial temperature. fixed_alpha: no temperature tuning.
        min_alpha, max_alpha: optional clamp of the temperature (None: unclamped).
        target_entropy: ``"auto"`` (``-action_dim``, read from the first sampled action)
            or a float.
        loss_function: critic distance. check_finite: raise on a NaN/inf loss term.

    Returns ``loss_actor``, ``loss_qvalue``, ``loss_alpha`` (unless fixed) and the
    diagnostics ``alpha``, ``entropy``, ``q_mean``, ``target_mean``, ``td_error``.
    Target critics: update them with ``SoftUpdate(loss, tau)``.
    """

    Keys = QKeys

    def __init__(
        self,
        actor,
        qvalue,
        *,
        gamma: float = 0.99,
        num_qvalue_nets: int = 2,
        alpha_init: float = 1.0,
        fixed_alpha: bool = False,
        target_entropy: float | str = "auto",
        loss_function: str = "l2",
        min_alpha: float | None = None,
        max_alpha: float | None = None,
        check_finite: bool = False,
    ) -> None:
        super().__init__(check_finite)
        self.actor = actor
        self._add_critics(qvalue, num_qvalue_nets)
        self.gamma, self.loss_function = float(gamma), check_distance(loss_function)
        self._auto_entropy = target_entropy == "auto"
        self.temperature = EntropyTemperature(
            alpha_init, 0.0 if self._auto_entropy else float(target_entropy), fixed_alpha, min_alpha, max_alpha
        )

    # TorchRL's views of the parameters, for per-network optimisers: TensorDicts whose leaves
    # are the modules' own Parameters (list(loss.qvalue_network_params.flatten_keys().values()))
    actor_network_params = property(lambda self: TensorDict.from_module(self.actor))
    qvalue_network_params = property(lambda self: TensorDict.from_module(self.qvalue))
    log_alpha = property(lambda self: self.temperature.log_alpha, doc="TorchRL's loss.log_alpha (the temperature's)")

    def _qs(self, nets, td, action, detach_params=False) -> Tensor:
        """The critics' values at ``action`` (REDQ overrides this to draw a subset)."""
        return self._q_values(nets, td, action, detach_params)

    def _sample(self, td: TensorDictBase) -> tuple[Tensor, Tensor]:
        action, log_prob = sample_with_log_prob(get_dist(self.actor, td))
        if self._auto_entropy:
            self.temperature.target_entropy = -float(action.shape[-1])
            self._auto_entropy = False
        return action, log_prob

    def _align(self, log_prob: Tensor, q: Tensor) -> Tensor:
        return log_prob.reshape(q.shape)

    def qvalue_loss(self, td: TensorDictBase) -> dict[str, Tensor]:
        """Critic terms: ``loss_qvalue`` (summed over critics) and diagnostics."""
        qs = self._qs(self.qvalue, td, self._get(td, "action"))
        next_td = self._next_td(td)
        with torch.no_grad():
            next_action, next_lp = self._sample(next_td)
            next_q = self._qs(self.target_qvalue, next_td, next_action).min(0).values
            next_lp = self._align(next_lp, next_q)
            next_v = next_q - self.temperature.alpha_for(next_lp) * next_lp
            target = self._bootstrap(td, next_v, self.gamma)
        return self._ensemble_critic_terms(td, qs, target)

    def _actor_q(self, qs: Tensor) -> Tensor:
        """The critics' value the actor maximises, from the stacked ``[N, ...]`` Q values: the min."""
        return qs.min(0).values

    def actor_loss(self, td: TensorDictBase) -> dict[str, Tensor]:
        """``loss_actor = alpha log pi(a|s) - min_i Q_i(s, a)``, ``a ~ pi`` (reparameterised),
        plus ``loss_alpha`` and the entropy diagnostic."""
        action, log_prob = self._sample(td)
        q = self._actor_q(self._qs(self.qvalue, td, action, detach_params=True))
        log_prob = self._align(log_prob, q)
        out = {
            "loss_actor": (self.temperature.alpha_for(log_prob) * log_prob - q).mean(),
            "entropy": -log_prob.mean(),
            "alpha": self.temperature.alpha.mean(),  # a scalar (the mean where a subclass holds several)
        }
        loss_alpha = self.temperature.loss(log_prob)
        if loss_alpha is not None:
            out["loss_alpha"] = loss_alpha
        return out

    def forward(self, td: TensorDictBase, actor: bool = True) -> TensorDict:
        """All terms; ``actor=False``: the critic terms only (no actor sample, no
        ``loss_actor`` / ``loss_alpha``: a critic-only step of a delayed policy update, as
        REDQ's ``G`` critic steps per actor step)."""
        if not actor:
            return self._output(self.qvalue_loss(td))
        return self._output({**self.actor_loss(td), **self.qvalue_loss(td)})
