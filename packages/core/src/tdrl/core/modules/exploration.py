"""Exploration wrappers appended after a policy: annealed epsilon-greedy, additive
Gaussian noise and Ornstein-Uhlenbeck noise.

They act only when the interaction type is ``RANDOM`` (or unset), so evaluation under
``set_interaction_type(InteractionType.DETERMINISTIC)`` is noise-free. ``step(frames)``
anneals the noise level linearly over ``annealing_num_steps`` frames.
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.nn import InteractionType, TensorDictModuleBase, set_interaction_type
from tensordict.nn.probabilistic import interaction_type
from torch import Tensor

from tdrl.core import keys as K
from tdrl.core.values._utils import NestedKey, require
from tdrl.core.torchrl_names import accept_torchrl_names

ExplorationType = InteractionType
"""TorchRL's name of tensordict's ``InteractionType`` (``RANDOM``, ``DETERMINISTIC``, ``MODE``, ``MEAN``)."""
set_exploration_type = set_interaction_type
"""TorchRL's name of tensordict's ``set_interaction_type`` (a context manager / decorator)."""

__all__ = ["EGreedyModule", "AdditiveGaussianModule", "OrnsteinUhlenbeckModule", "ExplorationType", "set_exploration_type"]


def _exploring() -> bool:
    mode = interaction_type()
    return mode is None or mode == InteractionType.RANDOM


class _Annealed(TensorDictModuleBase):
    """Linear annealing of ``value`` from ``init`` to ``end`` over ``num_steps`` frames."""

    def __init__(self, init: float, end: float, num_steps: int) -> None:
        super().__init__()
        if num_steps < 0:
            raise ValueError(f"annealing_num_steps must be >= 0, got {num_steps}.")
        self.init, self.end, self.num_steps = float(init), float(end), int(num_steps)
        self.register_buffer("frames", torch.zeros((), dtype=torch.long))

    @property
    def level(self) -> float:
        """The current noise level (epsilon or sigma)."""
        if self.num_steps == 0:
            return self.end
        frac = min(1.0, float(self.frames) / self.num_steps)
        return self.init + frac * (self.end - self.init)

    def step(self, frames: int = 1) -> None:
        """Advance the annealing schedule by ``frames`` environment frames."""
        self.frames += int(frames)

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        """Replace ``td[action_key]`` by :meth:`_perturb`'s action while exploring (outside
        ``set_exploration_type(DETERMINISTIC)``); ``td`` is returned unchanged otherwise."""
        if _exploring():
            action = require(td, self.action_key, type(self).__name__)
            td.set(self.action_key, self._perturb(td, action))
        return td

    def _perturb(self, td: TensorDictBase, action: Tensor) -> Tensor:  # pragma: no cover
        raise NotImplementedError


@accept_torchrl_names
class EGreedyModule(_Annealed):
    """Epsilon-greedy over discrete actions, epsilon annealed linearly.

    Args:
        n_actions: number of actions, or a ``Categorical`` / ``OneHot`` spec (its ``n``); a
            continuous spec (``Bounded``) makes the random actions the spec's uniform draws.
        eps_init, eps_end, annealing_num_steps: schedule.
        action_key: the action to perturb: int64 ``[*B]`` or one-hot ``[*B, n]``.
        action_mask_key: optional ``[*B, n]`` bool; random actions are drawn uniformly
            among allowed actions.
        one_hot: actions are one-hot; ``None`` (default): when ``n_actions`` is a ``OneHot``
            spec (``GymEnv``'s ``env.action_spec`` for a ``Discrete`` space), else indices.
    """

    def __init__(
        self,
        n_actions: int | Any,
        eps_init: float = 1.0,
        eps_end: float = 0.05,
        annealing_num_steps: int = 10_000,
        action_key: NestedKey = K.ACTION,
        action_mask_key: NestedKey | None = None,
        one_hot: bool | None = None,
    ) -> None:
        super().__init__(eps_init, eps_end, annealing_num_steps)
        from tdrl.core.specs import Composite, OneHot

        if isinstance(n_actions, Composite):  # TorchRL's EGreedyModule(spec=actor.spec)
            n_actions = n_actions[action_key]
        # a spec without a count (Bounded, Unbounded): a random action is the spec's own draw
        self.continuous_spec = n_actions if (hasattr(n_actions, "rand") and not hasattr(n_actions, "n")) else None
        if self.continuous_spec is not None:
            if action_mask_key is not None:
                raise ValueError("EGreedyModule: an action mask needs a discrete spec, got "
                                 f"{type(n_actions).__name__}")
            n_actions, one_hot = 0, False
        if one_hot is None:
            one_hot = isinstance(n_actions, OneHot)
        if not isinstance(n_actions, int):
            n_actions = getattr(n_actions, "n", n_actions)
        self.n_actions, self.action_key = int(n_actions), action_key
        self.mask_key, self.one_hot = action_mask_key, one_hot
        self.in_keys = [action_key] + ([action_mask_key] if action_mask_key else [])
        self.out_keys = [action_key]

    @property
    def eps(self) -> float:
        return self.level

    def _perturb(self, td: TensorDictBase, action: Tensor) -> Tensor:
        if self.continuous_spec is not None:  # as TorchRL: epsilon of the steps act at random in the spec
            event = len(self.continuous_spec.shape)
            batch = action.shape[: action.dim() - event]
            random = self.continuous_spec.rand(batch).to(action.device, action.dtype)
            explore = (torch.rand(batch, device=action.device) < self.eps).reshape(*batch, *([1] * event))
            return torch.where(explore, random, action)
        batch = action.shape[:-1] if self.one_hot else action.shape
        if self.mask_key is not None:
            mask = require(td, self.mask_key, type(self).__name__).bool()
            weights = mask.reshape(-1, self.n_actions).float()
            random = torch.multinomial(weights, 1).reshape(batch)
        else:
            random = torch.randint(self.n_actions, batch, device=action.device)
        if self.one_hot:
            random = torch.nn.functional.one_hot(random, self.n_actions).to(action.dtype)
        explore = torch.rand(batch, device=action.device) < self.eps
        if self.one_hot:
            explore = explore.unsqueeze(-1)
        return torch.where(explore, random, action)


def _clamped(noisy: Tensor, low, high) -> Tensor:
    """``noisy`` clamped to the optional action bounds (floats or tensors)."""
    conv = lambda b: None if b is None else torch.as_tensor(b, dtype=noisy.dtype, device=noisy.device)  # noqa: E731
    low, high = conv(low), conv(high)
    if low is not None or high is not None:
        noisy = noisy.clamp(low, high)
    return noisy


@accept_torchrl_names
class AdditiveGaussianModule(_Annealed):
    """``action + N(0, sigma^2)``, clamped to ``[low, high]``; sigma annealed linearly.

    Args:
        sigma_init, sigma_end, annealing_num_steps: schedule.
        low, high: action bounds (floats or tensors), optional.
        action_key: default ``"action"``.
    """

    def __init__(
        self,
        sigma_init: float = 0.1,
        sigma_end: float = 0.1,
        annealing_num_steps: int = 1_000,
        low: float | Tensor | None = None,
        high: float | Tensor | None = None,
        action_key: NestedKey = K.ACTION,
    ) -> None:
        super().__init__(sigma_init, sigma_end, annealing_num_steps)
        self.low, self.high, self.action_key = low, high, action_key
        self.in_keys, self.out_keys = [action_key], [action_key]

    @property
    def sigma(self) -> float:
        return self.level

    def _perturb(self, td: TensorDictBase, action: Tensor) -> Tensor:
        return _clamped(action + self.sigma * torch.randn_like(action), self.low, self.high)


@accept_torchrl_names
class OrnsteinUhlenbeckModule(_Annealed):
    """Temporally correlated OU noise (as in DDPG, arXiv:1509.02971):
    ``n_{t+1} = n_t + theta (mu - n_t) dt + sigma sqrt(dt) N(0, 1)``.

    The noise state lives in the module (one per batch element) and is reset to ``x0``
    where ``is_init`` is True (and whenever the batch shape changes). ``sigma`` anneals
    from ``sigma_init`` to ``sigma_end``.

    Args:
        theta, mu, dt, x0: OU parameters. sigma_init, sigma_end, annealing_num_steps: schedule.
        low, high: optional action bounds. action_key, is_init_key: keys.
    """

    def __init__(
        self,
        theta: float = 0.15,
        mu: float = 0.0,
        sigma_init: float = 0.2,
        sigma_end: float = 0.2,
        annealing_num_steps: int = 1_000,
        dt: float = 1e-2,
        x0: float = 0.0,
        low: float | Tensor | None = None,
        high: float | Tensor | None = None,
        action_key: NestedKey = K.ACTION,
        is_init_key: NestedKey = K.IS_INIT,
    ) -> None:
        super().__init__(sigma_init, sigma_end, annealing_num_steps)
        self.theta, self.mu, self.dt, self.x0 = float(theta), float(mu), float(dt), float(x0)
        self.low, self.high = low, high
        self.action_key, self.is_init_key = action_key, is_init_key
        self.in_keys, self.out_keys = [action_key, is_init_key], [action_key]
        self.noise: Tensor | None = None

    @property
    def sigma(self) -> float:
        return self.level

    def reset(self) -> None:
        """Forget the noise state (next call starts from ``x0``)."""
        self.noise = None

    def _perturb(self, td: TensorDictBase, action: Tensor) -> Tensor:
        if self.noise is None or self.noise.shape != action.shape:
            self.noise = torch.full_like(action, self.x0)
        is_init = td.get(self.is_init_key, None)
        if is_init is not None:
            reset = is_init.bool().reshape(*is_init.shape[: td.batch_dims], -1).any(-1)
            reset = reset.reshape(*reset.shape, *([1] * (action.dim() - reset.dim())))
            self.noise = torch.where(reset, torch.full_like(action, self.x0), self.noise)
        n = self.noise
        n = n + self.theta * (self.mu - n) * self.dt + self.sigma * self.dt**0.5 * torch.randn_like(n)
        self.noise = n.detach()
        return _clamped(action + n, self.low, self.high)
