"""Deep Q-learning (Mnih et al., 2015) with double DQN (van Hasselt et al., 2016,
arXiv:1509.06461). A dueling network (arXiv:1511.06581) is a choice of network
(:class:`~tdrl.core.modules.DuelingHead`), not of loss."""

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

__all__ = ["DQNKeys", "DQNLoss", "gather_action_value"]


@dataclass
class DQNKeys(BootstrapKeys):
    """Keys of :class:`DQNLoss`: the action, the Q-values, the action mask and
    :class:`BootstrapKeys`."""

    action: NestedKey = K.ACTION
    action_value: NestedKey = K.ACTION_VALUE
    action_mask: NestedKey = K.ACTION_MASK


def gather_action_value(q: Tensor, action: Tensor) -> Tensor:
    """``Q(s, a)`` ``[*B, 1]`` from ``q`` ``[*B, n]`` and the action taken.

    The action is an index ``[*B]`` / ``[*B, 1]`` (any integer dtype), or a one-hot ``[*B, n]``
    of any dtype: bool (TorchRL's ``OneHot`` default), int64 (what tdrl's ``GymEnv`` and its
    random frames write for a ``Discrete`` space) or float. With ``n == 1`` an integer
    ``[*B, 1]`` is read as an index (both readings give ``q``).

    The values are not checked (no device sync per call): ``check_actions=True`` on the env
    checks them where they are written.

    Raises:
        ValueError: any other shape or dtype; the message names both accepted forms.
    """
    integer = not (action.is_floating_point() or action.dtype == torch.bool)
    if action.shape == q.shape and not (integer and q.shape[-1] == 1):
        return (q * action.to(q.dtype)).sum(-1, keepdim=True)
    if integer and action.shape == q.shape[:-1]:
        action = action.unsqueeze(-1)
    if integer and action.shape == (*q.shape[:-1], 1):
        return q.gather(-1, action.long())
    expected = (f"expected an index {tuple(q.shape[:-1])} or {(*q.shape[:-1], 1)} (integer dtype), "
                f"or a one-hot {tuple(q.shape)} (bool, integer or float) for action values "
                f"{tuple(q.shape)}")
    raise ValueError(f"action has dtype {action.dtype} and shape {tuple(action.shape)}; {expected}.")


@accept_torchrl_names
class DQNLoss(LossModule):
    """TD loss of a Q network against a frozen target network.

    Args:
        value_network: module writing ``action_value`` ``[*B, n_actions]`` (e.g. a
            :class:`~tdrl.core.modules.QValueActor`).
        gamma: discount.
        double_dqn: choose the next action with the online net, evaluate with the target.
        loss_function: ``"l2"`` (0.5 x squared error), ``"mse"`` (TorchRL's ``"l2"``), ``"l1"`` or ``"smooth_l1"`` (Huber, the default).
        use_action_mask: mask disallowed next actions (``action_mask`` under ``"next"``).
        check_finite: raise on a NaN/inf loss term, naming it.

    Update the target with :class:`~tdrl.core.objectives.HardUpdate` (or ``SoftUpdate``).
    Writes the absolute TD error to ``td["td_error"]`` (``[*B]``) for prioritized replay.
    Returns ``loss_qvalue`` (also as ``loss``, TorchRL's name) and the diagnostics ``td_error``,
    ``q_mean``, ``target_mean``.
    """

    Keys = DQNKeys

    def __init__(
        self,
        value_network,
        *,
        gamma: float = 0.99,
        double_dqn: bool = False,
        loss_function: str = "smooth_l1",
        use_action_mask: bool = False,
        check_finite: bool = False,
    ) -> None:
        super().__init__(check_finite)
        self.value_network = value_network
        self._add_target("value_network", value_network)
        self.gamma, self.double_dqn = float(gamma), double_dqn
        self.loss_function, self.use_action_mask = check_distance(loss_function), use_action_mask

    def _q(self, net, td: TensorDictBase) -> Tensor:
        return run_module(net, td, self.tensor_keys.action_value, type(self).__name__)

    def forward(self, td: TensorDictBase) -> TensorDict:
        q = self._q(self.value_network, td)
        q_a = gather_action_value(q, self._get(td, "action"))
        next_td = self._next_td(td)
        with torch.no_grad():
            next_q_target = self._q(self.target_value_network, next_td)
            selector = self._q(self.value_network, next_td) if self.double_dqn else next_q_target
            if self.use_action_mask:
                mask = self._get(next_td, "action_mask").bool()
                selector = selector.masked_fill(~mask, torch.finfo(selector.dtype).min)
            best = selector.argmax(-1, keepdim=True)
            next_value = next_q_target.gather(-1, best)
            target = self._bootstrap(td, next_value, self.gamma)
        loss = distance_loss(q_a, target, self.loss_function).mean()
        td_error = (q_a - target).detach().abs()
        td.set(self.tensor_keys.priority, td_error.reshape(td.shape))
        return self._output(
            {
                "loss_qvalue": loss,
                "loss": loss,  # TorchRL's DQNLoss output name (not a loss_* key: total_loss counts it once)
                "td_error": td_error.mean(),
                "q_mean": q_a.mean(),
                "target_mean": target.mean(),
            }
        )
