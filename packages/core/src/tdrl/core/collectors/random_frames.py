"""Random warm-up frames that look like the policy's: the same keys and dtypes.

A collector's first ``init_random_frames`` frames take random actions from the env's action
spec. A replay buffer (and any loss) fixes its keys and dtypes on the first batch, so a
random batch without the policy's outputs (``action_value``, ``loc`` / ``scale``,
``action_log_prob``...) makes the first policy batch fail (``StorageKeyError``), and an action
dtype that differs from the policy's changes between batches of one collector.

The decision, as TorchRL's collectors do (they fill a zeroed buffer that holds the policy's
outputs): the policy is run once, on a copy of the first random step's root and under a
forked RNG (the random stream is unchanged), to learn what it writes. Random steps then carry
those keys filled with zeros, and their actions are cast to the policy's dtype where the
shapes agree. A policy whose actions have another shape than the spec's is not patched over:
the env refuses such actions with the fix named (see :func:`..envs.gym_spaces.one_hot_refusal`).
A policy that keeps state in itself rather than in the TensorDict sees that one extra call
(an ``OrnsteinUhlenbeckModule``'s noise process starts one step further on).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from tensordict import TensorDictBase

__all__ = ["PolicyTemplate", "materialize_lazy"]


class PolicyTemplate:
    """What a policy writes into a root TensorDict, as zeros, to pad random steps with.

    Args:
        policy: ``td -> td`` (the collector's call of its policy).
        root: a root TensorDict of the env (not modified; a copy is given to the policy).
        action_keys: the env's action keys (their dtype is taken from the policy's output).
        to_policy, to_env: moves between the env's and the policy's devices (identity when
            they are the same device).

    Attributes:
        fill: the zeroed TensorDict of the keys the policy writes other than the actions
            (batch shape of ``root``); ``None`` when there are none.
        actions: ``{action key: (shape, dtype)}`` of the policy's actions.
    """

    def __init__(
        self,
        policy: Callable[[TensorDictBase], TensorDictBase],
        root: TensorDictBase,
        action_keys: Sequence,
        to_policy: Callable[[TensorDictBase], TensorDictBase] = lambda td: td,
        to_env: Callable[[TensorDictBase], TensorDictBase] = lambda td: td,
    ) -> None:
        probe = to_policy(root.clone())
        before = set(probe.keys(True, True))
        devices = [d for d in {p.device for p in _tensors(probe)} if d.type == "cuda"]
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            out = to_env(policy(probe))
        written = [k for k in out.keys(True, True) if k not in before]
        actions = set(action_keys)
        self.actions = {k: (v.shape, v.dtype) for k in action_keys
                        if (v := out.get(k, None)) is not None}
        rest = [k for k in written if k not in actions]
        self.fill = out.select(*rest).apply(torch.zeros_like) if rest else None

    def pad(self, td: TensorDictBase) -> TensorDictBase:
        """Cast ``td``'s random actions to the policy's dtypes (where the shapes agree) and add
        the zero-filled keys; returns ``td``."""
        for key, (shape, dtype) in self.actions.items():
            action = td.get(key)
            if action.dtype != dtype and action.shape == shape:
                td.set(key, action.to(dtype))
        if self.fill is not None:
            td.update(self.fill)
        return td


def _tensors(td: TensorDictBase) -> list[torch.Tensor]:
    return [v for v in td.values(True, True) if isinstance(v, torch.Tensor)]


def materialize_lazy(policy, observation_spec) -> None:
    """A policy with lazy layers (``MLP(in_features=None)``, ``nn.LazyLinear``) runs once on a
    zero observation of ``observation_spec``, under a forked RNG and no grad, so its parameters
    exist before a loss copies them into target networks (TorchRL's collector does the same
    when it is built). Any other policy is left alone."""
    if not isinstance(policy, torch.nn.Module) or not any(
            isinstance(p, torch.nn.parameter.UninitializedParameter) for p in policy.parameters()):
        return
    with torch.random.fork_rng(), torch.no_grad():
        policy(observation_spec.zero())
