"""``MultiAgentMLP``: one MLP per agent (or one shared), evaluated for all agents in one call.

Per-agent parameters are stacked along a leading agent dim (``weight[l]`` is
``[n_agents, in, out]``) and applied with one batched ``einsum``; there is no Python loop
over agents, so the cost grows with the tensor sizes, not with the number of agents.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from ._linear import linear_io

__all__ = ["MultiAgentMLP"]


class MultiAgentMLP(nn.Module):
    """An MLP for a group of agents.

    Args:
        n_agent_inputs: input features per agent.
        n_agent_outputs: output features per agent.
        n_agents: number of agents in the group.
        centralised: every agent sees the inputs of all agents (a centralised critic, as in
            MAPPO); otherwise each agent sees its own input only.
        share_params: one set of parameters for all agents (otherwise one per agent).
        num_cells: hidden sizes, e.g. ``(256, 256)``.
        activation: activation class (default ``nn.Tanh``).
        orthogonal_init: orthogonal weights (gain sqrt(2) hidden, ``last_gain`` output) and
            zero biases; otherwise PyTorch's ``nn.Linear`` default initialisation.
        last_gain: gain of the output layer with ``orthogonal_init``.

    Shapes:
        ``[*B, n_agents, n_agent_inputs]`` -> ``[*B, n_agents, n_agent_outputs]``.
        A centralised shared network computes one output and expands it over agents.

    Example:
        >>> mlp = MultiAgentMLP(18, 4, n_agents=3, centralised=False, share_params=False)
        >>> mlp(torch.zeros(32, 3, 18)).shape
        torch.Size([32, 3, 4])
    """

    def __init__(
        self,
        n_agent_inputs: int,
        n_agent_outputs: int,
        n_agents: int,
        centralised: bool = False,
        share_params: bool = True,
        num_cells: Sequence[int] = (256, 256),
        activation: Callable[[], nn.Module] = nn.Tanh,
        orthogonal_init: bool = False,
        last_gain: float = 1.0,
    ) -> None:
        super().__init__()
        if n_agents < 1 or n_agent_inputs < 1 or n_agent_outputs < 1:
            raise ValueError(
                f"n_agents, n_agent_inputs and n_agent_outputs must be >= 1, got {n_agents}, "
                f"{n_agent_inputs}, {n_agent_outputs}."
            )
        self.n_agents, self.n_agent_inputs = n_agents, n_agent_inputs
        self.n_agent_outputs = n_agent_outputs
        self.centralised, self.share_params = centralised, share_params
        self.num_cells = tuple(num_cells)
        self.activation = activation()
        n_nets = 1 if share_params else n_agents
        sizes = [n_agent_inputs * (n_agents if centralised else 1), *num_cells, n_agent_outputs]
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
            w = torch.empty(n_nets, fan_in, fan_out)
            b = torch.empty(n_nets, fan_out)
            last = i == len(sizes) - 2
            for k in range(n_nets):  # initialisation only: each agent gets its own draw
                if orthogonal_init:
                    tmp = torch.empty(fan_out, fan_in)  # nn.Linear layout
                    nn.init.orthogonal_(tmp, last_gain if last else math.sqrt(2.0))
                    w[k] = tmp.T
                    b[k].zero_()
                else:  # nn.Linear's default: U(-1/sqrt(fan_in), 1/sqrt(fan_in))
                    bound = 1.0 / math.sqrt(fan_in)
                    nn.init.uniform_(w[k], -bound, bound)
                    nn.init.uniform_(b[k], -bound, bound)
            self.weights.append(nn.Parameter(w))
            self.biases.append(nn.Parameter(b))

    def _check(self, x: Tensor) -> None:
        if x.ndim < 2 or x.shape[-2:] != (self.n_agents, self.n_agent_inputs):
            raise ValueError(
                f"MultiAgentMLP expects input [*B, n_agents={self.n_agents}, "
                f"n_agent_inputs={self.n_agent_inputs}], got {tuple(x.shape)}."
            )

    def forward(self, x: Tensor) -> Tensor:
        """Apply the network to every agent's input ``x`` ``[*B, n_agents, n_agent_inputs]``."""
        self._check(x)
        n_layers = len(self.weights)
        h = x.flatten(-2) if self.centralised else x
        shared_input = self.centralised  # h has no agent dim yet: [*B, n * in]
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            if self.share_params:  # one fused GEMM + bias over every row
                h = linear_io(h.reshape(-1, h.shape[-1]), w[0], b[0]).reshape(*h.shape[:-1], w.shape[-1])
            elif shared_input:
                h = torch.einsum("...i,nio->...no", h, w) + b
                shared_input = False
            else:
                h = torch.einsum("...ni,nio->...no", h, w) + b
            if i < n_layers - 1:
                h = self.activation(h)
        if self.centralised and self.share_params:
            h = h.unsqueeze(-2).expand(*h.shape[:-1], self.n_agents, h.shape[-1])
        return h

    def seed_stacked_forward(self, params: dict[str, Tensor], x: Tensor) -> Tensor:
        """The forward of ``n_seeds`` stacked copies at once (``tdrl.core.train.seeds``'s
        ``SeedStackedModule`` calls it instead of ``vmap``): batched matmuls over the seed dim.

        Args:
            params: ``{"weights.<l>": [n_seeds, n_nets, in, out], "biases.<l>": [n_seeds, n_nets, out]}``.
            x: ``[n_seeds, *B, n_agents, n_agent_inputs]``.

        Returns:
            ``[n_seeds, *B, n_agents, n_agent_outputs]``, seed ``k``'s rows equal to
            ``forward`` with seed ``k``'s parameters.
        """
        self._check(x)
        s, mid, n = x.shape[0], x.shape[1:-2], self.n_agents
        n_layers = len(self.weights)
        h = x.reshape(s, -1, n, x.shape[-1])  # [S, M, n, in]
        if self.centralised:
            h = h.flatten(-2)  # [S, M, n * in]: no agent dim yet
        shared_input = self.centralised
        for i in range(n_layers):
            w, b = params[f"weights.{i}"], params[f"biases.{i}"]
            if self.share_params:  # one batched GEMM per seed over every row
                rows = h.reshape(s, -1, h.shape[-1])
                h = torch.baddbmm(b[:, 0].unsqueeze(1), rows, w[:, 0]).reshape(*h.shape[:-1], w.shape[-1])
            elif shared_input:
                h = torch.einsum("smi,snio->smno", h, w) + b.unsqueeze(1)
                shared_input = False
            else:
                h = torch.einsum("smni,snio->smno", h, w) + b.unsqueeze(1)
            if i < n_layers - 1:
                h = self.activation(h)
        if self.centralised and self.share_params:
            h = h.unsqueeze(-2).expand(*h.shape[:-1], n, h.shape[-1])
        return h.reshape(s, *mid, n, h.shape[-1])

    def extra_repr(self) -> str:
        return (
            f"n_agents={self.n_agents}, in={self.n_agent_inputs}, out={self.n_agent_outputs}, "
            f"centralised={self.centralised}, share_params={self.share_params}, "
            f"num_cells={self.num_cells}"
        )
