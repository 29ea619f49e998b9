"""What every loss shares: rebindable keys, clear missing-key errors, finite checks,
target networks, and small helpers (entropy estimate, critic distance).

A loss returns a TensorDict whose ``loss_*`` entries are summed for the gradient
(:func:`total_loss`); every other entry is a detached diagnostic.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Iterator

import torch
import torch.distributions as D
from tensordict import TensorDict, TensorDictBase
from torch import Tensor, nn

from tdrl.core.objectives._nets import make_ensemble, run_module
from tdrl.core.values._utils import NestedKey, rebind_keys, require
from tdrl.core.values.nstep import step_discount
from tdrl.core import keys as K
from tdrl.core.keys import next_key

__all__ = [
    "BootstrapKeys", "LossModule", "next_key", "total_loss", "make_target", "DISTANCE_KINDS", "check_distance", "distance_loss", "entropy_estimate",
    "k3_estimate", "masked_mean", "group_optimizers",
]  # fmt: skip


def group_optimizers(*optimizers: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """One optimizer over the parameter groups of several of one class (TorchRL's helper: one
    ``step()`` / ``zero_grad()`` for the actor's, critic's and temperature's optimizers). Each
    group keeps its own settings (lr, eps, weight decay); call it before any step (the
    optimizers' state is not carried over)."""
    if not optimizers:
        raise ValueError("group_optimizers needs at least one optimizer.")
    cls = type(optimizers[0])
    if any(type(o) is not cls for o in optimizers):
        raise ValueError("group_optimizers: the optimizers must be of one class, got "
                         f"{sorted({type(o).__name__ for o in optimizers})}.")
    if any(o.state for o in optimizers):
        raise ValueError("group_optimizers: an optimizer has already stepped; group them before training.")
    groups = [dict(g) for o in optimizers for g in o.param_groups]
    return cls(groups, **{k: v for k, v in optimizers[0].defaults.items() if k not in ("params",)})


def total_loss(loss_td: TensorDictBase) -> Tensor:
    """Sum of the ``loss_*`` entries of a loss output (the scalar to backpropagate)."""
    terms = [v for k, v in loss_td.items() if isinstance(k, str) and k.startswith("loss_")]
    if not terms:
        raise KeyError(f"No 'loss_*' entry in {list(loss_td.keys())}.")
    return torch.stack(terms).sum() if len(terms) > 1 else terms[0]


def make_target(module: nn.Module) -> nn.Module:
    """A frozen deep copy of ``module`` (target network): no gradients, same weights."""
    if any(isinstance(p, nn.parameter.UninitializedParameter) for p in module.parameters()):
        raise ValueError(f"{type(module).__name__} has lazy parameters that are not initialised yet: run it once on a "
                         "batch (building the Collector with it does) before the loss copies it into a target network")
    target = copy.deepcopy(module)
    for p in target.parameters():
        p.requires_grad_(False)
    return target


DISTANCE_KINDS = ("l2", "mse", "l1", "smooth_l1")
"""The critic distances :func:`distance_loss` knows (the ``loss_function`` / ``loss_critic_type``
values every loss accepts)."""


def distance_loss(pred: Tensor, target: Tensor, kind: str = "l2") -> Tensor:
    """Element-wise critic distance, no reduction:

    * ``"l2"``: ``0.5 * (pred - target)**2`` (tdrl's convention: the gradient is the TD error;
      half of TorchRL's ``"l2"``);
    * ``"mse"``: ``(pred - target)**2`` (TorchRL's ``"l2"``: the same update under Adam, twice the
      logged loss and gradient, which matters where gradients are clipped by norm);
    * ``"l1"``; ``"smooth_l1"`` (Huber with delta 1).
    """
    if kind == "l2":
        return 0.5 * (pred - target).pow(2)
    if kind == "mse":
        return (pred - target).pow(2)
    if kind == "l1":
        return (pred - target).abs()
    check_distance(kind)
    return nn.functional.smooth_l1_loss(pred, target, reduction="none")


def check_distance(kind: str) -> str:
    """``kind`` if it is one of :data:`DISTANCE_KINDS` (checked when a loss is built), else a
    ``ValueError`` naming the valid kinds."""
    if kind not in DISTANCE_KINDS:
        raise ValueError(f"loss kind must be one of {', '.join(map(repr, DISTANCE_KINDS))}, got {kind!r}.")
    return kind


def k3_estimate(log_ratio: Tensor, ratio: Tensor | None = None) -> Tensor:
    """The k3 estimator of ``KL(p || q)`` per sample, ``r - 1 - log r`` (>= 0, unbiased).

    The one home of this formula (PPO's and MAPPO's ``kl_approx`` / KL penalty, GRPO's
    reference KL: ``tdrl.llm.k3_kl``). Samples come from ``p``; ``log_ratio`` is
    ``log q - log p`` at them (PPO: ``log pi_new - log pi_old`` under the old policy's
    actions estimates ``KL(old || new)``).

    Args:
        log_ratio: ``log q(x) - log p(x)``, any shape.
        ratio: ``exp(log_ratio)`` when the caller has it already.

    Returns:
        The per-sample estimate, the shape of ``log_ratio``; no reduction.
    """
    if ratio is None:
        ratio = log_ratio.exp()
    return (ratio - 1.0) - log_ratio


def masked_mean(x: Tensor, mask: Tensor | None) -> Tensor:
    """Mean of ``x`` ``[*B, ...]`` over the entries where ``mask`` ``[*B]`` is True (a mask
    with fewer dims broadcasts over the trailing ones); ``mask=None`` is the plain mean, an
    empty mask gives 0."""
    if mask is None:
        return x.mean()
    m = mask.reshape(*mask.shape, *([1] * (x.ndim - mask.ndim))).expand_as(x).to(x.dtype)
    return (x * m).sum() / m.sum().clamp_min(1.0)


def entropy_estimate(dist: D.Distribution, sample: Tensor | None = None) -> Tensor:
    """Closed-form entropy when the distribution has one, else ``-log_prob`` of a
    reparameterised sample (``[*B]``)."""
    try:
        return dist.entropy()
    except NotImplementedError:
        if sample is None:
            sample = dist.rsample() if dist.has_rsample else dist.sample()
        return -dist.log_prob(sample)


@dataclasses.dataclass
class BootstrapKeys:
    """The keys :class:`LossModule`'s own TD helpers use: ``reward`` and ``terminated`` read
    under ``"next"`` by the one-step target, ``priority`` written by the critic terms. The keys
    dataclass of a bootstrapping loss extends it."""

    reward: NestedKey = K.REWARD
    terminated: NestedKey = K.TERMINATED
    priority: NestedKey = "td_error"


class LossModule(nn.Module):
    """Small base of all losses.

    Subclasses set ``Keys`` (a dataclass of key names) and implement ``forward``,
    returning ``self._output({...})``. ``set_keys(**kw)`` rebinds keys;
    ``check_finite=True`` makes the output raise on a NaN/inf term, naming it.
    Target networks are registered with :meth:`_add_target` and updated by
    :class:`~tdrl.core.objectives.SoftUpdate` / :class:`~tdrl.core.objectives.HardUpdate`.
    """

    Keys: type = object

    def __init__(self, check_finite: bool = False) -> None:
        super().__init__()
        self.tensor_keys = self.Keys()
        self.check_finite = check_finite
        self._target_pairs: list[tuple[str, str]] = []
        self._inner_losses: list[str] = []

    # keys -------------------------------------------------------------------------------
    def set_keys(self, **kwargs: NestedKey) -> "LossModule":
        """Rebind key names, e.g. ``loss.set_keys(advantage="adv")``; returns ``self``."""
        self.tensor_keys = rebind_keys(self.tensor_keys, type(self).__name__, **kwargs)
        for name in self._inner_losses:
            getattr(self, name).set_keys(**kwargs)
        return self

    def _build_on(self, name: str, inner: "LossModule") -> "LossModule":
        """Register ``inner`` as ``self.<name>``: a loss this one is built on (CQL on SAC,
        TD3+BC on TD3). :meth:`set_keys` rebinds its keys too and :meth:`target_pairs`
        yields its target networks. Returns ``inner``."""
        setattr(self, name, inner)
        self._inner_losses.append(name)
        return inner

    def _get(self, td: TensorDictBase, field: str) -> Tensor:
        return require(td, getattr(self.tensor_keys, field), type(self).__name__)

    def _get_next(self, td: TensorDictBase, field: str) -> Tensor:
        """``td["next", <key of field>]`` (reward, terminated, ... of step t+1)."""
        return require(td, next_key(getattr(self.tensor_keys, field)), type(self).__name__)

    def _q_values(self, nets: nn.Module, td: TensorDictBase, action: Tensor | None = None,
                  detach_params: bool = False) -> Tensor:
        """``state_action_value`` of a critic (``[*B, 1]``) or of an ensemble of critics (an
        ``nn.ModuleList``: ``[N, *B, 1]``) on ``td``, with ``action`` in place of ``td``'s
        action when given; ``detach_params``: gradients reach the inputs only."""
        k = self.tensor_keys
        overrides = None if action is None else {k.action: action}
        return run_module(nets, td, k.state_action_value, type(self).__name__, overrides, detach_params)

    def _next_td(self, td: TensorDictBase) -> TensorDictBase:
        return require(td, "next", type(self).__name__)

    def _bootstrap(
        self, td: TensorDictBase, next_value: Tensor, gamma: float
    ) -> Tensor:
        """One-step target ``r + gamma * (1 - terminated) * next_value``, ``[*B, 1]``; on n-step
        data (``"steps_to_next_obs"``, :class:`~tdrl.core.transforms.MultiStepTransform`) the
        discount is ``gamma ** steps_to_next_obs``."""
        reward = self._get_next(td, "reward")
        terminated = self._get_next(td, "terminated")
        if reward.shape != next_value.shape:
            reward = reward.reshape(next_value.shape)
        not_term = (~terminated.bool()).reshape(next_value.shape).to(next_value.dtype)
        return reward + step_discount(td, gamma, next_value) * not_term * next_value

    def _ensemble_critic_terms(
        self, td: TensorDictBase, qs: Tensor, target: Tensor, target_mean: bool = True
    ) -> dict[str, Tensor]:
        """The critic terms of an ensemble regressed on one target (SAC, REDQ, TD3, IQL, discrete SAC).

        Args:
            td: the batch; its ``priority`` key receives each sample's largest ``|Q_i - target|``.
            qs: ``[N, *B, 1]`` Q values of the ``N`` critics.
            target: ``[*B, 1]`` TD target (no gradient).
            target_mean: also report ``target_mean``.

        Returns:
            ``loss_qvalue`` (the distance averaged over samples, summed over critics) and the
            diagnostics ``td_error``, ``q_mean`` (and ``target_mean``).
        """
        loss = distance_loss(qs, target.expand_as(qs), self.loss_function)
        td_error = (qs - target).detach().abs().max(0).values
        td.set(self.tensor_keys.priority, td_error.reshape(td.shape))
        terms = {
            "loss_qvalue": loss.mean(tuple(range(1, qs.dim()))).sum(),
            "td_error": td_error.mean(),
            "q_mean": qs.mean(),
        }
        if target_mean:
            terms["target_mean"] = target.mean()
        return terms

    def make_value_estimator(self, value_type=None, **hyperparams: Any) -> "LossModule":
        """TorchRL's call that sets a loss's discount: ``loss.make_value_estimator(gamma=0.99)``.

        tdrl's bootstrapping losses have one estimator, the one-step TD target (n-step with
        ``"steps_to_next_obs"``); ``value_type`` may name it (``"TD0"``, TorchRL's
        ``ValueEstimators.TD0``). ``gamma`` sets the discount, ``device`` is accepted (the target
        is computed where the batch lives); any other setting is refused. Returns ``self``."""
        name = getattr(value_type, "name", value_type)
        if not hasattr(self, "gamma"):
            raise ValueError(f"{type(self).__name__} reads advantages computed beforehand: build the "
                             "estimator yourself (tdrl.core.values.GAE / TDLambda / TD0) and call it on the batch.")
        if name is not None and str(name).upper() != "TD0":
            raise ValueError(f"{type(self).__name__}.make_value_estimator({value_type!r}): tdrl's "
                             "bootstrapping losses use the one-step (TD0) target; for n-step targets, "
                             "put MultiStepTransform on the replay buffer.")
        unknown = set(hyperparams) - {"gamma", "device"}
        if unknown:
            raise ValueError(f"{type(self).__name__}.make_value_estimator: {sorted(unknown)} not "
                             "supported (gamma= and device= are).")
        if "gamma" in hyperparams:
            self.gamma = float(hyperparams["gamma"])
        return self

    # targets ----------------------------------------------------------------------------
    def _add_target(self, name: str, module: nn.Module) -> nn.Module:
        """Register ``target_<name>`` as a frozen copy of ``module`` and return it."""
        target = make_target(module)
        setattr(self, f"target_{name}", target)
        self._target_pairs.append((name, f"target_{name}"))
        return target

    def _add_critics(self, qvalue: nn.Module, n: int) -> None:
        """``self.qvalue``: ``n`` independently initialised copies of ``qvalue``
        (:func:`~tdrl.core.objectives._nets.make_ensemble`), and its frozen target."""
        self.qvalue = make_ensemble(qvalue, n)
        self._add_target("qvalue", self.qvalue)

    def target_pairs(self) -> Iterator[tuple[nn.Module, nn.Module]]:
        """``(online, target)`` module pairs, for the target updaters."""
        for online, target in self._target_pairs:
            yield getattr(self, online), getattr(self, target)
        for name in self._inner_losses:
            yield from getattr(self, name).target_pairs()

    # output -----------------------------------------------------------------------------
    def _output(self, terms: dict[str, Any], batch_size: tuple = ()) -> TensorDict:
        """Build the output TensorDict: ``loss_*`` (and a TorchRL-named ``loss``, which
        :func:`total_loss` does not add) kept with grad, the rest detached."""
        out = {}
        for name, value in terms.items():
            value = torch.as_tensor(value)
            if not name.startswith("loss_") and name != "loss":
                value = value.detach()
            elif self.check_finite and not bool(torch.isfinite(value).all()):
                raise FloatingPointError(
                    f"{type(self).__name__}: term {name!r} is not finite ({value.detach()}). "
                    "Check the inputs (rewards, log-probs, values) and the learning rate."
                )
            out[name] = value
        return TensorDict(out, batch_size=batch_size)
