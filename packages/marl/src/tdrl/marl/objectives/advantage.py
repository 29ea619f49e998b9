"""Multi-agent GAE: per-agent or shared rewards, values and done flags.

Shapes (time is the dim before the agent dim; see docs/ARCHITECTURE.md):

* per agent: ``[*B, T, n_agents, 1]``;
* shared (team reward, global done, one value per team): ``[*B, T, 1]``, expanded over agents.

The maths is :func:`tdrl.core.values.gae` (which dispatches to ``tdrl.kernels`` when
installed); this module only moves the agent dim out of the way and back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from tensordict import TensorDictBase
from torch import Tensor, nn

from tdrl.core.values import gae

from ..keys import ADVANTAGE, DONE, GROUP, NEXT, REWARD, STATE_VALUE, TERMINATED, VALUE_TARGET

__all__ = ["multi_agent_gae", "expand_over_agents", "MultiAgentGAE"]


def expand_over_agents(x: Tensor, n_agents: int, time_shape: torch.Size, name: str) -> Tensor:
    """``x`` as ``[*B, T, n_agents, 1]``: a shared ``[*B, T, 1]`` (or ``[*B, T]``) is expanded.

    Args:
        x: a per-agent ``[*B, T, n_agents, 1]`` or shared ``[*B, T, 1]`` tensor.
        n_agents: the number of agents.
        time_shape: ``(*B, T)``.
        name: the tensor's name, for errors.
    """
    t = tuple(time_shape)
    if x.shape == (*t, n_agents, 1):
        return x
    if x.shape == (*t, n_agents):
        return x.unsqueeze(-1)
    if x.shape in ((*t, 1), t):
        return x.reshape(*t, 1, 1).expand(*t, n_agents, 1)
    raise ValueError(
        f"{name} has shape {tuple(x.shape)}; expected per-agent {(*t, n_agents, 1)} or shared "
        f"{(*t, 1)} (batch dims, time, [agents], 1)."
    )


def multi_agent_gae(
    reward: Tensor,
    value: Tensor,
    next_value: Tensor,
    done: Tensor,
    terminated: Tensor,
    gamma: float,
    lmbda: float,
    n_agents: int | None = None,
    time_shape: Sequence[int] | None = None,
) -> tuple[Tensor, Tensor]:
    """GAE (Schulman et al., 2015, arXiv:1506.02438) for a group of agents.

    Args:
        reward, value, next_value, done, terminated: each ``[*B, T, n_agents, 1]`` (per agent)
            or ``[*B, T, 1]`` (shared, expanded over agents). Done flags are bool;
            ``terminated`` stops bootstrapping, ``done`` stops the lambda trace.
        gamma: discount. lmbda: trace decay.
        n_agents: the number of agents. If None, it is read from the inputs of highest rank,
            which are taken as per-agent ``[*B, T, n_agents, 1]``.
        time_shape: ``(*B, T)``, e.g. the rollout's batch size (needs ``n_agents``). If
            None, it is inferred from the inputs; passing it makes any input of another
            shape an error that names that input.

    Returns:
        ``(advantage, value_target)``, each ``[*B, T, n_agents, 1]``.
    """
    inputs = {"reward": reward, "value": value, "next_value": next_value, "done": done,
              "terminated": terminated}
    if time_shape is not None:
        if n_agents is None:
            raise ValueError("multi_agent_gae: time_shape needs n_agents as well.")
        time_shape = torch.Size(time_shape)
    elif n_agents is None:
        ranks = {k: v.ndim for k, v in inputs.items()}
        top = max(ranks.values())
        ref = next(v for v in inputs.values() if v.ndim == top)
        if top < 3:
            raise ValueError(
                "multi_agent_gae needs at least one per-agent input [*B, T, n_agents, 1]; got "
                f"shapes {[tuple(v.shape) for v in inputs.values()]} (pass n_agents for all-shared)."
            )
        n_agents = ref.shape[-2]
        time_shape = ref.shape[:-2]
    else:
        ref = max(inputs.values(), key=lambda v: v.ndim)
        time_shape = ref.shape[:-2] if ref.shape[-2:] == (n_agents, 1) else ref.shape[:-1]
    if len(time_shape) < 1:
        raise ValueError(f"multi_agent_gae needs a time dim; got shapes with batch {tuple(time_shape)}.")
    x = {k: expand_over_agents(v, n_agents, time_shape, k).transpose(-3, -2)
         for k, v in inputs.items()}  # [*B, n, T, 1]
    adv, target = gae(
        x["reward"].to(x["value"].dtype), x["value"], x["next_value"], x["done"].bool(),
        x["terminated"].bool(), gamma, lmbda,
    )
    return adv.transpose(-3, -2), target.transpose(-3, -2)


class MultiAgentGAE(nn.Module):
    """Write ``(group, "advantage")`` and ``(group, "value_target")`` into a rollout.

    Reads from a TensorDict of batch ``(*B, T)``:

    * ``(group, "state_value")`` and ``("next", group, "state_value")`` (computed with
      ``value_network`` when given) -- per agent ``[*B, T, n, 1]``;
    * the reward ``("next", group, "reward")``, or the shared ``("next", "reward")``;
    * done flags ``("next", group, "done"/"terminated")`` when the env has per-agent ones,
      else the global ``("next", "done"/"terminated")`` expanded over agents.

    Args:
        gamma: discount. lmbda: trace decay.
        group: the group key (default ``"agents"``).
        value_network: optional TensorDict module writing ``(group, "state_value")``; it is
            applied (without grad) to the rollout and to its ``"next"`` sub-TensorDict.
        value_norm: optional :class:`~tdrl.marl.objectives.ValueNorm` or ``PopArt``: the
            critic outputs normalised values, which are de-normalised before GAE.
        average_advantage: standardise the advantage over the whole batch.
        reuse_values: compute ``value_network`` once per distinct input: for a rollout
            whose step ``t+1`` root continues step ``t``'s ``"next"`` (what a collector
            returns), ``V(next_t)`` is ``V(root_{t+1})`` except where the episode ended or
            at the last step, so only those ``"next"`` rows are evaluated (about half the
            critic work). The inputs are compared, so any batch stays correct; results equal
            two full passes up to float rounding. Needs a value network that accepts any
            batch shape (not a seed-stacked one).
    """

    def __init__(
        self,
        gamma: float,
        lmbda: float,
        group: str = GROUP,
        value_network: Callable[[TensorDictBase], TensorDictBase] | None = None,
        value_norm: nn.Module | None = None,
        average_advantage: bool = False,
        reuse_values: bool = False,
    ) -> None:
        super().__init__()
        self.gamma, self.lmbda, self.group = float(gamma), float(lmbda), group
        self.value_network, self.value_norm = value_network, value_norm
        self.average_advantage = average_advantage
        self.reuse_values = reuse_values

    def _flag(self, td: TensorDictBase, name: str) -> Tensor:
        for key in ((NEXT, self.group, name), (NEXT, name)):
            v = td.get(key, None)
            if v is not None:
                return v
        raise KeyError(f"MultiAgentGAE needs ('next', {self.group!r}, {name!r}) or ('next', {name!r}).")

    def _next_values_reusing(self, td: TensorDictBase) -> None:
        """Write ``("next", group, "state_value")`` from the root values where the inputs match."""
        in_keys = getattr(self.value_network, "in_keys", None)
        out_key = (self.group, STATE_VALUE)
        nxt, nb = td.get(NEXT), td.ndim
        if not in_keys or any(nxt.get(k, None) is None for k in in_keys):
            self.value_network(nxt)
            return
        same = torch.ones(td.shape[:-1] + (td.shape[-1] - 1,), dtype=torch.bool, device=td.device)
        for key in in_keys:
            a = nxt.get(key).narrow(nb - 1, 0, td.shape[-1] - 1)
            b = td.get(key).narrow(nb - 1, 1, td.shape[-1] - 1)
            same &= (a == b).reshape(*same.shape, -1).all(-1)
        value = td.get(out_key)
        next_value = torch.empty_like(value)
        shifted = value.narrow(nb - 1, 1, td.shape[-1] - 1)
        next_value.narrow(nb - 1, 0, td.shape[-1] - 1).copy_(shifted)
        need = torch.cat([~same, torch.ones_like(same.narrow(nb - 1, 0, 1))], dim=nb - 1)
        sub = nxt.select(*in_keys)[need]
        self.value_network(sub)
        next_value[need] = sub.get(out_key)
        nxt.set(out_key, next_value)

    @torch.no_grad()
    def forward(self, td: TensorDictBase) -> TensorDictBase:
        """Compute and write the advantage and value target; returns ``td``."""
        g = self.group
        if self.value_network is not None:
            self.value_network(td)
            if self.reuse_values and td.ndim >= 1 and td.shape[-1] > 1:
                self._next_values_reusing(td)
            else:
                self.value_network(td.get(NEXT))
        value = td.get((g, STATE_VALUE), None)
        next_value = td.get((NEXT, g, STATE_VALUE), None)
        if value is None or next_value is None:
            raise KeyError(
                f"MultiAgentGAE needs ({g!r}, 'state_value') and ('next', {g!r}, 'state_value'); "
                "pass value_network= or compute them first."
            )
        if self.value_norm is not None:
            value, next_value = self.value_norm.denormalize(value), self.value_norm.denormalize(next_value)
        reward = td.get((NEXT, g, REWARD), None)
        if reward is None:
            reward = self._flag(td, REWARD)
        adv, target = multi_agent_gae(
            reward, value, next_value, self._flag(td, DONE), self._flag(td, TERMINATED),
            self.gamma, self.lmbda, n_agents=value.shape[-2], time_shape=td.shape,
        )
        if self.average_advantage:
            adv = (adv - adv.mean()) / adv.std().clamp_min(1e-8)
        td.set((g, ADVANTAGE), adv)
        td.set((g, VALUE_TARGET), target)
        return td
