"""A batched, differentiable pure-torch Pendulum (the dynamics of Gymnasium's ``Pendulum-v1``)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from tensordict import TensorDictBase

from tdrl.core.td_access import new_td

from ..keys import ACTION, DONE, OBSERVATION, REWARD, TERMINATED, TRUNCATED
from ..specs import Bounded, Composite, Unbounded
from .common import EnvBase

__all__ = ["PendulumEnv"]


def _angle_normalize(x: torch.Tensor) -> torch.Tensor:
    return ((x + math.pi) % (2 * math.pi)) - math.pi


class PendulumEnv(EnvBase):
    """Inverted pendulum swing-up, any batch size, in torch.

    Same dynamics, reward and start distribution as Gymnasium's ``Pendulum-v1``::

        thdot' = clip(thdot + (3 g / (2 l) sin(th) + 3 / (m l^2) u) dt, -8, 8)
        th'    = th + thdot' dt
        reward = -(normalize(th)^2 + 0.1 thdot^2 + 0.001 u^2)

    The state (``"th"``, ``"thdot"``, each ``(*batch, 1)``) travels in the TensorDict and the
    step is pure torch, so gradients flow from actions through whole rollouts (for
    model-based / analytic policy gradients). ``step`` never terminates; it sets
    ``truncated`` after ``max_episode_steps`` (200 as in Gymnasium; ``None``: never).

    Keys: ``"observation"`` ``(*batch, 3)`` = (cos th, sin th, thdot), ``"th"``, ``"thdot"``,
    ``"step_count"`` int64 ``(*batch, 1)``; action ``(*batch, 1)`` in ``[-2, 2]``.

    Args:
        batch_size: number of pendulums, e.g. ``(4096,)``; ``()`` for one.
        device: device of all tensors.
        max_episode_steps: truncation horizon.
        g: gravity (Gymnasium's default 10.0).
        dtype: float dtype of states and observations.
        check_actions: check actions against the spec at every step.
    """

    max_speed = 8.0
    max_torque = 2.0
    dt = 0.05
    m = 1.0
    length = 1.0

    def __init__(
        self,
        batch_size: int | Sequence[int] | torch.Size = (),
        device: torch.device | str = "cpu",
        max_episode_steps: int | None = 200,
        g: float = 10.0,
        dtype: torch.dtype = torch.float32,
        check_actions: bool = False,
    ) -> None:
        if isinstance(batch_size, int):
            batch_size = (batch_size,)
        super().__init__(batch_size=batch_size, device=device, check_actions=check_actions)
        self.g = g
        self.max_episode_steps = max_episode_steps
        self.dtype = dtype
        b, dev = self.batch_size, self.device
        high = torch.tensor([1.0, 1.0, self.max_speed], dtype=dtype)
        self.observation_spec = Composite(
            {
                OBSERVATION: Bounded(-high, high, (*b, 3), dev, dtype),
                "th": Unbounded((*b, 1), dev, dtype),
                "thdot": Bounded(-self.max_speed, self.max_speed, (*b, 1), dev, dtype),
                "step_count": Unbounded((*b, 1), dev, torch.int64),
            },
            shape=b,
            device=dev,
        )
        self.action_spec = Bounded(-self.max_torque, self.max_torque, (*b, 1), dev, dtype)
        self.reward_spec = Unbounded((*b, 1), dev, dtype)
        self.full_state_spec = Composite(
            {k: self.observation_spec[k].clone() for k in ("th", "thdot", "step_count")},
            shape=b,
            device=dev,
        )
        self._generator = torch.Generator(device=dev)
        self._generator.seed()

    def _obs(self, th: torch.Tensor, thdot: torch.Tensor) -> torch.Tensor:
        return torch.cat([th.cos(), th.sin(), thdot], -1)

    def _reset(self, tensordict: TensorDictBase | None, **kwargs) -> TensorDictBase:
        shape = (*self.batch_size, 1)
        u = torch.rand((*self.batch_size, 2), generator=self._generator, device=self.device,
                       dtype=self.dtype)
        th = (u[..., :1] * 2 - 1) * math.pi
        thdot = u[..., 1:] * 2 - 1
        false = torch.zeros(shape, dtype=torch.bool, device=self.device)
        return new_td(
            {
                OBSERVATION: self._obs(th, thdot),
                "th": th,
                "thdot": thdot,
                "step_count": torch.zeros(shape, dtype=torch.int64, device=self.device),
                DONE: false,
                TERMINATED: false.clone(),
                TRUNCATED: false.clone(),
            },
            self.batch_size,
            self.device,
        )

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        th = tensordict.get("th")
        thdot = tensordict.get("thdot")
        u = tensordict.get(ACTION)
        if u.shape != self.action_spec.shape:  # broadcasting would silently grow the batch
            raise ValueError(
                f"PendulumEnv expects an action of shape {tuple(self.action_spec.shape)} "
                f"(batch_size {tuple(self.batch_size)} + (1,)), got {tuple(u.shape)}."
            )
        u = u.clamp(-self.max_torque, self.max_torque)
        cost = _angle_normalize(th).pow(2) + 0.1 * thdot.pow(2) + 0.001 * u.pow(2)
        g, m, l, dt = self.g, self.m, self.length, self.dt
        new_thdot = thdot + (3 * g / (2 * l) * th.sin() + 3.0 / (m * l**2) * u) * dt
        new_thdot = new_thdot.clamp(-self.max_speed, self.max_speed)
        new_th = th + new_thdot * dt
        step_count = tensordict.get("step_count") + 1
        terminated = torch.zeros_like(step_count, dtype=torch.bool)
        if self.max_episode_steps is not None:
            truncated = step_count >= self.max_episode_steps
        else:
            truncated = terminated.clone()
        return new_td(
            {
                OBSERVATION: self._obs(new_th, new_thdot),
                "th": new_th,
                "thdot": new_thdot,
                "step_count": step_count,
                REWARD: -cost,
                DONE: truncated.clone(),
                TERMINATED: terminated,
                TRUNCATED: truncated,
            },
            self.batch_size,
            self.device,
        )

    def _set_seed(self, seed: int) -> int:
        self._generator.manual_seed(seed)
        return seed + 1
