"""Value estimators as modules: read keys of a ``[*B, T]`` rollout, write advantages.

Each estimator reads ``state_value`` and ``("next", "state_value")`` (computing them with
``value_network`` when one is given), ``("next", "reward")``, ``("next", "done")`` and
``("next", "terminated")``, and writes ``"advantage"`` and ``"value_target"``. Time is the
last batch dim of the TensorDict; the maths lives in :mod:`tdrl.core.values.functional`, how
the value network is run (chunked, shifted) in :mod:`tdrl.core.values.forward`.

Compact batches (``compact_obs=True`` rebuilt by
:class:`~tdrl.core.replay.NextStateReconstructor`) are read as they are: where
``("next", "obs_known")`` is False (or, without that key, where the next value is NaN) the
next value is unknown. After a terminated step it is never needed and is masked with
``torch.where``; after a step that did not terminate (a truncation, or the cut at the end of
the batch / slice) a target needs ``V(s_{t+1})``, which the data does not hold: refused by
default (``bootstrap_unknown="raise"``), or bootstrapped from ``V(s_t)`` with
``bootstrap_unknown="value"`` (an approximation, chosen explicitly).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from tensordict import TensorDictBase
from torch import Tensor, nn

from tdrl.core import keys as K
from tdrl.core.values import functional as F
from tdrl.core.values._utils import NestedKey, as_time_column, rebind_keys, require
from tdrl.core.values.forward import chunked_values, shifted_values, without_nan
from tdrl.core.values.nstep import step_discount
from tdrl.core.keys import NEXT_OBS_KNOWN, next_key
from tdrl.core.torchrl_names import accept_torchrl_names

__all__ = ["AdvantageKeys", "ValueKeys", "ValueEstimatorBase", "GAE", "TD0", "TDLambda", "VTrace"]


@dataclass
class AdvantageKeys:
    """The keys an estimator writes (``advantage``, ``value_target``) and reads (``value``,
    ``sample_log_prob`` for V-trace), which the policy-gradient losses read in turn
    (:class:`~tdrl.core.objectives.PPOKeys` extends it)."""

    advantage: NestedKey = K.ADVANTAGE
    value_target: NestedKey = K.VALUE_TARGET
    value: NestedKey = K.STATE_VALUE
    sample_log_prob: NestedKey = K.ACTION_LOG_PROB


@dataclass
class ValueKeys(AdvantageKeys):
    """Keys an estimator reads and writes (rebind with ``set_keys``): :class:`AdvantageKeys`
    and the step's ``reward``, ``done`` and ``terminated``, read under ``"next"`` (``value`` is
    read at the root and under ``"next"``)."""

    reward: NestedKey = K.REWARD
    done: NestedKey = K.DONE
    terminated: NestedKey = K.TERMINATED


class ValueEstimatorBase(nn.Module):
    """Common plumbing: keys, optional value network, shape checks.

    Args:
        gamma: discount factor.
        value_network: optional TensorDict module writing ``value``; applied to the
            rollout and to its ``"next"`` sub-TensorDict.
        differentiable: keep the graph through the value network (default: no grad).
        average_advantage: standardise the advantage (zero mean, unit std) after computing it.
        shifted: run ``value_network`` once over each trajectory's ``T + 1`` observations
            (the rollout's and the last step's next one) instead of over the observations and
            the next observations (``2 T``); needs a network with ``in_keys``. The same
            targets; ``("next", value)`` of a terminated step is then 0 (never read).
        value_chunk_size: run ``value_network`` on at most this many steps per call (caps the
            activations' memory; ``None``: one call).
        bootstrap_unknown: what a target does where the next observation is unknown and the
            step did not terminate (compact batches: a truncation, or the end of the batch or
            slice): ``"raise"`` (default) refuses, naming the fixes; ``"value"`` bootstraps
            from ``V(s_t)`` in place of ``V(s_{t+1})`` (an approximation).
    """

    _BOOTSTRAP_UNKNOWN = ("raise", "value")

    def __init__(
        self,
        gamma: float,
        value_network: Callable[[TensorDictBase], TensorDictBase] | None = None,
        *,
        differentiable: bool = False,
        average_advantage: bool = False,
        shifted: bool = False,
        value_chunk_size: int | None = None,
        bootstrap_unknown: str = "raise",
    ) -> None:
        super().__init__()
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {gamma}.")
        if value_chunk_size is not None and (isinstance(value_chunk_size, bool)
                                             or not isinstance(value_chunk_size, int)
                                             or value_chunk_size < 1):
            raise ValueError(f"value_chunk_size must be an int >= 1 or None, got {value_chunk_size!r}.")
        if bootstrap_unknown not in self._BOOTSTRAP_UNKNOWN:
            raise ValueError(f"bootstrap_unknown must be one of {self._BOOTSTRAP_UNKNOWN}, "
                             f"got {bootstrap_unknown!r}.")
        self.in_keys = None
        if shifted:
            self.in_keys = list(getattr(value_network, "in_keys", None) or [])
            if value_network is None or not self.in_keys:
                raise ValueError(f"{type(self).__name__}(shifted=True) runs the value network "
                                 "itself over T + 1 observations: pass a value_network with "
                                 "in_keys (a TensorDictModule).")
        self.gamma = float(gamma)
        self.value_network = value_network
        self.differentiable = differentiable
        self.average_advantage = average_advantage
        self.shifted = bool(shifted)
        self.value_chunk_size = value_chunk_size
        self.bootstrap_unknown = bootstrap_unknown
        self.tensor_keys = ValueKeys()

    def set_keys(self, **kwargs: NestedKey) -> "ValueEstimatorBase":
        """Rebind keys, e.g. ``set_keys(value="critic_value")``; returns ``self``."""
        self.tensor_keys = rebind_keys(self.tensor_keys, type(self).__name__, **kwargs)
        return self

    def _values(self, td: TensorDictBase, done: Tensor, terminated: Tensor) -> tuple[Tensor, Tensor]:
        k, net = self.tensor_keys, self.value_network
        if net is not None:
            chunk = self.value_chunk_size
            grad = self.differentiable and torch.is_grad_enabled()
            # a differentiable run on a compact batch: zeros, not NaNs, into the network
            clean = grad and td.get(NEXT_OBS_KNOWN, None) is not None
            with torch.set_grad_enabled(grad):
                if self.shifted:
                    value, next_value = shifted_values(net, td, self.in_keys, k.value, done,
                                                       terminated, chunk, nan_to_zero=clean)
                else:
                    value = chunked_values(net, td, k.value, chunk)
                    nxt = td.get(K.NEXT)
                    next_value = chunked_values(net, without_nan(nxt) if clean else nxt,
                                                k.value, chunk)
                td.set(k.value, value)
                td.set(next_key(k.value), next_value)
        name = type(self).__name__
        value = as_time_column(require(td, k.value, name), td.shape, str(k.value))
        next_value = as_time_column(
            require(td, next_key(k.value), name), td.shape, str(next_key(k.value))
        )
        if not self.differentiable:
            value, next_value = value.detach(), next_value.detach()
        return value, next_value

    def _mask_unknown(self, td: TensorDictBase, value: Tensor, next_value: Tensor,
                      terminated: Tensor) -> Tensor:
        """``next_value`` with its unknown entries (compact batches) masked or refused."""
        known = td.get(NEXT_OBS_KNOWN, None)
        if known is not None:
            unknown = ~as_time_column(known, td.shape, str(NEXT_OBS_KNOWN)).bool()
        elif next_value.is_floating_point():
            unknown = torch.isnan(next_value)
        else:
            return next_value
        if not bool(unknown.any()):
            return next_value
        open_end = unknown & ~terminated
        if bool(open_end.any()):
            if self.bootstrap_unknown == "raise":
                raise ValueError(
                    f"{type(self).__name__}: the next observation is unknown after "
                    f"{int(open_end.sum())} step(s) that did not terminate (a truncation, or the "
                    "cut at the end of the batch / slice of a compact batch): a target there "
                    "needs V(s_{t+1}), and a multi-step target (GAE, TD(lambda)) would carry the "
                    "gap back through its trajectory. Fix: collect with compact_obs=False (keep "
                    "(\"next\", obs)), or pass bootstrap_unknown=\"value\" to bootstrap those "
                    "steps from V(s_t) (an approximation), or leave them out of the batch.")
            next_value = torch.where(open_end, value, next_value)
        return torch.where(unknown & terminated, torch.zeros_like(next_value), next_value)

    def _inputs(self, td: TensorDictBase) -> dict[str, Tensor]:
        if td.batch_dims < 1:
            raise ValueError(
                f"{type(self).__name__} needs a rollout with a time dim (the last batch dim); "
                f"got a TensorDict with batch_size {tuple(td.batch_size)}."
            )
        k, name = self.tensor_keys, type(self).__name__
        out = {}
        for field in ("reward", "done", "terminated"):
            key = next_key(getattr(k, field))
            out[field] = as_time_column(require(td, key, name), td.shape, str(key))
        out["done"] = out["done"].bool()
        out["terminated"] = out["terminated"].bool()
        value, next_value = self._values(td, out["done"], out["terminated"])
        out["value"] = value
        out["next_value"] = self._mask_unknown(td, value, next_value, out["terminated"])
        return out

    def _estimate(self, td: TensorDictBase, x: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        """Write ``advantage`` and ``value_target`` (``[*B, T, 1]``) into ``td``; return it."""
        x = self._inputs(td)
        advantage, value_target = self._estimate(td, x)
        if self.average_advantage:
            advantage = (advantage - advantage.mean()) / advantage.std().clamp_min(1e-8)
        td.set(self.tensor_keys.advantage, advantage)
        td.set(self.tensor_keys.value_target, value_target)
        return td


@accept_torchrl_names
class GAE(ValueEstimatorBase):
    """Generalized advantage estimation (arXiv:1506.02438) as a module.

    Args:
        gamma: discount. lmbda: trace decay.
        value_network, differentiable, average_advantage: see :class:`ValueEstimatorBase`.
    """

    def __init__(self, gamma: float, lmbda: float, value_network=None, **kwargs) -> None:
        super().__init__(gamma, value_network, **kwargs)
        self.lmbda = float(lmbda)

    def _estimate(self, td, x):
        return F.gae(
            x["reward"], x["value"], x["next_value"], x["done"], x["terminated"],
            self.gamma, self.lmbda,
        )


@accept_torchrl_names
class TD0(ValueEstimatorBase):
    """One-step TD: ``value_target = r + gamma (1 - terminated) V(s')``; on n-step data
    (``"steps_to_next_obs"``) the discount is ``gamma ** steps_to_next_obs``."""

    def _estimate(self, td, x):
        target = F.td0_return(x["reward"], x["next_value"], x["terminated"],
                              step_discount(td, self.gamma, x["reward"]))
        return target - x["value"], target


@accept_torchrl_names
class TDLambda(ValueEstimatorBase):
    """TD(lambda) return; ``advantage = G^lambda - V``.

    Args:
        gamma: discount. lmbda: trace decay.
    """

    def __init__(self, gamma: float, lmbda: float, value_network=None, **kwargs) -> None:
        super().__init__(gamma, value_network, **kwargs)
        self.lmbda = float(lmbda)

    def _estimate(self, td, x):
        target = F.td_lambda_return(
            x["reward"], x["next_value"], x["done"], x["terminated"], self.gamma, self.lmbda
        )
        return target - x["value"], target


class VTrace(ValueEstimatorBase):
    """V-trace (IMPALA, arXiv:1802.01561) for off-policy actor-critic.

    The behaviour log-probability is read from ``sample_log_prob``; the target policy's
    log-probability comes from ``actor_network`` (anything with ``get_dist(td)``, such as a
    ``ProbabilisticTensorDictSequential``) or, without one, from the key
    ``target_log_prob_key``.

    Args:
        gamma: discount. rho_bar, c_bar: importance-weight truncation. lmbda: trace decay.
        actor_network: target policy. action_key: the action whose log-prob is taken.
        target_log_prob_key: key holding ``log pi(a|s)`` when no actor is given.
    """

    def __init__(
        self,
        gamma: float,
        value_network=None,
        actor_network=None,
        *,
        rho_bar: float = 1.0,
        c_bar: float = 1.0,
        lmbda: float = 1.0,
        action_key: NestedKey = K.ACTION,
        target_log_prob_key: NestedKey = "target_log_prob",
        **kwargs,
    ) -> None:
        super().__init__(gamma, value_network, **kwargs)
        self.actor_network = actor_network
        self.rho_bar, self.c_bar, self.lmbda = float(rho_bar), float(c_bar), float(lmbda)
        self.action_key = action_key
        self.target_log_prob_key = target_log_prob_key

    def _log_rho(self, td: TensorDictBase) -> Tensor:
        name = type(self).__name__
        behaviour = require(td, self.tensor_keys.sample_log_prob, name)
        if self.actor_network is not None:
            with torch.no_grad():
                dist = self.actor_network.get_dist(td)
                target = dist.log_prob(require(td, self.action_key, name))
        else:
            target = require(td, self.target_log_prob_key, name)
        target = as_time_column(target, td.shape, "target log-prob")
        behaviour = as_time_column(behaviour, td.shape, str(self.tensor_keys.sample_log_prob))
        return (target - behaviour).detach()

    def _estimate(self, td, x):
        return F.vtrace(
            x["reward"], x["value"], x["next_value"], x["done"], x["terminated"],
            self._log_rho(td), self.gamma, self.rho_bar, self.c_bar, self.lmbda,
        )
