"""Randomized ensembled double Q-learning (REDQ; Chen, Wang, Zhou & Ross, 2021,
"Randomized Ensembled Double Q-Learning: Learning Fast Without a Model", arXiv:2101.05982).

SAC with an ensemble of ``N`` critics (10 in the paper): each critic's target takes the min
over a random subset of ``M`` (2) target critics, drawn afresh at every update, and the actor
maximises the mean of all ``N`` critics. The high update-to-data ratio (``G = 20`` in the
paper) is the training loop's choice (``utd_ratio`` of ``apps/sac``; its ``policy_delay`` sets the
paper's one actor step per ``G`` critic steps).

The ``N`` critics are one stacked network (:class:`CriticEnsemble` over
:class:`~tdrl.core.train.SeedStackedModule`): one batched forward for all of them, and the
``M`` drawn target critics run by indexing the stacked target parameters."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule
from torch import Tensor, nn

from tdrl.core.objectives.common import make_target
from tdrl.core.objectives.sac import SACLoss
from tdrl.core.modules.stacked import SeedStackedModule
from tdrl.core.values._utils import require
from tdrl.core.values.nstep import step_discount
from tdrl.core.torchrl_names import accept_torchrl_names

__all__ = ["CriticEnsemble", "REDQLoss", "redq_target"]


def redq_target(next_qs: Tensor, subset: Tensor, next_log_prob: Tensor, alpha: Tensor | float,
                reward: Tensor, not_terminated: Tensor, gamma: float | Tensor) -> Tensor:
    """``r + gamma * (1 - terminated) * (min_{i in subset} Q'_i(s', a') - alpha log pi(a'|s'))``
    (eq. 1 of the paper with SAC's entropy term).

    Args:
        next_qs: target critics' values at ``(s', a')``, ``[N, *B, 1]``.
        subset: indices of the ``M`` critics the minimum is taken over, ``[M]``.
        next_log_prob: ``log pi(a'|s')`` ``[*B, 1]``. alpha: entropy temperature.
        reward, not_terminated: ``[*B, 1]``. gamma: discount (``[*B, 1]`` on n-step data).

    Returns:
        The target ``[*B, 1]``, shared by all ``N`` critics.
    """
    next_v = next_qs[subset].min(0).values - alpha * next_log_prob
    return reward + gamma * not_terminated * next_v


class CriticEnsemble(nn.Module):
    """``num_nets`` critics of one architecture as one stacked network, all run in one batched
    call (:class:`~tdrl.core.train.SeedStackedModule`: one ``baddbmm`` per layer of an MLP,
    ``vmap`` over ``functional_call`` otherwise).

    Args:
        critics: plain TensorDict modules of one architecture with one out key (e.g. a
            :class:`~tdrl.core.modules.ValueOperator` over an MLP); their weights are stacked.

    The stacked parameters are ``[groups * num_nets, *shape]``: member ``g * num_nets + i`` is
    critic ``i`` of group ``g``, and group ``g`` serves the ``g``-th of ``groups`` equal blocks of
    rows (``groups`` is 1 unless :meth:`concat` joined several ensembles).
    """

    def __init__(self, critics: Sequence[nn.Module]) -> None:
        super().__init__()
        first = critics[0] if critics else None
        if not (isinstance(first, TensorDictModule) and type(first).forward is TensorDictModule.forward
                and len(first.out_keys) == 1):
            raise TypeError("CriticEnsemble: each critic must be a plain TensorDictModule with one out key "
                            f"(e.g. ValueOperator(MLP(...), in_keys=[...], out_keys=[...])), got {type(first).__name__}.")
        self.in_keys, self.out_key = list(first.in_keys), first.out_keys[0]
        self.num_nets, self.groups = len(critics), 1
        self.net = SeedStackedModule([c.module for c in critics])

    @classmethod
    def concat(cls, parts: Sequence["CriticEnsemble"]) -> "CriticEnsemble":
        """Several ensembles of one size as one: ``parts[g]``'s critics serve row block ``g``."""
        if any(p.num_nets != parts[0].num_nets for p in parts):
            raise ValueError("CriticEnsemble.concat: the ensembles differ in size.")
        out = cls.__new__(cls)
        nn.Module.__init__(out)
        out.in_keys, out.out_key, out.num_nets = parts[0].in_keys, parts[0].out_key, parts[0].num_nets
        out.groups = sum(p.groups for p in parts)
        out.net = SeedStackedModule.concat([p.net for p in parts])
        return out

    def forward(self, inputs: Sequence[Tensor], index: Tensor | None = None, detach: bool = False) -> Tensor:
        """Every critic (or the critics ``index``) on the same inputs.

        Args:
            inputs: one tensor per in key, ``[*B, ...]`` (``groups`` equal blocks of rows).
            index: optional critic indices ``[K]`` (the same in every group).
            detach: detached parameters (gradients reach the inputs only).

        Returns:
            ``[K, *B, ...]`` (``K = num_nets`` without ``index``).
        """
        s, k = self.groups, self.num_nets if index is None else int(index.numel())
        lead = inputs[0].shape[:-1]
        rows = lead.numel()
        if rows % s:
            raise ValueError(f"CriticEnsemble: {rows} rows are not {s} equal blocks (one per group).")
        r, nd = rows // s, len(lead)
        xs = [x.reshape(s, 1, r, *x.shape[nd:]).expand(s, k, r, *x.shape[nd:]).reshape(s * k * r, *x.shape[nd:])
              for x in inputs]
        members = None
        if index is not None:
            members = (torch.arange(s, device=index.device)[:, None] * self.num_nets + index[None]).reshape(-1)
        out = self.net(*xs, index=members, detach=detach)
        return out.reshape(s, k, r, *out.shape[1:]).transpose(0, 1).reshape(k, *lead, *out.shape[1:])


@accept_torchrl_names
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
    ``qvalue`` / ``target_qvalue`` are :class:`CriticEnsemble` s (stacked parameters).
    """

    def __init__(self, actor, qvalue, *, num_qvalue_nets: int = 10, subset_size: int = 2,
                 generator: torch.Generator | None = None, **sac_kwargs) -> None:
        if not isinstance(subset_size, int) or not 1 <= subset_size <= num_qvalue_nets:
            raise ValueError(f"REDQLoss: subset_size must be an int in [1, num_qvalue_nets="
                             f"{num_qvalue_nets}], got {subset_size!r}.")
        super().__init__(actor, qvalue, num_qvalue_nets=num_qvalue_nets, **sac_kwargs)
        self.num_qvalue_nets, self.subset_size, self.generator = num_qvalue_nets, subset_size, generator
        self.qvalue = CriticEnsemble(list(self.qvalue))  # SAC's N copies, stacked
        self.target_qvalue = make_target(self.qvalue)

    def _qs(self, nets: CriticEnsemble, td, action, detach_params=False, index: Tensor | None = None) -> Tensor:
        """``[N, *B, 1]`` values of the ensemble ``nets`` (``[K, *B, 1]`` for critics ``index``)."""
        act = self.tensor_keys.action
        args = [action if key == act else require(td, key, type(self).__name__) for key in nets.in_keys]
        return nets(args, index=index, detach=detach_params)

    def draw_subset(self) -> Tensor:
        """``subset_size`` distinct critic indices, sorted, drawn uniformly."""
        perm = torch.randperm(self.num_qvalue_nets, generator=self.generator)
        return perm[: self.subset_size].sort().values

    def qvalue_loss(self, td: TensorDictBase) -> dict[str, Tensor]:
        """Critic terms: ``loss_qvalue`` (summed over the ``N`` critics), diagnostics and the
        ``subset`` drawn for this update."""
        qs = self._qs(self.qvalue, td, self._get(td, "action"))
        next_td = self._next_td(td)
        subset = self.draw_subset()
        with torch.no_grad():
            next_action, next_lp = self._sample(next_td)
            next_qs = self._qs(self.target_qvalue, next_td, next_action, index=subset)
            every = torch.arange(len(subset))
            reward = self._get_next(td, "reward").reshape(next_qs.shape[1:])
            not_term = (~self._get_next(td, "terminated").bool()).reshape(reward.shape)
            next_lp = self._align(next_lp, next_qs[0])
            target = redq_target(next_qs, every, next_lp, self.temperature.alpha_for(next_lp), reward,
                                 not_term.to(reward.dtype), step_discount(td, self.gamma, reward))
        return {**self._ensemble_critic_terms(td, qs, target), "q_std": qs.std(0).mean()}

    def _actor_q(self, qs: Tensor) -> Tensor:
        """REDQ's actor maximises the mean over all critics (SAC's :meth:`actor_loss` otherwise)."""
        return qs.mean(0)
