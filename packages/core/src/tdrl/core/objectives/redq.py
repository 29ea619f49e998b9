"""Randomized ensembled double Q-learning (REDQ; Chen, Wang, Zhou & Ross, 2021,
"Randomized Ensembled Double Q-Learning: Learning Fast Without a Model", arXiv:2101.05982).

SAC with an ensemble of ``N`` critics (10 in the paper): each critic's target takes the min
over a random subset of ``M`` (2) target critics, drawn afresh at every update, and the actor
maximises the mean of all ``N`` critics. The high update-to-data ratio (``G = 20`` in the
paper) is the training loop's choice (``utd_ratio`` of ``apps/sac``)."""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from torch import Tensor

from tdrl.core.objectives.common import distance_loss
from tdrl.core.objectives.sac import SACLoss

__all__ = ["REDQLoss", "redq_target"]


def redq_target(next_qs: Tensor, subset: Tensor, next_log_prob: Tensor, alpha: Tensor | float,
                reward: Tensor, not_terminated: Tensor, gamma: float) -> Tensor:
    """``r + gamma * (1 - terminated) * (min_{i in subset} Q'_i(s', a') - alpha log pi(a'|s'))``
    (eq. 1 of the paper with SAC's entropy term).

    Args:
        next_qs: target critics' values at ``(s', a')``, ``[N, *B, 1]``.
        subset: indices of the ``M`` critics the minimum is taken over, ``[M]``.
        next_log_prob: ``log pi(a'|s')`` ``[*B, 1]``. alpha: entropy temperature.
        reward, not_terminated: ``[*B, 1]``. gamma: discount.

    Returns:
        The target ``[*B, 1]``, shared by all ``N`` critics.
    """
    next_v = next_qs[subset].min(0).values - alpha * next_log_prob
    return reward + gamma * not_terminated * next_v


class REDQLoss(SACLoss):
    """REDQ: SAC's actor and temperature, ``num_qvalue_nets`` critics (default 10) with the
    in-target minimisation over a random subset of ``subset_size`` (default 2) of them.

    Args:
        actor, qvalue: as :class:`~tdrl.core.objectives.SACLoss` (``qvalue`` is copied
            ``num_qvalue_nets`` times, the copies re-initialised).
        num_qvalue_nets: ensemble size ``N``. subset_size: ``M`` (1 <= M <= N; ``M = N``
            is SAC's clipped target over all critics).
        generator: optional ``torch.Generator`` for the subset draws (default: torch's
            global RNG, which the apps checkpoint).
        **sac_kwargs: ``gamma``, ``alpha_init``, ``fixed_alpha``, ``target_entropy``,
            ``loss_function``, ``check_finite`` of :class:`SACLoss`.

    ``loss_qvalue`` sums the ``N`` critics' mean losses; ``loss_actor`` is
    ``alpha log pi(a|s) - mean_i Q_i(s, a)``. Only the ``M`` drawn target critics are run.
    """

    def __init__(self, actor, qvalue, *, num_qvalue_nets: int = 10, subset_size: int = 2,
                 generator: torch.Generator | None = None, **sac_kwargs) -> None:
        if not isinstance(subset_size, int) or not 1 <= subset_size <= num_qvalue_nets:
            raise ValueError(f"REDQLoss: subset_size must be an int in [1, num_qvalue_nets="
                             f"{num_qvalue_nets}], got {subset_size!r}.")
        super().__init__(actor, qvalue, num_qvalue_nets=num_qvalue_nets, **sac_kwargs)
        self.num_qvalue_nets, self.subset_size, self.generator = num_qvalue_nets, subset_size, generator

    def draw_subset(self) -> Tensor:
        """``subset_size`` distinct critic indices, sorted, drawn uniformly."""
        perm = torch.randperm(self.num_qvalue_nets, generator=self.generator)
        return perm[: self.subset_size].sort().values

    def qvalue_loss(self, td: TensorDictBase) -> dict[str, Tensor]:
        """Critic terms: ``loss_qvalue`` (summed over the ``N`` critics), diagnostics and the
        ``subset`` drawn for this update."""
        k = self.tensor_keys
        qs = self._qs(self.qvalue, td, self._get(td, "action"))
        next_td = self._next_td(td)
        subset = self.draw_subset()
        with torch.no_grad():
            next_action, next_lp = self._sample(next_td)
            drawn = [self.target_qvalue[int(i)] for i in subset]
            next_qs = self._qs(drawn, next_td, next_action)
            every = torch.arange(len(drawn))
            reward = self._get_next(td, "reward").reshape(next_qs.shape[1:])
            not_term = (~self._get_next(td, "terminated").bool()).reshape(reward.shape)
            next_lp = self._align(next_lp, next_qs[0])
            target = redq_target(next_qs, every, next_lp, self.temperature.alpha_for(next_lp), reward,
                                 not_term.to(reward.dtype), self.gamma)
        loss = distance_loss(qs, target.expand_as(qs), self.loss_function)
        td_error = (qs - target).detach().abs().max(0).values
        td.set(k.priority, td_error.reshape(td.shape))
        return {
            "loss_qvalue": loss.mean(tuple(range(1, qs.dim()))).sum(),
            "td_error": td_error.mean(),
            "q_mean": qs.mean(),
            "target_mean": target.mean(),
            "q_std": qs.std(0).mean(),
        }

    def _actor_q(self, qs: Tensor) -> Tensor:
        """REDQ's actor maximises the mean over all critics (SAC's :meth:`actor_loss` otherwise)."""
        return qs.mean(0)
