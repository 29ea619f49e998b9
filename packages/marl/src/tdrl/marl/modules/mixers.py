"""Value-decomposition mixers: VDN (sum) and QMIX (monotonic hypernetwork mixing).

Both map per-agent chosen action values ``[*B, n_agents, 1]`` to a team value ``[*B, 1]``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.nn import functional as F

__all__ = ["VDNMixer", "QMixer"]


def _check_q(q: Tensor, n_agents: int, who: str) -> None:
    if q.ndim < 2 or q.shape[-2:] != (n_agents, 1):
        raise ValueError(
            f"{who} expects per-agent values [*B, n_agents={n_agents}, 1], got {tuple(q.shape)}."
        )


class VDNMixer(nn.Module):
    """Value decomposition networks (Sunehag et al., 2017, arXiv:1706.05296):
    ``Q_tot = sum_i Q_i``.

    Args:
        n_agents: number of agents.

    Shapes: ``q`` ``[*B, n_agents, 1]`` (``state`` is ignored) -> ``[*B, 1]``.
    """

    def __init__(self, n_agents: int) -> None:
        super().__init__()
        self.n_agents = n_agents

    def forward(self, q: Tensor, state: Tensor | None = None) -> Tensor:
        _check_q(q, self.n_agents, "VDNMixer")
        return q.sum(-2)


class QMixer(nn.Module):
    """QMIX (Rashid et al., 2018, arXiv:1803.11485): a mixing network whose weights come from
    hypernetworks of the global state and are made non-negative (``abs``), so ``Q_tot`` is
    monotonic in every ``Q_i`` (``dQ_tot / dQ_i >= 0``).

    ``Q_tot = w2(s)^T elu(W1(s)^T q + b1(s)) + V(s)`` with ``W1 = |hyper_w1(s)|``,
    ``w2 = |hyper_w2(s)|``.

    Args:
        state_shape: shape of the global state (trailing dims of ``state``), e.g. ``(48,)``
            or ``(n_agents, obs_dim)`` to mix on all agents' observations.
        n_agents: number of agents.
        mixing_embed_dim: width of the mixing layer.
        hypernet_hidden: hidden size of the two-layer hypernetworks of ``W1`` and ``w2``
            (PyMARL's ``hypernet_layers=2``); None: one linear layer each, as TorchRL's
            ``QMixer`` (the mixer BenchMARL's QMIX uses).

    Shapes: ``q`` ``[*B, n_agents, 1]``, ``state`` ``[*B, *state_shape]`` -> ``[*B, 1]``.
    """

    def __init__(
        self,
        state_shape: int | Sequence[int],
        n_agents: int,
        mixing_embed_dim: int = 32,
        hypernet_hidden: int | None = 64,
    ) -> None:
        super().__init__()
        self.state_shape = (state_shape,) if isinstance(state_shape, int) else tuple(state_shape)
        self.state_dim = int(torch.Size(self.state_shape).numel())
        self.n_agents, self.embed_dim = n_agents, mixing_embed_dim
        s, e, h = self.state_dim, mixing_embed_dim, hypernet_hidden
        if h is None:
            self.hyper_w1, self.hyper_w2 = nn.Linear(s, e * n_agents), nn.Linear(s, e)
        elif h >= 1:
            self.hyper_w1 = nn.Sequential(nn.Linear(s, h), nn.ReLU(), nn.Linear(h, e * n_agents))
            self.hyper_w2 = nn.Sequential(nn.Linear(s, h), nn.ReLU(), nn.Linear(h, e))
        else:
            raise ValueError(f"QMixer hypernet_hidden must be >= 1 or None (one linear layer), got {h}.")
        self.hyper_b1 = nn.Linear(s, e)
        self.value = nn.Sequential(nn.Linear(s, e), nn.ReLU(), nn.Linear(e, 1))

    def _check_inputs(self, q: Tensor, state: Tensor) -> int:
        """Raise on a wrong ``q`` or ``state`` shape; returns the number of state dims."""
        _check_q(q, self.n_agents, "QMixer")
        k = len(self.state_shape)
        if tuple(state.shape[state.ndim - k :]) != self.state_shape:
            raise ValueError(
                f"QMixer expects a state [*B, {', '.join(map(str, self.state_shape))}], got "
                f"{tuple(state.shape)}."
            )
        return k

    def forward(self, q: Tensor, state: Tensor) -> Tensor:
        k = self._check_inputs(q, state)
        batch = q.shape[:-2]
        s = state.reshape(*state.shape[: state.ndim - k], self.state_dim).expand(*batch, -1)
        w1 = self.hyper_w1(s).abs().view(*batch, self.n_agents, self.embed_dim)
        b1 = self.hyper_b1(s).unsqueeze(-2)  # [*B, 1, e]
        hidden = F.elu(torch.matmul(q.transpose(-1, -2), w1) + b1)  # [*B, 1, e]
        w2 = self.hyper_w2(s).abs().unsqueeze(-1)  # [*B, e, 1]
        return torch.matmul(hidden, w2).squeeze(-1) + self.value(s)  # [*B, 1]

    def seed_stacked_forward(self, params: dict[str, Tensor], q: Tensor, state: Tensor) -> Tensor:
        """The forward of ``n_seeds`` stacked mixers at once (``tdrl.core.train.seeds``'s
        ``SeedStackedModule`` calls it instead of ``vmap``): every hypernetwork layer is one
        ``baddbmm`` over the seed dim.

        Args:
            params: this mixer's parameter names -> ``[n_seeds, *shape]``.
            q: ``[n_seeds, *B, n_agents, 1]``. state: ``[n_seeds, *B, *state_shape]``.

        Returns:
            ``[n_seeds, *B, 1]``, seed ``k``'s rows equal to ``forward`` with its parameters.
        """
        k = self._check_inputs(q, state)
        n_seeds, batch = q.shape[0], q.shape[1:-2]
        s = state.reshape(*state.shape[: state.ndim - k], self.state_dim).expand(n_seeds, *batch, -1)
        s = s.reshape(n_seeds, -1, self.state_dim)  # [S, R, state_dim]

        def linear(name: str, x: Tensor) -> Tensor:
            return torch.baddbmm(params[f"{name}.bias"].unsqueeze(1), x, params[f"{name}.weight"].transpose(1, 2))

        def net(name: str, x: Tensor) -> Tensor:  # one Linear, or Linear -> ReLU -> Linear
            if f"{name}.weight" in params:
                return linear(name, x)
            return linear(f"{name}.2", torch.relu(linear(f"{name}.0", x)))

        rows = s.shape[1]
        w1 = net("hyper_w1", s).abs().view(n_seeds, rows, self.n_agents, self.embed_dim)
        b1 = linear("hyper_b1", s).unsqueeze(-2)  # [S, R, 1, e]
        qr = q.reshape(n_seeds, rows, self.n_agents, 1)
        hidden = F.elu(torch.matmul(qr.transpose(-1, -2), w1) + b1)  # [S, R, 1, e]
        w2 = net("hyper_w2", s).abs().unsqueeze(-1)  # [S, R, e, 1]
        out = torch.matmul(hidden, w2).squeeze(-1) + net("value", s)  # [S, R, 1]
        return out.reshape(n_seeds, *batch, 1)
