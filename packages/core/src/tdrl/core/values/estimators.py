"""Value estimators as modules: read keys of a ``[*B, T]`` rollout, write advantages.

Each estimator reads ``state_value`` and ``("next", "state_value")`` (computing them with
``value_network`` when one is given), ``("next", "reward")``, ``("next", "done")`` and
``("next", "terminated")``, and writes ``"advantage"`` and ``"value_target"``. Time is the
last batch dim of the TensorDict; the maths lives in :mod:`tdrl.core.values.functional`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import torch
from tensordict import TensorDictBase
from torch import Tensor, nn

from tdrl.core import keys as K
from tdrl.core.values import functional as F
from tdrl.core.values._utils import NestedKey, as_time_column, require
from tdrl.core.keys import next_key
from tdrl.core.torchrl_names import accept_torchrl_names

__all__ = ["ValueKeys", "ValueEstimatorBase", "GAE", "TD0", "TDLambda", "VTrace"]


@dataclass
class ValueKeys:
    """Keys an estimator reads and writes (rebind with ``set_keys``).

    ``reward``, ``done`` and ``terminated`` are read under ``"next"``; ``value`` is read at
    the root and under ``"next"``.
    """

    advantage: NestedKey = K.ADVANTAGE
    value_target: NestedKey = K.VALUE_TARGET
    value: NestedKey = K.STATE_VALUE
    reward: NestedKey = K.REWARD
    done: NestedKey = K.DONE
    terminated: NestedKey = K.TERMINATED
    sample_log_prob: NestedKey = K.ACTION_LOG_PROB


class ValueEstimatorBase(nn.Module):
    """Common plumbing: keys, optional value network, shape checks.

    Args:
        gamma: discount factor.
        value_network: optional TensorDict module writing ``value``; applied to the
            rollout and to its ``"next"`` sub-TensorDict.
        differentiable: keep the graph through the value network (default: no grad).
        average_advantage: standardise the advantage (zero mean, unit std) after computing it.
    """

    def __init__(
        self,
        gamma: float,
        value_network: Callable[[TensorDictBase], TensorDictBase] | None = None,
        *,
        differentiable: bool = False,
        average_advantage: bool = False,
    ) -> None:
        super().__init__()
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {gamma}.")
        self.gamma = float(gamma)
        self.value_network = value_network
        self.differentiable = differentiable
        self.average_advantage = average_advantage
        self.tensor_keys = ValueKeys()

    def set_keys(self, **kwargs: NestedKey) -> "ValueEstimatorBase":
        """Rebind keys, e.g. ``set_keys(value="critic_value")``; returns ``self``."""
        fields = {f.name for f in dataclasses.fields(ValueKeys)}
        unknown = set(kwargs) - fields
        if unknown:
            raise KeyError(f"Unknown key names {sorted(unknown)}; valid: {sorted(fields)}.")
        self.tensor_keys = dataclasses.replace(self.tensor_keys, **kwargs)
        return self

    def _values(self, td: TensorDictBase) -> tuple[Tensor, Tensor]:
        k = self.tensor_keys
        if self.value_network is not None:
            with torch.set_grad_enabled(self.differentiable and torch.is_grad_enabled()):
                self.value_network(td)
                self.value_network(td.get(K.NEXT))
        name = type(self).__name__
        value = as_time_column(require(td, k.value, name), td.shape, str(k.value))
        next_value = as_time_column(
            require(td, next_key(k.value), name), td.shape, str(next_key(k.value))
        )
        if not self.differentiable:
            value, next_value = value.detach(), next_value.detach()
        return value, next_value

    def _inputs(self, td: TensorDictBase) -> dict[str, Tensor]:
        if td.batch_dims < 1:
            raise ValueError(
                f"{type(self).__name__} needs a rollout with a time dim (the last batch dim); "
                f"got a TensorDict with batch_size {tuple(td.batch_size)}."
            )
        k, name = self.tensor_keys, type(self).__name__
        value, next_value = self._values(td)
        out = {"value": value, "next_value": next_value}
        for field in ("reward", "done", "terminated"):
            key = next_key(getattr(k, field))
            out[field] = as_time_column(require(td, key, name), td.shape, str(key))
        out["done"] = out["done"].bool()
        out["terminated"] = out["terminated"].bool()
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
    """One-step TD: ``value_target = r + gamma (1 - terminated) V(s')``."""

    def _estimate(self, td, x):
        target = F.td0_return(x["reward"], x["next_value"], x["terminated"], self.gamma)
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
