"""TD3+BC (Fujimoto & Gu, 2021, "A Minimalist Approach to Offline Reinforcement Learning",
arXiv:2106.06860): TD3 with a behaviour-cloning term in the actor loss. Composition: the
critic terms and target networks come from an inner :class:`~tdrl.core.objectives.TD3Loss`."""

from __future__ import annotations

from tensordict import TensorDict, TensorDictBase
from torch import Tensor

from tdrl.core.objectives._nets import run_module
from tdrl.core.objectives.bc import bc_mse
from tdrl.core.objectives.common import LossModule
from tdrl.core.objectives.ddpg import QKeys
from tdrl.core.objectives.td3 import TD3Loss
from tdrl.core.torchrl_names import accept_torchrl_names

__all__ = ["TD3BCLoss", "td3_bc_actor_loss"]


def td3_bc_actor_loss(q: Tensor, policy_action: Tensor, data_action: Tensor,
                      alpha: float) -> tuple[Tensor, Tensor]:
    """``-lambda * mean(Q(s, pi(s))) + mean((pi(s) - a)^2)`` with
    ``lambda = alpha / mean|Q(s, pi(s))|`` (the normaliser detached), eq. 3 of the paper.

    Args:
        q: ``Q_1(s, pi(s))`` ``[*B, 1]``. policy_action, data_action: ``[*B, A]``.
        alpha: the paper's alpha (2.5).

    Returns:
        ``(loss, lambda)``, two scalars.
    """
    lmbda = alpha / q.abs().mean().detach().clamp_min(1e-8)
    return -lmbda * q.mean() + bc_mse(policy_action, data_action), lmbda


@accept_torchrl_names
class TD3BCLoss(LossModule):
    """TD3+BC: the TD3 critic (clipped double-Q, target smoothing) and the actor loss
    ``-lambda * Q_1(s, pi(s)) + (pi(s) - a)^2``, ``lambda = alpha / mean|Q_1(s, pi(s))|``.

    Args:
        actor: deterministic actor writing ``action``.
        qvalue: critic writing ``state_action_value`` (``num_qvalue_nets`` copies, as TD3).
        action_low, action_high: action bounds of the smoothed target action.
        alpha: weight of the RL term against behaviour cloning (2.5 in the paper).
        **td3_kwargs: passed to :class:`~tdrl.core.objectives.TD3Loss` (``gamma``,
            ``policy_noise``, ``noise_clip``, ``num_qvalue_nets``, ``loss_function``).

    The paper also normalises the dataset's observations (mean/std over the dataset); that
    is data preparation, done before the loss. As in TD3, the delayed actor update is the
    loop's choice: ``qvalue_loss(td)`` every step, ``actor_loss(td)`` every ``d`` steps.
    Returns ``loss_actor``, ``loss_qvalue`` and diagnostics (``lmbda``, ``bc_loss``, ...).
    """

    Keys = QKeys

    def __init__(self, actor, qvalue, *, action_low: float | Tensor,
                 action_high: float | Tensor, alpha: float = 2.5, check_finite: bool = False,
                 **td3_kwargs) -> None:
        super().__init__(check_finite)
        if alpha < 0:
            raise ValueError(f"alpha must be >= 0, got {alpha}.")
        self.td3 = self._build_on("td3", TD3Loss(actor, qvalue, action_low=action_low, action_high=action_high,
                                                 check_finite=check_finite, **td3_kwargs))
        self.alpha = float(alpha)

    @property
    def actor(self):
        return self.td3.actor

    @property
    def qvalue(self):
        return self.td3.qvalue

    def qvalue_loss(self, td: TensorDictBase) -> dict[str, Tensor]:
        """The TD3 critic terms (``loss_qvalue`` and diagnostics)."""
        return self.td3.qvalue_loss(td)

    def actor_loss(self, td: TensorDictBase) -> dict[str, Tensor]:
        """``loss_actor`` (gradients reach the actor only) and ``lmbda``, ``bc_loss``."""
        k, name = self.tensor_keys, type(self).__name__
        data_action = self._get(td, "action")
        action = run_module(self.actor, td.exclude(k.action), k.action, name)
        q = run_module(self.qvalue[:1], td, k.state_action_value, name,
                            {k.action: action}, detach_params=True)[0]
        loss, lmbda = td3_bc_actor_loss(q, action, data_action, self.alpha)
        return {"loss_actor": loss, "lmbda": lmbda, "bc_loss": bc_mse(action, data_action),
                "actor_q_mean": q.mean()}

    def forward(self, td: TensorDictBase) -> TensorDict:
        return self._output({**self.actor_loss(td), **self.qvalue_loss(td)})
