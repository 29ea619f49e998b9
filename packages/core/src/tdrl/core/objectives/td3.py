"""Twin delayed DDPG (Fujimoto et al., 2018, arXiv:1802.09477)."""

from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase
from torch import Tensor

from tdrl.core.objectives._nets import make_ensemble, run_module
from tdrl.core.objectives.common import LossModule, check_distance
from tdrl.core.objectives.ddpg import QKeys
from tdrl.core.torchrl_names import accept_torchrl_names

__all__ = ["TD3Loss"]


@accept_torchrl_names
class TD3Loss(LossModule):
    """TD3: clipped double-Q targets with target policy smoothing.

    Args:
        actor: deterministic actor writing ``action``.
        qvalue: critic writing ``state_action_value``; ``num_qvalue_nets`` copies are made
            (the first is ``qvalue`` itself, the others re-initialised).
        action_low, action_high: action bounds (floats or tensors) for the smoothed target
            action.
        gamma: discount. policy_noise, noise_clip: target smoothing noise (in action units).
        num_qvalue_nets: number of critics (2 in the paper).
        loss_function: critic distance. check_finite: raise on a NaN/inf loss term.

    The delayed policy update is the training loop's choice: call ``qvalue_loss(td)``
    every step and ``actor_loss(td)`` every ``d`` steps, or ``forward`` for both.
    """

    Keys = QKeys

    def __init__(
        self,
        actor,
        qvalue,
        *,
        action_low: float | Tensor,
        action_high: float | Tensor,
        gamma: float = 0.99,
        policy_noise: float = 0.2,
        noise_clip: float = 0.5,
        num_qvalue_nets: int = 2,
        loss_function: str = "l2",
        check_finite: bool = False,
    ) -> None:
        super().__init__(check_finite)
        self.actor = actor
        self.qvalue = make_ensemble(qvalue, num_qvalue_nets)
        self._add_target("actor", actor)
        self._add_target("qvalue", self.qvalue)
        self.register_buffer("action_low", torch.as_tensor(action_low, dtype=torch.float32))
        self.register_buffer("action_high", torch.as_tensor(action_high, dtype=torch.float32))
        self.gamma, self.policy_noise, self.noise_clip = float(gamma), policy_noise, noise_clip
        self.loss_function = check_distance(loss_function)

    def qvalue_loss(self, td: TensorDictBase) -> dict[str, Tensor]:
        """Critic terms: ``loss_qvalue`` (summed over critics) and diagnostics."""
        k, name = self.tensor_keys, type(self).__name__
        qs = self._q_values(self.qvalue, td)  # [n, *B, 1]
        next_td = self._next_td(td)
        with torch.no_grad():
            next_action = run_module(self.target_actor, next_td, k.action, name)
            noise = (torch.randn_like(next_action) * self.policy_noise).clamp(
                -self.noise_clip, self.noise_clip
            )
            low = self.action_low.to(next_action.dtype)
            high = self.action_high.to(next_action.dtype)
            next_action = torch.clamp(next_action + noise, low, high)
            next_q = self._q_values(self.target_qvalue, next_td, next_action).min(0).values
            target = self._bootstrap(td, next_q, self.gamma)
        return self._ensemble_critic_terms(td, qs, target)

    def actor_loss(self, td: TensorDictBase) -> dict[str, Tensor]:
        """``loss_actor = -Q_1(s, mu(s))`` with the critic's parameters detached."""
        action = run_module(self.actor, td, self.tensor_keys.action, type(self).__name__)
        q = self._q_values(self.qvalue[:1], td, action, detach_params=True)[0]
        return {"loss_actor": -q.mean()}

    def forward(self, td: TensorDictBase) -> TensorDict:
        return self._output({**self.actor_loss(td), **self.qvalue_loss(td)})
