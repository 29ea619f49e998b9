"""Returns as data: ``TargetReturn`` (the return still to reach, for return-conditioned
policies such as the Decision Transformer) and ``Reward2GoTransform`` (the discounted
reward-to-go of stored trajectories)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tensordict import TensorDictBase

from ..keys import DONE, NEXT, REWARD
from ..specs import Composite, Unbounded
from ..values.functional import discounted_cumsum
from .base import Transform

__all__ = ["TargetReturn", "Reward2GoTransform"]


class TargetReturn(Transform):
    """Write the return a policy should still reach.

    ``reset`` writes ``target_return``; with ``mode="reduce"`` each step subtracts the
    reward (``next.target_return = target_return - next.reward``), with ``"constant"`` it
    stays. (Chen et al. 2021, "Decision Transformer".)

    Args:
        target_return: the return to reach at the episode start.
        mode: ``"reduce"`` or ``"constant"``.
        in_keys: reward keys (default ``["reward"]``).
        out_keys: target keys (default ``["target_return"]``).
    """

    def __init__(self, target_return: float, mode: str = "reduce", in_keys: Sequence | None = None,
                 out_keys: Sequence | None = None) -> None:
        if mode not in ("reduce", "constant"):
            raise ValueError(f"TargetReturn mode must be 'reduce' or 'constant', got {mode!r}.")
        super().__init__(in_keys or [REWARD], out_keys or ["target_return"])
        self.target_return = float(target_return)
        self.mode = mode

    def _shape(self, k_in, batch) -> tuple:
        env = self.parent
        if env is not None and k_in in env.base_env.full_reward_spec:
            return tuple(env.base_env.full_reward_spec[k_in].shape)
        return (*batch, 1)

    def _reset(self, td, td_reset):
        for k_in, k_out in zip(self.in_keys, self.out_keys, strict=True):
            td_reset.set(k_out, torch.full(self._shape(k_in, td_reset.batch_size), self.target_return,
                                           device=td_reset.device))
        return td_reset

    def _step(self, td, next_td):
        for k_in, k_out in zip(self.in_keys, self.out_keys, strict=True):
            prev = td.get(k_out, None)
            if prev is None:
                raise KeyError(f"TargetReturn: the step input has no {k_out!r}; start from reset().")
            if self.mode == "reduce":
                prev = prev - next_td.get(k_in).to(prev.dtype)
            next_td.set(k_out, prev)
        return next_td

    def _call(self, td):
        return td

    def transform_observation_spec(self, spec: Composite) -> Composite:
        for k_in, k_out in zip(self.in_keys, self.out_keys, strict=True):
            spec[k_out] = Unbounded(self._shape(k_in, spec.shape), spec.device, torch.float32)
        return spec

    def extra_repr(self) -> str:
        return f"target_return={self.target_return}, mode={self.mode!r}"


class Reward2GoTransform(Transform):
    """The discounted reward-to-go ``G_t = r_t + gamma * (1 - done_t) * G_{t+1}`` of stored
    trajectories, restarting at each episode end.

    As in TorchRL, this is not an env-step transform (a step cannot see the future): call it
    on a trajectory TensorDict of batch size ``[*B, T]`` (time last), e.g. a collector batch or
    a replay buffer's data; ``inv`` does the same (TorchRL applies it on ``extend``).

    Args:
        gamma: discount.
        in_keys: reward key (default ``("next", "reward")``).
        out_keys: where to write (default ``"reward_to_go"``).
        done_key: the done flag marking episode ends (default ``("next", "done")``).
    """

    def __init__(self, gamma: float = 1.0, in_keys: Sequence | None = None,
                 out_keys: Sequence | None = None, done_key=(NEXT, DONE)) -> None:
        super().__init__(in_keys or [(NEXT, REWARD)], out_keys or ["reward_to_go"])
        self.gamma = float(gamma)
        self.done_key = done_key

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        done = td.get(self.done_key, None)
        for k_in, k_out in zip(self.in_keys, self.out_keys, strict=True):
            reward = td.get(k_in)
            if reward.ndim != td.ndim + 1:
                raise ValueError(f"Reward2GoTransform: {k_in!r} has shape {tuple(reward.shape)}; "
                                 f"expected [*B, T, 1] over the batch {tuple(td.batch_size)}.")
            td.set(k_out, discounted_cumsum(reward, self.gamma, done))
        return td

    def inv(self, td: TensorDictBase) -> TensorDictBase:
        return self.forward(td)

    def _step(self, td, next_td):
        raise RuntimeError("Reward2GoTransform needs whole trajectories: call it on stored data "
                           "(a collector batch, a replay buffer), not inside a TransformedEnv.")

    def extra_repr(self) -> str:
        return f"gamma={self.gamma}, in_keys={self.in_keys}, out_keys={self.out_keys}"
