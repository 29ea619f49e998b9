"""Proximal policy optimisation (Schulman et al., 2017, arXiv:1707.06347).

One loss covers the paper's variants, chosen by plain arguments rather than subclasses:
the clipped surrogate (``clip_epsilon``), the KL-penalised surrogate (``kl_coef``, with the
paper's adaptive coefficient when ``kl_target`` is set), or both; an entropy bonus; and a
critic loss with optional value clipping.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributions as D
from tensordict import TensorDict, TensorDictBase
from torch import Tensor

from tdrl.core import keys as K
from tdrl.core.objectives._nets import get_dist, run_module
from tdrl.core.objectives.common import LossModule, check_distance, distance_loss, entropy_estimate, k3_estimate
from tdrl.core.values._utils import NestedKey
from tdrl.core.values.estimators import AdvantageKeys
from tdrl.core.torchrl_names import accept_torchrl_names

__all__ = ["PPOKeys", "PPOLoss", "critic_loss", "align_advantage", "clipped_surrogate", "entropy_terms"]


@dataclass
class PPOKeys(AdvantageKeys):
    """Keys read by :class:`PPOLoss` and :class:`~tdrl.core.objectives.A2CLoss`: the
    estimator's :class:`~tdrl.core.values.AdvantageKeys` and the ``action``."""

    action: NestedKey = K.ACTION


def align_advantage(advantage: Tensor, log_prob: Tensor) -> Tensor:
    """Drop the trailing 1 of a ``[*B, 1]`` advantage so it matches ``[*B]`` log-probs."""
    if advantage.shape == log_prob.shape:
        return advantage
    if advantage.shape == (*log_prob.shape, 1):
        return advantage.squeeze(-1)
    raise ValueError(
        f"advantage has shape {tuple(advantage.shape)}, log-prob {tuple(log_prob.shape)}: "
        "expected the same shape or an extra trailing 1."
    )


def clipped_surrogate(
    log_prob: Tensor, old_log_prob: Tensor, advantage: Tensor, clip_epsilon: float | None
) -> tuple[Tensor, Tensor, Tensor]:
    """PPO's per-sample surrogate ``min(r A, clip(r, 1 - eps, 1 + eps) A)``, ``r = exp(lp - lp_old)``
    (Schulman et al., 2017, arXiv:1707.06347, eq. 7); the one implementation the PPO losses share.

    Args:
        log_prob: ``[*B]`` log-probabilities under the current policy (with grad).
        old_log_prob: ``[*B]`` log-probabilities under the sampling policy (detach it).
        advantage: ``[*B]`` advantages (detach it).
        clip_epsilon: the ratio clipping; ``None``: the plain surrogate ``r A``.

    Returns:
        ``(surrogate, ratio, log_ratio)``, each ``[*B]``: the surrogate is to be maximised
        (the loss is ``-reduce(surrogate)``, with whatever mean or mask the caller needs).
    """
    log_ratio = log_prob - old_log_prob
    ratio = log_ratio.exp()
    surrogate = ratio * advantage
    if clip_epsilon is not None:
        clipped = ratio.clamp(1.0 - clip_epsilon, 1.0 + clip_epsilon) * advantage
        surrogate = torch.minimum(surrogate, clipped)
    return surrogate, ratio, log_ratio


def entropy_terms(
    dist: D.Distribution, coef: float, bonus: bool, device: torch.device
) -> dict[str, Tensor]:
    """The entropy terms of PPO and A2C: ``entropy`` and ``loss_entropy = -coef * entropy``.

    At ``coef == 0`` only ``loss_entropy`` (a zero) remains where ``bonus`` asks for it:
    TorchRL's key contract, the term exists at coefficient 0.
    """
    if coef:
        entropy = entropy_estimate(dist).mean()
        return {"entropy": entropy, "loss_entropy": -coef * entropy}
    if bonus:
        return {"loss_entropy": torch.zeros((), device=device)}
    return {}


def critic_loss(
    value: Tensor,
    target: Tensor,
    old_value: Tensor | None = None,
    clip_value: float | None = None,
    kind: str = "l2",
) -> tuple[Tensor, Tensor | None]:
    """Mean critic loss; with ``clip_value`` the PPO2 clipped form
    ``max(d(v, R), d(v_old + clip(v - v_old, -c, c), R))``.

    Returns:
        ``(loss scalar, fraction of clipped values or None)``.
    """
    if value.shape != target.shape:
        raise ValueError(
            f"critic output has shape {tuple(value.shape)} but the value target "
            f"{tuple(target.shape)}; both should be [*B, 1]."
        )
    loss = distance_loss(value, target, kind)
    if clip_value is None:
        return loss.mean(), None
    if old_value is None:
        raise ValueError("clip_value needs the old value (the 'value' key) in the batch.")
    clipped = old_value + (value - old_value).clamp(-clip_value, clip_value)
    loss_clipped = distance_loss(clipped, target, kind)
    frac = ((value - old_value).abs() > clip_value).float().mean()
    return torch.maximum(loss, loss_clipped).mean(), frac


@accept_torchrl_names
class PPOLoss(LossModule):
    """PPO loss over a batch of transitions (any batch shape).

    Args:
        actor: a probabilistic actor with ``get_dist(td)``.
        critic: a value module writing ``value`` (``[*B, 1]``); ``None`` for actor-only.
        clip_epsilon: ratio clipping; ``None`` for no clipping (pure KL-penalty PPO).
        kl_coef: weight of the KL penalty ``E_old[log pi_old - log pi]`` (k3 estimator).
        kl_target: when set, ``kl_coef`` adapts after each training-mode call: x2 if that
            batch's KL > 1.5 target, /2 if < target / 1.5 (the paper's rule); the returned
            ``loss_kl`` and ``kl_coef`` use the coefficient before the update.
        entropy_coef: weight of the entropy bonus (0 disables it).
        critic_coef: weight of the critic loss.
        clip_value: PPO2 value clipping around the stored value; ``None`` disables it.
        normalize_advantage: standardise the advantage over the batch.
        loss_critic_type: ``"l2"`` (0.5 x squared error), ``"mse"`` (TorchRL's ``"l2"``), ``"l1"`` or ``"smooth_l1"``.
        check_finite: raise if a loss term is NaN or infinite, naming it.

    Reads ``action``, ``action_log_prob``, ``advantage``, ``value_target`` (and
    ``state_value`` for value clipping). Returns ``loss_objective``, ``loss_critic``,
    ``loss_entropy``, ``loss_kl`` (when enabled) and diagnostics ``entropy``, ``kl_approx``,
    ``clip_fraction``, ``ratio_mean``, ``ess``, ``explained_variance``.
    """

    Keys = PPOKeys

    def __init__(
        self,
        actor,
        critic=None,
        *,
        clip_epsilon: float | None = 0.2,
        kl_coef: float = 0.0,
        kl_target: float | None = None,
        entropy_coef: float = 0.01,
        entropy_bonus: bool = True,
        critic_coef: float = 0.5,
        clip_value: float | None = None,
        normalize_advantage: bool = False,
        loss_critic_type: str = "l2",
        check_finite: bool = False,
    ) -> None:
        super().__init__(check_finite)
        if clip_epsilon is None and kl_coef == 0.0 and kl_target is None:
            raise ValueError("PPOLoss needs clip_epsilon, kl_coef or kl_target (or all).")
        self.actor, self.critic = actor, critic
        # a buffer, so a schedule anneals it in place (``loss.clip_epsilon.copy_(eps * alpha)``,
        # as TorchRL's scripts do); None: no clipping
        if clip_epsilon is None:
            self.clip_epsilon = None
        else:
            self.register_buffer("clip_epsilon", torch.tensor(float(clip_epsilon)))
        self.register_buffer("kl_coef", torch.tensor(float(kl_coef)))
        self.kl_target = kl_target
        if kl_target is not None and kl_coef == 0.0:
            self.kl_coef.fill_(1.0)
        self._use_kl = kl_target is not None or kl_coef > 0.0  # no device sync per call
        self.entropy_coef, self.critic_coef = entropy_coef, critic_coef
        self.entropy_bonus = entropy_bonus
        self.clip_value, self.normalize_advantage = clip_value, normalize_advantage
        self.loss_critic_type = check_distance(loss_critic_type)

    def _policy_terms(self, td: TensorDictBase, terms: dict) -> None:
        action = self._get(td, "action")
        old_lp = self._get(td, "sample_log_prob")
        dist = get_dist(self.actor, td)
        lp = dist.log_prob(action)
        if lp.shape != old_lp.shape:
            old_lp = old_lp.reshape(lp.shape)
        adv = align_advantage(self._get(td, "advantage"), lp).detach()
        if self.normalize_advantage and adv.numel() > 1:
            adv = (adv - adv.mean()) / adv.std().clamp_min(1e-8)
        surrogate, ratio, log_ratio = clipped_surrogate(lp, old_lp.detach(), adv, self.clip_epsilon)
        terms["loss_objective"] = -surrogate.mean()
        use_kl = self._use_kl
        with torch.set_grad_enabled(use_kl and torch.is_grad_enabled()):
            kl = k3_estimate(log_ratio, ratio).mean()  # KL(old || new), >= 0
        if use_kl:
            # a copy: the loss must not hold the buffer that _adapt_kl changes in place before
            # backward (autograd saves the coefficient to differentiate kl_coef * kl)
            coef = self.kl_coef.clone()
            terms["loss_kl"] = coef * kl
            terms["kl_coef"] = coef
            if self.kl_target is not None and self.training:
                self._adapt_kl(kl.detach())
        with torch.no_grad():
            w = ratio.detach()
            if self.clip_epsilon is not None:
                terms["clip_fraction"] = ((w - 1.0).abs() > self.clip_epsilon).float().mean()
            terms["kl_approx"] = kl.detach()
            terms["ratio_mean"] = w.mean()
            terms["ess"] = w.sum().pow(2) / w.pow(2).sum().clamp_min(1e-12) / w.numel()
        terms.update(entropy_terms(dist, self.entropy_coef, self.entropy_bonus, lp.device))

    @torch.no_grad()
    def _adapt_kl(self, kl: Tensor) -> None:
        if kl > 1.5 * self.kl_target:
            self.kl_coef.mul_(2.0)
        elif kl < self.kl_target / 1.5:
            self.kl_coef.div_(2.0)

    def _critic_terms(self, td: TensorDictBase, terms: dict) -> None:
        if self.critic is None or not self.critic_coef:
            return
        key = self.tensor_keys.value
        target = self._get(td, "value_target").detach()
        old_value = self._get(td, "value").detach() if self.clip_value is not None else None
        value = run_module(self.critic, td, key, type(self).__name__)
        loss, frac = critic_loss(value, target, old_value, self.clip_value, self.loss_critic_type)
        terms["loss_critic"] = self.critic_coef * loss
        if frac is not None:
            terms["value_clip_fraction"] = frac
        with torch.no_grad():
            var = target.var()
            terms["explained_variance"] = 1.0 - (target - value).var() / var.clamp_min(1e-8)

    def forward(self, td: TensorDictBase) -> TensorDict:
        """Compute the loss terms for a batch ``td``; see the class docstring."""
        terms: dict = {}
        self._policy_terms(td, terms)
        self._critic_terms(td, terms)
        return self._output(terms)
