"""TensorDict actors and critics built on ``tensordict.nn``.

* :class:`Actor` -- deterministic ``observation -> action`` (DDPG/TD3).
* :class:`ProbabilisticActor` -- a params module followed by a distribution
  (``ProbabilisticTensorDictSequential``); samples under ``InteractionType.RANDOM``,
  uses the distribution's ``deterministic_sample`` under ``DETERMINISTIC``.
* :class:`ValueOperator` -- ``V(s)`` or ``Q(s, a)`` head.
* :class:`QValueModule`, :class:`DuelingHead`, :class:`QValueActor` -- discrete Q-learning.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Sequence

import torch
from tensordict import TensorDictBase
from tensordict.nn import (
    InteractionType,
    NormalParamExtractor,
    ProbabilisticTensorDictModule,
    ProbabilisticTensorDictSequential,
    TensorDictModule,
    TensorDictModuleBase,
    TensorDictSequential,
)
from tensordict.nn.probabilistic import interaction_type as _interaction_type  # not in tensordict.nn before 0.15
from torch import Tensor, nn

from tdrl.core import keys as K
from tdrl.core.td_access import entries, new_td
from tdrl.core.values._utils import NestedKey, require
from tdrl.core.torchrl_names import accept_torchrl_names

__all__ = [
    "Actor",
    "ProbabilisticActor",
    "ValueOperator",
    "QValueModule",
    "DuelingHead",
    "QValueActor",
    "NormalParamExtractor",
    "RandomPolicy",
]


class Actor(TensorDictModule):
    """Deterministic actor: ``module(*in_keys) -> action``.

    Args:
        module: network mapping observations to actions (e.g. an ``MLP`` ending in ``Tanh``).
        in_keys: default ``["observation"]``. out_keys: default ``["action"]``.
    """

    def __init__(
        self,
        module: nn.Module,
        in_keys: Sequence[NestedKey] = (K.OBSERVATION,),
        out_keys: Sequence[NestedKey] = (K.ACTION,),
    ) -> None:
        super().__init__(module, in_keys=list(in_keys), out_keys=list(out_keys))


@accept_torchrl_names
class ProbabilisticActor(ProbabilisticTensorDictSequential):
    """Stochastic policy: ``params_module`` writes the distribution parameters, then an
    action is drawn and (by default) its log-prob written to ``"action_log_prob"``.

    Args:
        params_module: a ``TensorDictModule`` writing the distribution's parameter keys.
        distribution_class: e.g. :class:`TanhNormal`, :class:`IndependentNormal`,
            :class:`MaskedCategorical`.
        in_keys: parameter keys, a list (``["loc", "scale"]``) or a dict mapping the
            distribution's argument names to keys (``{"logits": "logits", "mask":
            "action_mask"}``).
        distribution_kwargs: constant keyword arguments (e.g. ``{"low": -2, "high": 2}``).
        out_keys: default ``["action"]``.
        return_log_prob: write ``action_log_prob`` (needed by PPO/A2C).
        default_interaction_type: used when no ``set_interaction_type`` is active.

    Example:
        >>> net = TensorDictModule(nn.Sequential(MLP(3, 2), NormalParamExtractor()),
        ...                        in_keys=["observation"], out_keys=["loc", "scale"])
        >>> actor = ProbabilisticActor(net, TanhNormal, distribution_kwargs={"low": -2., "high": 2.})
    """

    def __init__(
        self,
        params_module: TensorDictModuleBase,
        distribution_class: type,
        in_keys: Sequence[NestedKey] | dict[str, NestedKey] = (K.LOC, K.SCALE),
        distribution_kwargs: dict | None = None,
        out_keys: Sequence[NestedKey] = (K.ACTION,),
        return_log_prob: bool = True,
        default_interaction_type: InteractionType = InteractionType.RANDOM,
    ) -> None:
        dist_module = ProbabilisticTensorDictModule(
            in_keys=dict(in_keys) if isinstance(in_keys, dict) else list(in_keys),
            out_keys=list(out_keys),
            distribution_class=distribution_class,
            distribution_kwargs=distribution_kwargs or {},
            return_log_prob=return_log_prob,
            default_interaction_type=default_interaction_type,
        )
        super().__init__(params_module, dist_module)

    def dict_call(self, batch_size: torch.Size, device: torch.device) -> Callable[[dict], dict] | None:
        """The forward on a plain ``{key: tensor}`` dict (what a collector's dict loop calls),
        or ``None`` when this actor is not the plain case it covers.

        ``fn(root)`` writes into ``root`` what the TensorDict forward writes (the parameters,
        the action, its log-prob; same keys, order and values, the same random draws) and
        returns it; an output that a TensorDict would check (another batch shape or device)
        sends that call through the TensorDict forward. Covered: a plain ``TensorDictModule``
        of string keys before a ``ProbabilisticTensorDictModule`` with string keys, no
        ``num_samples`` and no generator, called in place. ``tensordict``'s own sampling rules
        (interaction type, joint sample-and-log-prob) are used, not rewritten.
        """
        from tensordict.nn import probabilistic as _prob

        joint = getattr(_prob, "_get_joint_sample_and_log_prob", None)
        params, dist_module = (self.module[0], self.module[1]) if len(self.module) == 2 else (None, None)
        if (joint is None or type(params) is not TensorDictModule
                or type(dist_module) is not ProbabilisticTensorDictModule
                or type(self).forward is not ProbabilisticTensorDictSequential.forward
                or getattr(self, "inplace", False) is not None
                or getattr(self, "_select_before_return", True) or getattr(self, "return_composite", True)
                or getattr(dist_module, "num_samples", 1) is not None
                or getattr(dist_module, "_generator", 1) is not None
                or getattr(dist_module, "_generator_key", 1) is not None
                or not hasattr(dist_module, "_dist_sample")):
            return None
        keys = [*params.in_keys, *params.out_keys, *dist_module.in_keys, *dist_module.out_keys]
        sample_keys = list(getattr(dist_module, "dist_sample_keys", ()))
        if not all(isinstance(k, str) for k in keys) or len(sample_keys) != 1:
            return None
        net, in_keys, out_keys = params.module, list(params.in_keys), list(params.out_keys)
        sample_key, log_prob_key = sample_keys[0], dist_module.log_prob_key
        return_log_prob, default_type = dist_module.return_log_prob, dist_module.default_interaction_type
        nb, tensor, random = len(batch_size), torch.Tensor, InteractionType.RANDOM
        dist_class, dist_kwargs = dist_module.distribution_class, dict(dist_module.distribution_kwargs)
        arg_keys = [(dk[-1] if isinstance(dk, tuple) else dk, k)
                    for dk, k in zip(dist_module.dist_keys, dist_module.in_keys, strict=True)]

        def make_dist(root: dict):
            try:  # what get_dist builds, without its per-call bookkeeping
                return dist_class(**{dk: root.get(k) for dk, k in arg_keys}, **dist_kwargs)
            except TypeError:  # get_dist's own error message
                return dist_module.get_dist(root)

        def fn(root: dict) -> dict:
            out = net(*[root[k] for k in in_keys])
            outs = out if type(out) is tuple else (out,)
            if len(outs) != len(out_keys) or not all(
                    type(o) is tensor and o.device == device and o.shape[:nb] == batch_size for o in outs):
                # what the TensorDict does with such outputs (casts, moves, errors), once
                return entries(self(new_td(root, batch_size, device)))
            root.update(zip(out_keys, outs))
            dist = make_dist(root)
            itype = _interaction_type() or default_type
            sampler = joint(dist) if return_log_prob and itype is random else None
            log_prob = None
            if sampler is not None:
                sample, log_prob = sampler(torch.Size(()))
            elif itype is random and isinstance(dist, torch.distributions.Distribution):
                sample = dist.rsample() if dist.has_rsample else dist.sample()  # tensordict's RANDOM rule
            else:
                sample = dist_module._dist_sample(dist, interaction_type=itype, generator=None)
            root[sample_key] = sample
            if return_log_prob:
                root[log_prob_key] = dist.log_prob(sample) if log_prob is None else log_prob
            return root

        return fn


class ValueOperator(TensorDictModule):
    """Critic head: ``V(s)`` or ``Q(s, a)``. Without ``out_keys`` it writes
    ``"state_action_value"`` when ``"action"`` is among ``in_keys`` and ``"state_value"``
    otherwise (TorchRL's rule). Several in_keys are passed as separate arguments (an
    :class:`MLP` concatenates them).
    """

    def __init__(
        self,
        module: nn.Module,
        in_keys: Sequence[NestedKey] = (K.OBSERVATION,),
        out_keys: Sequence[NestedKey] | None = None,
    ) -> None:
        in_keys = [in_keys] if isinstance(in_keys, str) else list(in_keys)
        if out_keys is None:
            out_keys = (K.STATE_ACTION_VALUE,) if K.ACTION in in_keys else (K.STATE_VALUE,)
        super().__init__(module, in_keys=in_keys, out_keys=list(out_keys))


class DuelingHead(nn.Module):
    """Dueling Q head (Wang et al., 2016, arXiv:1511.06581):
    ``Q = V + A - mean_a A`` from shared features.

    Args:
        in_features: feature size. n_actions: number of actions.
        num_cells: hidden sizes of the value and advantage streams.
        activation: activation class.

    Shapes: ``[*B, in_features]`` -> ``[*B, n_actions]``.
    """

    def __init__(
        self,
        in_features: int,
        n_actions: int,
        num_cells: Sequence[int] = (64,),
        activation: type[nn.Module] = nn.ReLU,
    ) -> None:
        super().__init__()
        from tdrl.core.modules.models import MLP

        self.value = MLP(in_features, 1, num_cells, activation)
        self.advantage = MLP(in_features, n_actions, num_cells, activation)

    def forward(self, features: Tensor) -> Tensor:
        adv = self.advantage(features)
        return self.value(features) + adv - adv.mean(-1, keepdim=True)


_ACTION_SPACES = {"one_hot": "one_hot", "one-hot": "one_hot", "onehot": "one_hot",
                  "categorical": "categorical"}


def _as_action_composite(spec):
    """``spec`` as TorchRL's ``actor.spec``: a ``Composite`` holding ``"action"`` (or ``None``)."""
    from tdrl.core.specs import Composite

    if spec is None or isinstance(spec, Composite):
        return spec
    return Composite({K.ACTION: spec}, shape=spec.shape[:0])


def _action_form(action_space, spec, one_hot: bool, where: str) -> tuple[bool, torch.dtype | None]:
    """``(writes one-hot, dtype or None)`` from TorchRL's ``action_space=`` / ``spec=`` and
    tdrl's ``one_hot=``; a spec decides both the form and the dtype (the env's own)."""
    from tdrl.core.specs import Categorical, Composite, OneHot, TensorSpec

    if isinstance(action_space, TensorSpec):  # TorchRL also accepts a spec here
        if spec is not None and spec is not action_space:
            raise ValueError(f"{where}: action_space= is a spec and spec= another; pass one of them.")
        action_space, spec = None, action_space
    if isinstance(spec, Composite):
        spec = spec[K.ACTION] if K.ACTION in spec.keys() else None
        if spec is None:
            raise ValueError(f"{where}: spec= is a Composite without an 'action' entry; pass "
                             "env.action_spec (the action's own spec).")
    form = None
    if action_space is not None:
        form = _ACTION_SPACES.get(str(action_space).lower())
        if form is None:
            raise ValueError(f"{where}: action_space={action_space!r} is not supported; expected "
                             "'one_hot' or 'categorical' (or pass spec=env.action_spec).")
    dtype = None
    if spec is not None:
        if isinstance(spec, OneHot):
            spec_form = "one_hot"
        elif isinstance(spec, Categorical):
            spec_form = "categorical"
        else:
            raise TypeError(f"{where}: spec= must be a OneHot or Categorical action spec, got "
                            f"{type(spec).__name__}; Q-learning needs discrete actions.")
        if form is not None and form != spec_form:
            raise ValueError(f"{where}: action_space={action_space!r} but the spec is "
                             f"{type(spec).__name__}; drop action_space= (the spec decides).")
        form, dtype = spec_form, spec.dtype
    if one_hot and form == "categorical":
        raise ValueError(f"{where}: one_hot=True contradicts a categorical action "
                         f"(action_space / spec); drop one_hot=.")
    return one_hot or form == "one_hot", dtype


class QValueModule(TensorDictModuleBase):
    """Greedy action from ``action_value`` ``[*B, n]``: writes ``action`` and
    ``chosen_action_value`` ``[*B, 1]``. An optional ``action_mask`` key (``[*B, n]`` bool)
    excludes disallowed actions.

    The action's form follows the env: pass ``spec=env.action_spec`` (TorchRL's spelling) and
    a ``OneHot`` spec (``GymEnv``'s default for a ``Discrete`` space) gets one-hot actions
    ``[*B, n]``, a ``Categorical`` spec indices ``[*B]``, each in the spec's dtype. Without a
    spec: ``action_space="one_hot"`` (or ``one_hot=True``) writes a one-hot in the action
    values' dtype, ``"categorical"`` or nothing an int64 index. An index given to an env with
    a ``OneHot`` spec is refused by the env, with this fix named.

    Args:
        action_value_key, action_key, chosen_action_value_key, action_mask_key: keys.
        one_hot: write one-hot actions.
        action_space: ``"one_hot"`` or ``"categorical"`` (TorchRL's names), or a spec.
        spec: the env's action spec (``OneHot`` or ``Categorical``; a ``Composite`` holding
            ``"action"`` is read at that key).
    """

    def __init__(
        self,
        action_value_key: NestedKey = K.ACTION_VALUE,
        action_key: NestedKey = K.ACTION,
        chosen_action_value_key: NestedKey = "chosen_action_value",
        action_mask_key: NestedKey | None = None,
        one_hot: bool = False,
        *,
        action_space=None,
        spec=None,
    ) -> None:
        super().__init__()
        self.in_keys = [action_value_key] + ([action_mask_key] if action_mask_key else [])
        self.out_keys = [action_key, chosen_action_value_key]
        self.action_value_key, self.action_key = action_value_key, action_key
        self.chosen_key, self.mask_key = chosen_action_value_key, action_mask_key
        self.one_hot, self.action_dtype = _action_form(action_space, spec, one_hot, type(self).__name__)

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        q = require(td, self.action_value_key, type(self).__name__)
        if self.mask_key is not None:
            mask = require(td, self.mask_key, type(self).__name__)
            q = q.masked_fill(~mask.bool(), torch.finfo(q.dtype).min)
        index = q.argmax(-1)
        chosen = q.gather(-1, index.unsqueeze(-1))
        if self.one_hot:
            action = nn.functional.one_hot(index, q.shape[-1]).to(self.action_dtype or q.dtype)
        else:
            action = index if self.action_dtype in (None, torch.int64) else index.to(self.action_dtype)
        td.set(self.action_key, action)
        td.set(self.chosen_key, chosen)
        return td


class QValueActor(TensorDictSequential):
    """``observation -> action_value -> greedy action``.

    Args:
        module: network ``[*B, obs] -> [*B, n_actions]`` (use a :class:`DuelingHead` at the
            end for a dueling DQN).
        in_keys: default ``["observation"]``.
        action_mask_key: optional mask key; one_hot: write one-hot actions.
        action_space, spec: the action's form, as :class:`QValueModule` (pass
            ``spec=env.action_spec`` so the actions match the env).
    """

    def __init__(
        self,
        module: nn.Module,
        in_keys: Sequence[NestedKey] = (K.OBSERVATION,),
        action_mask_key: NestedKey | None = None,
        one_hot: bool = False,
        *,
        action_space=None,
        spec=None,
    ) -> None:
        net = TensorDictModule(module, in_keys=list(in_keys), out_keys=[K.ACTION_VALUE])
        super().__init__(net, QValueModule(action_mask_key=action_mask_key, one_hot=one_hot,
                                           action_space=action_space, spec=spec))
        # TorchRL's actor.spec: the action spec as a Composite (EGreedyModule(spec=actor.spec))
        self.spec = _as_action_composite(spec)


class RandomPolicy:
    """Uniform random actions from an action spec (TorchRL's ``RandomPolicy``): a policy for a
    :class:`~tdrl.core.collectors.Collector` or ``env.rollout`` that writes ``spec.rand()``.

    Args:
        action_spec: the env's ``action_spec`` (its shape includes the env's batch), or its
            ``full_action_spec`` (a ``Composite``: every action key is drawn).
        action_key: where a leaf spec's draw is written (default ``"action"``).
    """

    def __init__(self, action_spec, action_key: NestedKey = K.ACTION) -> None:
        self.action_spec = action_spec.clone()
        self.action_key = action_key

    def __call__(self, td: TensorDictBase) -> TensorDictBase:
        from tdrl.core.specs import Composite

        if isinstance(self.action_spec, Composite):
            return td.update(self.action_spec.rand())
        td.set(self.action_key, self.action_spec.rand())
        return td
