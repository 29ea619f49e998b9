"""``MultiAgentGRU`` / ``MultiAgentLSTM``: core's :class:`~tdrl.core.modules.GRUModule` /
:class:`~tdrl.core.modules.LSTMModule` for a group of agents (BenchMARL's ``layers/gru`` and
``layers/lstm`` models).

The recurrent cell itself (its ``is_init`` resets, its step / recurrent modes and the
``tdrl.kernels`` time loop) is core's; this module only moves the agent dim so that every
agent is one more row of the cell's batch. A GRU carries one state, an LSTM two (``h``, ``c``);
each is handled the same way:

* step mode (collection): input ``[*B, n_agents, F]``, each state ``[*B, n_agents, L, H]`` read
  from the root (zeros if absent) and the new state written under ``"next"``;
* recurrent mode (:meth:`MultiAgentGRU.set_recurrent_mode`, training): input
  ``[*B, T, n_agents, F]`` over whole trajectories; the state stored at ``t = 0`` starts each
  row and it is zeroed wherever ``is_init[..., t]`` (``[*B, T, 1]``, from core's
  ``InitTracker``) is True.

With shared parameters the agents run through one GRU (one call, agents folded into the
batch), as :class:`~tdrl.marl.modules.MultiAgentMLP` shares its weights; otherwise each agent
has its own. A centralised GRU (MAPPO's critic) reads every agent's input concatenated.
"""

from __future__ import annotations

import copy

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModuleBase, TensorDictSequential
from torch import Tensor, nn

from tdrl.core.keys import IS_INIT, NEXT
from tdrl.core.modules import GRUModule, LSTMModule
from tdrl.core.values._utils import NestedKey
from tdrl.core.keys import next_key

__all__ = ["MultiAgentGRU", "MultiAgentLSTM", "recurrent_view", "recurrent_layers"]

_X, _H, _INIT = "x", "h", "is_init"  # the inner cell's keys
_CELLS = {"gru": (GRUModule, ("state",)), "lstm": (LSTMModule, ("state_h", "state_c"))}


class MultiAgentGRU(TensorDictModuleBase):
    """A GRU for every agent of a group, with its hidden state reset at episode starts
    (:class:`MultiAgentLSTM`: the same with an LSTM).

    Args:
        n_agent_inputs: input features per agent.
        hidden_size: GRU hidden size (the output features per agent).
        n_agents: agents in the group.
        centralised: every agent's GRU reads all agents' inputs (MAPPO's critic).
        share_params: one GRU for all agents (otherwise one per agent).
        in_key, out_key: input ``(group, ...)`` and output keys.
        state_key: where the hidden state lives, ``[*B(, T), n_agents, num_layers, H]``;
            two GRUs in one policy (actor and critic) need different keys.
        is_init_key: the episode-start flag ``[*B(, T), 1]`` (core's ``InitTracker``).
        num_layers: stacked GRU layers.

    Shapes: step mode ``[*B, n, F] -> [*B, n, H]``; recurrent mode ``[*B, T, n, F] ->
    [*B, T, n, H]``. A centralised shared GRU computes one state and output and expands them
    over agents.
    """

    def __init__(
        self,
        n_agent_inputs: int,
        hidden_size: int,
        n_agents: int,
        centralised: bool,
        share_params: bool,
        in_key: NestedKey,
        out_key: NestedKey,
        state_key: NestedKey,
        is_init_key: NestedKey = IS_INIT,
        num_layers: int = 1,
    ) -> None:
        self._build("gru", n_agent_inputs, hidden_size, n_agents, centralised, share_params, in_key, out_key,
                    (state_key,), is_init_key, num_layers)

    def _build(self, cell: str, n_agent_inputs: int, hidden_size: int, n_agents: int, centralised: bool,
               share_params: bool, in_key: NestedKey, out_key: NestedKey, state_keys: tuple, is_init_key: NestedKey,
               num_layers: int) -> None:
        super().__init__()
        if min(n_agent_inputs, hidden_size, n_agents, num_layers) < 1:
            raise ValueError(
                "n_agent_inputs, hidden_size, n_agents and num_layers must be >= 1, got "
                f"{n_agent_inputs}, {hidden_size}, {n_agents}, {num_layers}."
            )
        self.n_agents, self.n_agent_inputs, self.hidden_size = n_agents, n_agent_inputs, hidden_size
        self.num_layers, self.centralised, self.share_params = num_layers, centralised, share_params
        self.in_key, self.out_key, self.is_init_key = in_key, out_key, is_init_key
        self.state_keys, self.cell = tuple(state_keys), cell
        fan_in = n_agent_inputs * (n_agents if centralised else 1)
        module, self._inner_keys = _CELLS[cell]
        keys = {"state_key": self._inner_keys[0]} if cell == "gru" else {"state_keys": self._inner_keys}
        self.cells = nn.ModuleList(
            module(fan_in, hidden_size, num_layers, in_key=_X, out_key=_H, is_init_key=_INIT, **keys)
            for _ in range(1 if share_params else n_agents)
        )
        self.recurrent_mode = False
        self.in_keys = [in_key, is_init_key, *self.state_keys]
        self.out_keys = [out_key, *(next_key(k) for k in self.state_keys)]

    def set_recurrent_mode(self, mode: bool = True) -> "MultiAgentGRU":
        """A copy (sharing parameters) that expects ``[*B, T]`` trajectories when ``mode``."""
        other = copy.copy(self)
        other._modules = dict(self._modules)
        other.recurrent_mode = mode
        return other

    def _inputs(self, td: TensorDictBase) -> tuple[Tensor, Tensor, list]:
        name, nb = type(self).__name__, td.batch_dims
        if self.recurrent_mode and nb < 1:
            raise ValueError(f"{name} in recurrent mode needs a [*B, T] TensorDict, got batch {tuple(td.shape)}.")
        x = td.get(self.in_key, None)
        if x is None or x.shape[nb:] != (self.n_agents, self.n_agent_inputs):
            raise ValueError(
                f"{name} expects {self.in_key} of shape [*batch, n_agents={self.n_agents}, "
                f"{self.n_agent_inputs}] with batch {tuple(td.shape)}, got "
                f"{None if x is None else tuple(x.shape)}."
            )
        is_init = td.get(self.is_init_key, None)
        if is_init is None:
            raise KeyError(
                f"{name} needs {self.is_init_key!r} to reset its hidden state at episode starts; "
                "wrap the env with tdrl.core.InitTracker (TransformedEnv(env, InitTracker()))."
            )
        return x, is_init.bool().reshape(*td.shape), [td.get(k, None) for k in self.state_keys]

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        """Run the cell(s) on ``td``; writes ``out_key`` and ``("next", state_key)`` for each state."""
        x, init, states = self._inputs(td)
        batch, n, L, H = td.shape, self.n_agents, self.num_layers, self.hidden_size
        for j, key in enumerate(self.state_keys):
            if states[j] is None:
                states[j] = x.new_zeros(*batch, n, L, H)
                if not self.recurrent_mode:  # record the (zero) state so every step has the same keys
                    td.set(key, states[j])
        # agent-major layout for the inner cell: [*B', a, (T,) ...] with a = agents or 1
        t_dim = len(batch) - 1  # the time dim of x / state in recurrent mode
        if self.centralised:
            x = x.flatten(-2).unsqueeze(-2)  # [*B, 1, n * F]
        a = x.shape[-2]
        agent_dim = t_dim if self.recurrent_mode else len(batch)  # of x / state once moved
        if self.recurrent_mode:
            x = x.movedim(-2, t_dim)  # [*B', a, T, F]
            states = [s.movedim(-3, t_dim) for s in states]  # [*B', n, T, L, H]
        outs, news = [], []
        for k, cell in enumerate(self.cells):
            if self.share_params:  # the agents are rows of one cell's batch
                xk, sk = x, [s.narrow(agent_dim, 0, a) for s in states]
                init_k = init.unsqueeze(agent_dim).expand(xk.shape[:-1])
            else:
                xk, sk, init_k = x.select(agent_dim, min(k, a - 1)), [s.select(agent_dim, k) for s in states], init
            inner = TensorDict({_X: xk, _INIT: init_k, **dict(zip(self._inner_keys, sk))}, batch_size=xk.shape[:-1])
            inner = (cell.set_recurrent_mode(True) if self.recurrent_mode else cell)(inner)
            outs.append(inner.get(_H))
            news.append([inner.get((NEXT, k_)) for k_ in self._inner_keys])
        if self.share_params:
            out, new = outs[0], news[0]
        else:
            out = torch.stack(outs, agent_dim)
            new = [torch.stack([per[j] for per in news], agent_dim) for j in range(len(self.state_keys))]
        if self.recurrent_mode:  # back to [*B', T, a, ...]
            out, new = out.movedim(t_dim, -2), [s.movedim(t_dim, -3) for s in new]
        if out.shape[-2] != n:  # centralised and shared: one state for the team
            out = out.expand(*out.shape[:-2], n, H)
            new = [s.expand(*s.shape[:-3], n, L, H) for s in new]
        td.set(self.out_key, out)
        for key, s in zip(self.state_keys, new):
            td.set(next_key(key), s)
        return td

    def extra_repr(self) -> str:
        return (
            f"cell={self.cell}, n_agents={self.n_agents}, in={self.n_agent_inputs}, hidden={self.hidden_size}, "
            f"layers={self.num_layers}, centralised={self.centralised}, share_params={self.share_params}, "
            f"recurrent_mode={self.recurrent_mode}"
        )


class MultiAgentLSTM(MultiAgentGRU):
    """An LSTM for every agent of a group (BenchMARL's ``layers/lstm``): :class:`MultiAgentGRU`'s
    arguments and shapes, with two states, ``state_keys = (h, c)``, each ``[*B(, T), n_agents,
    num_layers, H]`` (zeroed at episode starts together)."""

    def __init__(
        self,
        n_agent_inputs: int,
        hidden_size: int,
        n_agents: int,
        centralised: bool,
        share_params: bool,
        in_key: NestedKey,
        out_key: NestedKey,
        state_keys: tuple[NestedKey, NestedKey],
        is_init_key: NestedKey = IS_INIT,
        num_layers: int = 1,
    ) -> None:
        if len(state_keys) != 2:
            raise ValueError(f"MultiAgentLSTM needs two state keys (h, c), got {state_keys!r}.")
        self._build("lstm", n_agent_inputs, hidden_size, n_agents, centralised, share_params, in_key, out_key,
                    tuple(state_keys), is_init_key, num_layers)


def recurrent_layers(net: nn.Module) -> list[MultiAgentGRU]:
    """The :class:`MultiAgentGRU` / :class:`MultiAgentLSTM` layers inside ``net``."""
    return [m for m in net.modules() if isinstance(m, MultiAgentGRU)]


def recurrent_view(net: nn.Module, mode: bool) -> nn.Module:
    """``net`` (a ``TensorDictSequential`` or a recurrent layer) with its recurrent layers in
    ``mode`` (True: ``[*B, T]`` sequences; False: one step), sharing every parameter."""
    if isinstance(net, MultiAgentGRU):
        return net.set_recurrent_mode(mode)
    if not isinstance(net, TensorDictSequential):
        raise TypeError(f"recurrent_view needs a TensorDictSequential or a MultiAgentGRU / MultiAgentLSTM, "
                        f"got {type(net).__name__}.")
    return TensorDictSequential(*(recurrent_view(m, mode) if isinstance(m, (MultiAgentGRU, TensorDictSequential))
                                  else m for m in net.module))
