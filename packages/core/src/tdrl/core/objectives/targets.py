"""Target-network updaters: Polyak (soft) and periodic copy (hard)."""

from __future__ import annotations

import torch
from torch import nn
from tdrl.core.torchrl_names import accept_torchrl_names

__all__ = ["SoftUpdate", "HardUpdate"]


def _pairs(loss: nn.Module) -> list[tuple[list[torch.Tensor], list[torch.Tensor]]]:
    pairs = list(getattr(loss, "target_pairs", lambda: [])())
    if not pairs:
        raise ValueError(
            f"{type(loss).__name__} has no target networks to update (target_pairs() is empty)."
        )
    out = []
    for online, target in pairs:
        src = list(online.parameters()) + list(online.buffers())
        dst = list(target.parameters()) + list(target.buffers())
        out.append((src, dst))
    return out


@accept_torchrl_names
class SoftUpdate:
    """Polyak averaging ``target <- (1 - tau) * target + tau * online`` on every ``step()``.

    Args:
        loss: a loss with target networks (``target_pairs()``).
        tau: interpolation weight of the online network (TorchRL's ``eps = 1 - tau``).
    """

    def __init__(self, loss: nn.Module, tau: float = 0.005) -> None:
        if not 0.0 < tau <= 1.0:
            raise ValueError(f"tau must be in (0, 1], got {tau}.")
        self.tau = tau
        self._pairs = _pairs(loss)

    @torch.no_grad()
    def step(self) -> None:
        for src, dst in self._pairs:
            floats = [(s, d) for s, d in zip(src, dst) if d.is_floating_point()]
            if floats:
                torch._foreach_lerp_([d for _, d in floats], [s for s, _ in floats], self.tau)
            for s, d in zip(src, dst):
                if not d.is_floating_point():
                    d.copy_(s)


@accept_torchrl_names
class HardUpdate:
    """Copy the online weights into the targets every ``update_interval`` calls of ``step()``.

    Args:
        loss: a loss with target networks. update_interval: number of ``step()`` calls.
    """

    def __init__(self, loss: nn.Module, update_interval: int = 1000) -> None:
        if update_interval < 1:
            raise ValueError(f"update_interval must be >= 1, got {update_interval}.")
        self.update_interval = update_interval
        self.counter = 0
        self._pairs = _pairs(loss)

    @torch.no_grad()
    def step(self) -> None:
        self.counter += 1
        if self.counter % self.update_interval == 0:
            for src, dst in self._pairs:
                for s, d in zip(src, dst):
                    d.copy_(s)

    def state_dict(self) -> dict:
        return {"counter": self.counter}

    def load_state_dict(self, state: dict) -> None:
        self.counter = int(state["counter"])
