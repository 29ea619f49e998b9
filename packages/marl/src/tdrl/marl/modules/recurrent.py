"""``MultiAgentGRU`` / ``MultiAgentLSTM``: a GRU / LSTM for a group of agents (BenchMARL's
``layers/gru`` and ``layers/lstm`` models), with core's ``is_init`` resets and step / recurrent
modes.

Two layers, as ``TensorDictModule`` wraps a network: :class:`MultiAgentGRU` reads and writes the
TensorDict (keys, the state carried under ``"next"``, the mode), and its ``module`` is an
:class:`AgentRecurrentNet` on plain tensors, which runs core's
:func:`~tdrl.core.modules.rnn_layers` (the ``tdrl.kernels`` time loop) with the agent dim moved
so that every agent is one more row of the cell's batch. A GRU carries one state, an LSTM two
(``h``, ``c``); each is handled the same way:

* step mode (collection): input ``[*B, n_agents, F]``, each state ``[*B, n_agents, L, H]`` read
  from the root (zeros if absent) and the new state written under ``"next"``;
* recurrent mode (:meth:`MultiAgentGRU.set_recurrent_mode`, training): input
  ``[*B, T, n_agents, F]`` over whole trajectories; the state stored at ``t = 0`` starts each
  row and it is zeroed wherever ``is_init[..., t]`` (``[*B, T, 1]``, from core's
  ``InitTracker``) is True.

Both modes are one sequence call (a step is a sequence of one). With shared parameters the
agents run through one cell (agents folded into the batch), as
:class:`~tdrl.marl.modules.MultiAgentMLP` shares its weights; otherwise each agent has its own.
A centralised GRU (MAPPO's critic) reads every agent's input concatenated.

Seeds trained as one model (:mod:`tdrl.marl.vectorised`): the seed stacker replaces ``module`` by
core's ``SeedStackedModule``, which calls :meth:`AgentRecurrentNet.seed_stacked_forward`: every
seed's cell weights ``[n_seeds, ...]``, each step one batched GEMM over the seeds, the hidden
state of every sub-env carried in its seed's block.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase, TensorDictSequential
from torch import Tensor, nn

from tdrl.core.keys import IS_INIT
from tdrl.core.modules import rnn_layers
from tdrl.core.values._utils import NestedKey
from tdrl.core.keys import next_key

__all__ = ["AgentRecurrentNet", "MultiAgentGRU", "MultiAgentLSTM", "recurrent_view", "recurrent_layers"]

_CELLS = {"gru": (nn.GRU, 1), "lstm": (nn.LSTM, 2)}  # torch's cell (its parameters) and its state count


class AgentRecurrentNet(nn.Module):
    """The tensor network of :class:`MultiAgentGRU` / :class:`MultiAgentLSTM`: one ``nn.GRU`` /
    ``nn.LSTM`` (its parameters; the time loop is core's :func:`~tdrl.core.modules.rnn_layers`)
    per agent, or one shared.

    Args:
        cell: ``"gru"`` or ``"lstm"``.
        n_agent_inputs, hidden_size, n_agents, centralised, share_params, num_layers: as
            :class:`MultiAgentGRU`.

    Shapes (``forward``): ``x`` ``[N, T, n_agents, F]``, ``init`` ``[N, T]`` bool, each state
    ``[N, n_agents, L, H]`` (before ``t = 0``) -> ``(out [N, T, n_agents, H], *states after every
    step [N, T, n_agents, L, H])``.
    """

    def __init__(self, cell: str, n_agent_inputs: int, hidden_size: int, n_agents: int, centralised: bool,
                 share_params: bool, num_layers: int = 1) -> None:
        super().__init__()
        if cell not in _CELLS:
            raise ValueError(f"cell must be one of {sorted(_CELLS)}, got {cell!r}.")
        self.cell, self.n_agents, self.centralised, self.share_params = cell, n_agents, centralised, share_params
        self.num_layers, self.hidden_size = num_layers, hidden_size
        fan_in = n_agent_inputs * (n_agents if centralised else 1)
        rnn = _CELLS[cell][0]
        self.cells = nn.ModuleList(rnn(fan_in, hidden_size, num_layers, batch_first=True)
                                   for _ in range(1 if share_params else n_agents))

    def forward(self, x: Tensor, init: Tensor, *states: Tensor) -> tuple[Tensor, ...]:
        """Run every agent's cell over ``[N, T]`` (see the class docstring for shapes)."""
        return self._run([dict(c.named_parameters()) for c in self.cells], x, init, states, 0)

    def seed_stacked_forward(self, params: Mapping[str, Tensor], x: Tensor, init: Tensor,
                             *states: Tensor) -> tuple[Tensor, ...]:
        """The forward of ``n_seeds`` stacked copies at once (core's ``SeedStackedModule`` calls it
        instead of ``vmap``, which cannot batch ``nn.GRU``): every cell GEMM one batched GEMM
        over the seed dim, the same time loop (:func:`~tdrl.core.modules.rnn_layers`).

        Args:
            params: ``{"cells.<k>.weight_ih_l0": [n_seeds, 3H, F], ...}``: this module's
                parameter names, each with a leading seed dim.
            x: ``[n_seeds, N, T, n_agents, F]``. init: ``[n_seeds, N, T]``. states: each
                ``[n_seeds, N, n_agents, L, H]``.

        Returns:
            ``forward``'s outputs with a leading seed dim; seed ``k``'s equal ``forward`` with
            seed ``k``'s parameters on its block.
        """
        per_net = [{n[len(f"cells.{k}."):]: t for n, t in params.items() if n.startswith(f"cells.{k}.")}
                   for k in range(len(self.cells))]
        return self._run(per_net, x, init, states, 1)

    def _run(self, per_net: list[dict], x: Tensor, init: Tensor, states, n_lead: int) -> tuple[Tensor, ...]:
        """Both paths: ``n_lead`` leading stack dims (0 or 1) on every input and parameter."""
        lead, n, L, H = x.shape[:n_lead], self.n_agents, self.num_layers, self.hidden_size
        N, T = x.shape[n_lead], x.shape[n_lead + 1]
        if self.centralised:
            x = x.flatten(-2).unsqueeze(-2)  # [*S, N, T, 1, n * F]
        a = x.shape[-2]  # agents in the cell's input: n, or 1 (centralised)
        if self.share_params:  # the agents are rows of one cell's batch: [*S, N * a, ...]
            xs = x.transpose(-3, -2).reshape(*lead, N * a, T, x.shape[-1])
            st = [s[..., :a, :, :].reshape(*lead, N * a, L, H).transpose(-3, -2) for s in states]
            ini = init.unsqueeze(-2).expand(*lead, N, a, T).reshape(*lead, N * a, T)
            out, new = rnn_layers(self.cell, per_net[0], xs, st, ini)
            out = out.reshape(*lead, N, a, T, H).transpose(-3, -2)  # [*S, N, T, a, H]
            new = [s.reshape(*lead, N, a, T, L, H).movedim(-4, -3) for s in new]  # [*S, N, T, a, L, H]
        else:
            outs, news = [], []
            for k, params in enumerate(per_net):
                xk = x[..., min(k, a - 1), :]  # [*S, N, T, F]
                sk = [s[..., k, :, :].transpose(-3, -2) for s in states]  # [*S, L, N, H]
                o, nw = rnn_layers(self.cell, params, xk, sk, init)
                outs.append(o)
                news.append(nw)
            out = torch.stack(outs, -2)
            new = [torch.stack([nw[j] for nw in news], -3) for j in range(len(states))]
        if out.shape[-2] != n:  # centralised and shared: one state for the team
            out = out.expand(*out.shape[:-2], n, H)
            new = [s.expand(*s.shape[:-3], n, L, H) for s in new]
        return (out, *new)

    def extra_repr(self) -> str:
        return (f"cell={self.cell}, n_agents={self.n_agents}, hidden={self.hidden_size}, layers={self.num_layers}, "
                f"centralised={self.centralised}, share_params={self.share_params}")


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
    over agents. The parameters live in ``module`` (:class:`AgentRecurrentNet`).
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
        self.module = AgentRecurrentNet(cell, n_agent_inputs, hidden_size, n_agents, centralised, share_params,
                                        num_layers)
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
        # one sequence call: [N, T] rows (a step is T = 1), the state stored at t = 0 starting each row
        t_len = batch[-1] if self.recurrent_mode else 1
        first = [s[..., 0, :, :, :] if self.recurrent_mode else s for s in states]
        out, *new = self.module(x.reshape(-1, t_len, n, self.n_agent_inputs), init.reshape(-1, t_len),
                                *(s.reshape(-1, n, L, H) for s in first))
        td.set(self.out_key, out.reshape(*batch, n, H))
        for key, s in zip(self.state_keys, new):
            td.set(next_key(key), s.reshape(*batch, n, L, H))
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
