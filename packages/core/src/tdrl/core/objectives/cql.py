"""Conservative Q-learning for offline RL, CQL(H) on top of SAC (Kumar et al., 2020,
arXiv:2006.04779). Composition: the SAC terms come from an inner :class:`SACLoss`; this
module adds the conservative penalty."""

from __future__ import annotations

import math

import torch
from tensordict import TensorDict, TensorDictBase
from torch import Tensor

from tdrl.core.objectives._nets import get_dist, run_module, sample_with_log_prob
from tdrl.core.objectives.common import LossModule
from tdrl.core.objectives.ddpg import QKeys
from tdrl.core.objectives.sac import SACLoss
from tdrl.core.torchrl_names import accept_torchrl_names

__all__ = ["CQLLoss"]


@accept_torchrl_names
class CQLLoss(LossModule):
    """SAC losses plus the CQL(H) penalty
    ``T * logsumexp(Q(s, a') / T) - Q(s, a_data)`` over sampled actions ``a'``
    (uniform, policy at ``s`` and policy at ``s'``, importance-corrected).

    Args:
        actor, qvalue: as :class:`SACLoss`.
        action_low, action_high: bounds for the uniform actions.
        num_random: actions sampled from each of the three proposals per state.
        min_q_weight: weight of the penalty (alpha of the paper, 5.0 for MuJoCo offline).
        temperature: of the logsumexp.
        **sac_kwargs: passed to :class:`SACLoss` (gamma, num_qvalue_nets, alpha_init, ...).

    Returns the SAC terms, ``loss_cql`` and the diagnostic ``cql_gap``.
    """

    Keys = QKeys

    def __init__(
        self,
        actor,
        qvalue,
        *,
        action_low: float | Tensor,
        action_high: float | Tensor,
        num_random: int = 10,
        min_q_weight: float = 5.0,
        temperature: float = 1.0,
        check_finite: bool = False,
        **sac_kwargs,
    ) -> None:
        super().__init__(check_finite)
        self.sac = self._build_on("sac", SACLoss(actor, qvalue, check_finite=check_finite, **sac_kwargs))
        self.register_buffer("action_low", torch.as_tensor(action_low, dtype=torch.float32))
        self.register_buffer("action_high", torch.as_tensor(action_high, dtype=torch.float32))
        self.num_random, self.min_q_weight = int(num_random), float(min_q_weight)
        self.temperature = float(temperature)

    def cql_loss(self, td: TensorDictBase) -> dict[str, Tensor]:
        """The conservative penalty ``loss_cql`` (summed over critics)."""
        k, n = self.tensor_keys, self.num_random
        name = type(self).__name__
        action = self._get(td, "action")
        low = self.action_low.to(action.dtype).expand(action.shape[-1:])
        high = self.action_high.to(action.dtype).expand(action.shape[-1:])
        rand = low + (high - low) * torch.rand(n, *action.shape, device=action.device)
        log_density = -torch.log(high - low).sum()
        with torch.no_grad():
            a_curr, lp_curr = sample_with_log_prob(get_dist(self.sac.actor, td), (n,))
            a_next, lp_next = sample_with_log_prob(get_dist(self.sac.actor, self._next_td(td)), (n,))
        td_rep = td.exclude("next").expand(n, *td.shape)
        qnets = self.sac.qvalue

        def q_at(a: Tensor) -> Tensor:  # [n_nets, n, *B]
            return run_module(qnets, td_rep, k.state_action_value, name, {k.action: a})[..., 0]

        cat = torch.cat(
            [
                q_at(rand) - log_density,
                q_at(a_curr) - lp_curr.reshape(n, *td.shape),
                q_at(a_next) - lp_next.reshape(n, *td.shape),
            ],
            dim=1,
        )  # [n_nets, 3n, *B]
        t = self.temperature
        lse = t * torch.logsumexp(cat / t, dim=1) - t * math.log(3 * n)
        q_data = run_module(qnets, td, k.state_action_value, name)[..., 0]  # [n_nets, *B]
        gap = lse - q_data
        loss = self.min_q_weight * gap.mean(tuple(range(1, gap.dim()))).sum()
        return {"loss_cql": loss, "cql_gap": gap.mean()}

    def forward(self, td: TensorDictBase) -> TensorDict:
        terms = {**self.sac.actor_loss(td), **self.sac.qvalue_loss(td), **self.cql_loss(td)}
        return self._output(terms)
