"""Running actors and critics on a batch without mutating the caller's TensorDict."""

from __future__ import annotations

import copy
from typing import Mapping

import torch
import torch.distributions as D
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import Tensor, nn
from torch.func import functional_call

from tdrl.core.values._utils import NestedKey, require


def _is_plain_tdmodule(module) -> bool:
    return isinstance(module, TensorDictModule) and (
        type(module).forward is TensorDictModule.forward
    )


def run_module(
    module,
    td: TensorDictBase,
    out_key: NestedKey,
    owner: str,
    overrides: Mapping[NestedKey, Tensor] | None = None,
    detach_params: bool = False,
) -> Tensor:
    """``module``'s ``out_key`` output on ``td``, leaving ``td`` untouched; for an ensemble
    (an ``nn.ModuleList``, :func:`make_ensemble`), every member's output stacked ``[N, *B, ...]``.

    Args:
        module: a TensorDict module, or an ``nn.ModuleList`` of them.
        td: the batch. out_key: the output to return. owner: name for error messages.
        overrides: inputs to use instead of ``td``'s (e.g. ``{"action": policy_action}``).
        detach_params: evaluate with detached parameters (gradients reach the inputs only,
            e.g. the actor loss of DDPG/SAC through a critic).

    A plain ``TensorDictModule`` is called on its tensors directly (no TensorDict
    overhead); anything else is called on a shallow copy of ``td``.
    """
    if isinstance(module, nn.ModuleList):
        return torch.stack([run_module(m, td, out_key, owner, overrides, detach_params) for m in module])
    overrides = overrides or {}
    if isinstance(module, TensorDictSequential) and len(module.module) > 1:
        # e.g. QValueActor = [network -> action_value, greedy head]: only the network is
        # needed when its output is what we want
        first, rest = module.module[0], module.module[1:]
        if (
            _is_plain_tdmodule(first)
            and list(first.out_keys) == [out_key]
            and all(out_key not in getattr(m, "out_keys", [out_key]) for m in rest)
        ):
            return run_module(first, td, out_key, owner, overrides, detach_params)
    if _is_plain_tdmodule(module) and list(module.out_keys) == [out_key]:
        args = tuple(
            overrides[k] if k in overrides else require(td, k, owner) for k in module.in_keys
        )
        inner = module.module
        if detach_params:
            params = {n: p.detach() for n, p in inner.named_parameters()}
            return functional_call(inner, params, args)
        return inner(*args)
    td2 = td.copy()
    for k, v in overrides.items():
        td2.set(k, v)
    if detach_params:
        params = {n: p.detach() for n, p in module.named_parameters()}
        out = functional_call(module, params, (td2,))
    else:
        out = module(td2)
    return require(out, out_key, owner)


def get_dist(actor, td: TensorDictBase) -> D.Distribution:
    """The actor's distribution for ``td`` (its parameters are written to a shallow copy)."""
    if not hasattr(actor, "get_dist"):
        raise TypeError(
            f"The actor ({type(actor).__name__}) must provide get_dist(td), e.g. a "
            "ProbabilisticActor / ProbabilisticTensorDictSequential."
        )
    return actor.get_dist(td.copy())


def sample_with_log_prob(
    dist: D.Distribution, sample_shape: torch.Size | tuple = ()
) -> tuple[Tensor, Tensor]:
    """A reparameterised sample ``[*S, *B, *E]`` and its log-prob ``[*S, *B]``
    (``TanhNormal`` reuses its pre-tanh value instead of inverting the tanh)."""
    sample_shape = torch.Size(sample_shape)
    if hasattr(dist, "rsample_with_log_prob"):
        return dist.rsample_with_log_prob(sample_shape)
    action = dist.rsample(sample_shape)
    return action, dist.log_prob(action)


def _reset(module: nn.Module) -> None:
    for m in module.modules():
        if m is not module and hasattr(m, "reset_parameters"):
            m.reset_parameters()


def make_ensemble(module: nn.Module, n: int) -> nn.ModuleList:
    """``n`` copies of ``module``: the first is ``module`` itself, the others re-initialised."""
    if n < 1:
        raise ValueError(f"num_qvalue_nets must be >= 1, got {n}.")
    copies = [module]
    for _ in range(n - 1):
        other = copy.deepcopy(module)
        _reset(other)
        copies.append(other)
    return nn.ModuleList(copies)
