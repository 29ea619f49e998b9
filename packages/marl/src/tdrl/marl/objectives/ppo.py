"""MAPPO (Yu et al., 2021, arXiv:2103.01955) and IPPO (de Witt et al., 2020,
arXiv:2011.09533): the clipped PPO surrogate applied to every agent of a group.

The surrogate is core's :func:`tdrl.core.objectives.ppo.clipped_surrogate` (the one
implementation); this module adds the agent mask to its reductions and the per-agent critic.

The two differ only in the critic: MAPPO's sees every agent (a centralised
``MultiAgentMLP``), IPPO's sees one agent's observation. Both read per-agent data
``[*B, n_agents, ...]`` under the group key; an optional ``(group, "mask")`` ``[*B, n]``
excludes agents that did not act (turn-based games, agents that left the episode).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDict, TensorDictBase
from torch import Tensor

from tdrl.core.objectives.common import (
    LossModule, check_distance, distance_loss, entropy_estimate, k3_estimate, masked_mean,
)  # fmt: skip
from tdrl.core.objectives._nets import get_dist, run_module
from tdrl.core.objectives.ppo import clipped_surrogate
from tdrl.core.values._utils import NestedKey

from ..keys import ACTION, ACTION_LOG_PROB, ADVANTAGE, GROUP, MASK, STATE_VALUE, VALUE_TARGET

# masked_mean is core's (tdrl.core.objectives.common), re-exported here
__all__ = ["MAPPOConfig", "IPPOConfig", "MAPPOLoss", "IPPOLoss", "MultiAgentPPOKeys", "masked_mean"]


@dataclass
class MAPPOConfig:
    """Hyper-parameters of MAPPO (defaults follow BenchMARL's ``MappoConfig``).

    Args:
        clip_epsilon: ratio clipping of the surrogate.
        entropy_coef: weight of the entropy bonus.
        critic_coef: weight of the critic loss.
        loss_critic_type: ``"l2"`` (0.5 x squared error), ``"mse"`` (TorchRL's ``"l2"``), ``"l1"`` or ``"smooth_l1"``.
        clip_value: PPO2 clipping of the critic around the stored value (None: off).
        normalize_advantage: standardise advantages per minibatch.
        gamma: discount. lmbda: GAE trace decay.
        share_param_actor / share_param_critic: one set of parameters for all agents.
        centralised_critic: the critic sees every agent (True for MAPPO, False for IPPO).
        recurrent: recurrent actor and critic (:class:`~tdrl.marl.modules.MultiAgentGRU` or
            ``MultiAgentLSTM``, then an MLP head), their hidden states reset at episode starts
            (the env needs core's ``InitTracker``); the update replays whole trajectories.
        rnn: the cell with ``recurrent``: ``"gru"`` or ``"lstm"`` (BenchMARL's ``layers/gru`` /
            ``layers/lstm`` models).
        rnn_hidden: the cells' hidden size (BenchMARL's ``layers/gru.yaml`` / ``lstm.yaml``: 128).
    """

    clip_epsilon: float = 0.2
    entropy_coef: float = 0.0
    critic_coef: float = 1.0
    loss_critic_type: str = "l2"
    clip_value: float | None = None
    normalize_advantage: bool = False
    gamma: float = 0.99
    lmbda: float = 0.9
    share_param_actor: bool = True
    share_param_critic: bool = True
    centralised_critic: bool = True
    recurrent: bool = False
    rnn: str = "gru"
    rnn_hidden: int = 128

    def __post_init__(self) -> None:
        if self.rnn not in ("gru", "lstm"):
            raise ValueError(f"rnn must be 'gru' or 'lstm', got {self.rnn!r}.")
        if self.rnn_hidden < 1:
            raise ValueError(f"rnn_hidden must be >= 1, got {self.rnn_hidden}.")
        if not self.clip_epsilon > 0:
            raise ValueError(f"clip_epsilon must be > 0, got {self.clip_epsilon}.")
        if not 0.0 <= self.gamma <= 1.0 or not 0.0 <= self.lmbda <= 1.0:
            raise ValueError(f"gamma and lmbda must be in [0, 1], got {self.gamma}, {self.lmbda}.")
        if self.entropy_coef < 0 or self.critic_coef < 0:
            raise ValueError("entropy_coef and critic_coef must be >= 0.")
        check_distance(self.loss_critic_type)


@dataclass
class IPPOConfig(MAPPOConfig):
    """MAPPO's hyper-parameters with a decentralised critic (each agent sees itself)."""

    centralised_critic: bool = False


@dataclass
class MultiAgentPPOKeys:
    """Keys read by the multi-agent PPO losses (all under the group); rebind with ``set_keys``."""

    action: NestedKey = (GROUP, ACTION)
    sample_log_prob: NestedKey = (GROUP, ACTION_LOG_PROB)
    advantage: NestedKey = (GROUP, ADVANTAGE)
    value_target: NestedKey = (GROUP, VALUE_TARGET)
    value: NestedKey = (GROUP, STATE_VALUE)
    mask: NestedKey = (GROUP, MASK)


class _MultiAgentPPOLoss(LossModule):
    """Clipped PPO over every agent of a group; see :class:`MAPPOLoss`."""

    Keys = MultiAgentPPOKeys
    config_class: type = MAPPOConfig

    def __init__(self, actor, critic, config: MAPPOConfig | None = None, *, group: str = GROUP,
                 value_norm=None, check_finite: bool = False) -> None:
        super().__init__(check_finite)
        self.config = config if config is not None else self.config_class()
        self.actor, self.critic, self.value_norm = actor, critic, value_norm
        if group != GROUP:
            self.set_keys(**{f: (group, k[-1]) for f, k in vars(MultiAgentPPOKeys()).items()})
        self.group = group

    def _mask(self, td: TensorDictBase) -> Tensor | None:
        return td.get(self.tensor_keys.mask, None)

    def forward(self, td: TensorDictBase) -> TensorDict:
        """Loss terms for a minibatch ``td`` (batch ``[*B]``, per-agent entries ``[*B, n, ...]``).

        Returns:
            ``loss_objective``, ``loss_critic``, ``loss_entropy`` (when ``entropy_coef > 0``)
            and diagnostics ``entropy``, ``kl_approx``, ``clip_fraction``, ``ratio_mean``,
            ``explained_variance``.
        """
        c, terms = self.config, {}
        mask = self._mask(td)
        dist = get_dist(self.actor, td)
        lp = dist.log_prob(self._get(td, "action"))  # [*B, n]
        old_lp = self._get(td, "sample_log_prob").detach().reshape(lp.shape)
        adv = self._get(td, "advantage").detach()
        if adv.shape == (*lp.shape, 1):
            adv = adv.squeeze(-1)
        if adv.shape != lp.shape:
            raise ValueError(
                f"advantage has shape {tuple(adv.shape)}; the log-prob of group {self.group!r} "
                f"has {tuple(lp.shape)} (expected the same, or a trailing 1)."
            )
        if c.normalize_advantage and adv.numel() > 1:
            adv = (adv - adv.mean()) / adv.std().clamp_min(1e-8)
        surrogate, ratio, log_ratio = clipped_surrogate(lp, old_lp, adv, c.clip_epsilon)
        terms["loss_objective"] = -masked_mean(surrogate, mask)
        with torch.no_grad():
            terms["clip_fraction"] = masked_mean(((ratio - 1).abs() > c.clip_epsilon).float(), mask)
            terms["kl_approx"] = masked_mean(k3_estimate(log_ratio, ratio), mask)
            terms["ratio_mean"] = masked_mean(ratio, mask)
        if c.entropy_coef > 0:
            entropy = masked_mean(entropy_estimate(dist), mask)
            terms["entropy"] = entropy
            terms["loss_entropy"] = -c.entropy_coef * entropy
        if self.critic is not None and c.critic_coef > 0:
            self._critic_terms(td, mask, terms)
        return self._output(terms)

    def _critic_terms(self, td: TensorDictBase, mask: Tensor | None, terms: dict) -> None:
        c = self.config
        target = self._get(td, "value_target").detach()
        value = run_module(self.critic, td, self.tensor_keys.value, type(self).__name__)
        if value.shape != target.shape:
            raise ValueError(
                f"critic output {self.tensor_keys.value} has shape {tuple(value.shape)}; the value "
                f"target has {tuple(target.shape)} (expected [*B, n_agents, 1] for both)."
            )
        if self.value_norm is not None:
            target = self.value_norm.normalize(target)
        loss = distance_loss(value, target, c.loss_critic_type)
        if c.clip_value is not None:
            old = self._get(td, "value").detach()
            clipped = old + (value - old).clamp(-c.clip_value, c.clip_value)
            loss = torch.maximum(loss, distance_loss(clipped, target, c.loss_critic_type))
        terms["loss_critic"] = c.critic_coef * masked_mean(loss, mask)
        with torch.no_grad():
            terms["explained_variance"] = 1 - (target - value).var() / target.var().clamp_min(1e-8)


class MAPPOLoss(_MultiAgentPPOLoss):
    """Multi-agent PPO with a centralised critic.

    Args:
        actor: a probabilistic actor (``get_dist(td)``) writing ``(group, "action")``;
            its log-prob has shape ``[*B, n_agents]``.
        critic: a TensorDict module writing ``(group, "state_value")`` ``[*B, n_agents, 1]``,
            normally a centralised :class:`~tdrl.marl.modules.MultiAgentMLP`.
        config: :class:`MAPPOConfig`.
        group: the group key.
        value_norm: optional :class:`~tdrl.marl.objectives.ValueNorm`/``PopArt``: the critic
            predicts normalised values and targets are normalised before the critic loss.
    """

    config_class = MAPPOConfig


class IPPOLoss(_MultiAgentPPOLoss):
    """Independent PPO: as :class:`MAPPOLoss`, with a decentralised critic (each agent's
    value depends on its own observation only); configured by :class:`IPPOConfig`."""

    config_class = IPPOConfig
