"""Deep deterministic policy gradient (Lillicrap et al., 2016, arXiv:1509.02971)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDict, TensorDictBase
from torch import Tensor

from tdrl.core import keys as K
from tdrl.core.objectives._nets import run_module
from tdrl.core.objectives.common import BootstrapKeys, LossModule, check_distance, distance_loss
from tdrl.core.values._utils import NestedKey
from tdrl.core.torchrl_names import accept_torchrl_names

__all__ = ["QKeys", "DDPGLoss"]


@dataclass
class QKeys(BootstrapKeys):
    """Keys of the off-policy actor-critic losses (DDPG, TD3, SAC, IQL, CQL): the action, the
    critics' outputs, and :class:`BootstrapKeys`."""

    action: NestedKey = K.ACTION
    state_action_value: NestedKey = K.STATE_ACTION_VALUE
    state_value: NestedKey = K.STATE_VALUE
    action_value: NestedKey = K.ACTION_VALUE


@accept_torchrl_names
class DDPGLoss(LossModule):
    """DDPG: ``Q(s, a) -> r + gamma (1 - terminated) Q'(s', mu'(s'))`` and
    ``max_mu Q(s, mu(s))``.

    Args:
        actor: deterministic actor writing ``action``.
        qvalue: critic writing ``state_action_value`` ``[*B, 1]`` from (observation, action).
        gamma: discount. loss_function: ``"l2"`` (0.5 x squared error), ``"mse"`` (TorchRL's ``"l2"``), ``"l1"`` or ``"smooth_l1"``.
        delay_actor: the target's next action comes from a frozen target actor (the paper's
            DDPG); False: from the online actor, without gradient (TorchRL's ``DDPGLoss``
            default, which BenchMARL's MADDPG / IDDPG keep).
        check_finite: raise on a NaN/inf loss term.

    Target critic (and actor, with ``delay_actor``) are frozen copies (update with ``SoftUpdate``). The actor loss
    flows through the critic with its parameters detached, so one optimiser over all
    parameters is correct. Returns ``loss_actor``, ``loss_qvalue`` and diagnostics.
    """

    Keys = QKeys

    def __init__(
        self,
        actor,
        qvalue,
        *,
        gamma: float = 0.99,
        loss_function: str = "l2",
        delay_actor: bool = True,
        check_finite: bool = False,
    ) -> None:
        super().__init__(check_finite)
        self.actor, self.qvalue = actor, qvalue
        if delay_actor:
            self._add_target("actor", actor)
        self._add_target("qvalue", qvalue)
        self.delay_actor = delay_actor
        self.gamma, self.loss_function = float(gamma), check_distance(loss_function)

    def _action(self, actor, td: TensorDictBase) -> Tensor:
        return run_module(actor, td, self.tensor_keys.action, type(self).__name__)

    def qvalue_loss(self, td: TensorDictBase) -> dict[str, Tensor]:
        """Critic terms: ``loss_qvalue``, ``td_error``, ``q_mean``, ``target_mean``."""
        q = self._q_values(self.qvalue, td)
        next_td = self._next_td(td)
        with torch.no_grad():
            next_action = self._action(self.target_actor if self.delay_actor else self.actor, next_td)
            target = self._bootstrap(td, self._q_values(self.target_qvalue, next_td, next_action), self.gamma)
        td_error = (q - target).detach().abs()
        td.set(self.tensor_keys.priority, td_error.reshape(td.shape))
        return {
            "loss_qvalue": distance_loss(q, target, self.loss_function).mean(),
            "td_error": td_error.mean(),
            "q_mean": q.mean(),
            "target_mean": target.mean(),
        }

    def actor_loss(self, td: TensorDictBase) -> dict[str, Tensor]:
        """Actor term ``loss_actor = -Q(s, mu(s))`` (critic parameters detached)."""
        action = self._action(self.actor, td)
        return {"loss_actor": -self._q_values(self.qvalue, td, action, detach_params=True).mean()}

    def forward(self, td: TensorDictBase) -> TensorDict:
        return self._output({**self.actor_loss(td), **self.qvalue_loss(td)})
