"""Behaviour cloning: supervised regression of the policy onto the dataset's actions
(Pomerleau, 1991, "Efficient Training of Artificial Neural Networks for Autonomous
Navigation"; the offline-RL baseline of Fu et al., 2020, arXiv:2004.07219)."""

from __future__ import annotations

from dataclasses import dataclass

from tensordict import TensorDict, TensorDictBase
from torch import Tensor

from tdrl.core import keys as K
from tdrl.core.objectives._nets import get_dist, run_module
from tdrl.core.objectives.common import LossModule
from tdrl.core.values._utils import NestedKey

__all__ = ["BCKeys", "BCLoss", "GaussianBCLoss", "bc_mse"]


@dataclass
class BCKeys:
    """Keys of the behaviour-cloning losses: the dataset action (and the actor's output)."""

    action: NestedKey = K.ACTION


def bc_mse(policy_action: Tensor, data_action: Tensor) -> Tensor:
    """Mean squared error over every batch and action element (``F.mse_loss``), as the
    behaviour term of TD3+BC (Fujimoto & Gu, 2021).

    Args:
        policy_action: ``[*B, A]``. data_action: ``[*B, A]``.

    Returns:
        A scalar.
    """
    if policy_action.shape != data_action.shape:
        raise ValueError(
            f"The policy's action has shape {tuple(policy_action.shape)}, the dataset's "
            f"{tuple(data_action.shape)}: they must match."
        )
    return (policy_action - data_action.to(policy_action.dtype)).pow(2).mean()


class _CloningLoss(LossModule):
    """What both behaviour-cloning losses share: one ``actor`` (``check_finite``: raise on a
    NaN/inf loss term) and the dataset action read under ``action``."""

    Keys = BCKeys

    def __init__(self, actor, *, check_finite: bool = False) -> None:
        super().__init__(check_finite)
        self.actor = actor


class BCLoss(_CloningLoss):
    """Deterministic behaviour cloning: ``loss_actor = mean((mu(s) - a)^2)``.

    Args:
        actor: a deterministic actor writing ``action`` (e.g. :class:`~tdrl.core.modules.Actor`).
        check_finite: raise on a NaN/inf loss term.

    Reads the dataset action under ``action`` (rebind with ``set_keys(action=...)``).
    Returns ``loss_actor`` and the diagnostic ``action_error`` (mean absolute error).
    """

    def forward(self, td: TensorDictBase) -> TensorDict:
        data_action = self._get(td, "action")
        key = self.tensor_keys.action  # the actor must write its action there
        action = run_module(self.actor, td.exclude(key), key, type(self).__name__)
        return self._output({
            "loss_actor": bc_mse(action, data_action),
            "action_error": (action - data_action).abs().mean(),
        })


class GaussianBCLoss(_CloningLoss):
    """Stochastic behaviour cloning by maximum likelihood:
    ``loss_actor = -mean(log pi(a | s))``.

    Args:
        actor: a probabilistic actor with ``get_dist(td)`` (e.g. a ``ProbabilisticActor``
            over ``IndependentNormal`` or ``TanhNormal``; the latter clamps dataset actions
            on the bounds into the open interval before ``atanh``).
        check_finite: raise on a NaN/inf loss term.

    Returns ``loss_actor`` and the diagnostic ``entropy`` when the distribution has one in
    closed form.
    """

    def forward(self, td: TensorDictBase) -> TensorDict:
        data_action = self._get(td, "action")
        dist = get_dist(self.actor, td)
        log_prob = dist.log_prob(data_action)
        if log_prob.shape != td.shape:
            raise ValueError(
                f"{type(self).__name__}: log_prob has shape {tuple(log_prob.shape)}, expected "
                f"the batch shape {tuple(td.shape)} (use a distribution over the whole action, "
                "e.g. IndependentNormal / TanhNormal)."
            )
        terms = {"loss_actor": -log_prob.mean()}
        try:
            terms["entropy"] = dist.entropy().mean()
        except NotImplementedError:
            pass
        return self._output(terms)
