"""Prioritized experience replay (Schaul et al., 2016, "Prioritized Experience Replay").

Item ``i`` with priority ``p_i`` is drawn with probability ``P(i) = q_i / sum_j q_j`` where
``q_i = (p_i + eps) ** alpha``; its importance weight is
``w_i = (N * P(i)) ** -beta / max_j w_j``, and ``max_j w_j`` comes from the smallest stored
``q``, so weights are in ``(0, 1]``. New items get the largest priority seen so far, so
each is likely to be replayed at least once. Sampling and updates are vectorised through
:class:`~tdrl.core.replay.sum_tree.SumMinTree` on the CPU, and run as ``tdrl.kernels``
sum-tree ops (Triton) through :class:`~tdrl.core.replay.device_tree.DeviceSumTree` when
the sampler is built with ``device="cuda"`` for a storage on the GPU.
"""

from __future__ import annotations

import torch

from .device_tree import DeviceSumTree
from .samplers import Sampler, check_nonempty
from .storages import Storage
from .sum_tree import SumMinTree

__all__ = ["PrioritizedSampler", "WEIGHT_KEY"]

WEIGHT_KEY = "_weight"
"""Key of the importance weights in a sampled TensorDict (TorchRL's name)."""


class PrioritizedSampler(Sampler):
    """Samples items in proportion to ``(priority + eps) ** alpha``.

    Args:
        max_capacity: number of storage slots (the storage's ``max_size``).
        alpha: priority exponent (0 = uniform).
        beta: importance-weight exponent (1 = full correction).
        eps: added to every priority so none is exactly zero.
        max_priority: priority given to the first items written (later new items get the
            largest priority seen so far).
        device: where the tree lives. ``None`` / ``"cpu"`` (default): the CPU
            :class:`SumMinTree` (the fastest on the CPU). An accelerator (``"cuda"``, for a
            storage on the GPU): a :class:`DeviceSumTree` run by ``tdrl.kernels``' Triton
            sum-tree kernels, so sampled indices, weights and priority updates stay on the
            device; the one synchronisation left is the refusal of non-finite priorities in
            :meth:`update_priority` (one bool per call).

    ``sample`` returns ``info = {"_weight": w}`` with ``w`` float32 ``[batch_size]`` (on the
    tree's device).
    """

    def __init__(self, max_capacity: int, alpha: float = 0.6, beta: float = 0.4,
                 eps: float = 1e-8, max_priority: float = 1.0,
                 device: torch.device | str | None = None) -> None:
        if alpha < 0:
            raise ValueError(f"alpha must be >= 0, got {alpha}.")
        if beta < 0:
            raise ValueError(f"beta must be >= 0, got {beta}.")
        self.max_capacity = int(max_capacity)
        self.alpha = float(alpha)
        self.beta = float(beta)
        self.eps = float(eps)
        self._init_max_priority = float(max_priority)
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self._max_priority = float(max_priority)
        self._tree = self._new_tree()

    def _new_tree(self) -> SumMinTree | DeviceSumTree:
        if self.device.type == "cpu":
            return SumMinTree(self.max_capacity)
        return DeviceSumTree(self.max_capacity, self.device)

    def _q(self, priority: torch.Tensor) -> torch.Tensor:
        return (priority.abs() + self.eps).pow_(self.alpha)

    def mark_update(self, index: torch.Tensor, storage: Storage) -> None:
        index = index[index >= 0]
        self._tree.update(index, (abs(self._max_priority) + self.eps) ** self.alpha)

    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, dict]:
        n = check_nonempty(storage)
        if n > self.max_capacity:
            raise ValueError(
                f"The storage holds {n} items but the PrioritizedSampler was built for "
                f"max_capacity={self.max_capacity}."
            )
        tree = self._tree
        # Round-off can point past the filled slots; fold those back into range.
        index = tree.sample(batch_size).clamp_(max=n - 1)
        q = tree[index]
        # w = (n q / total) ** -beta / max_j (n q_j / total) ** -beta = (q / q_min) ** -beta
        weight = q.div_(tree.min).pow_(-self.beta).to(torch.float32)
        return index, {WEIGHT_KEY: weight}

    def update_priority(self, index, priority) -> None:
        """Set the priorities of the items at ``index``.

        Args:
            index: int64 tensor ``[K]`` (any shape, flattened) of storage slots; entries
                ``< 0`` (items a writer dropped) are ignored.
            priority: tensor or float broadcastable to ``index`` (e.g. the absolute TD
                error); must be finite.
        """
        index = torch.as_tensor(index).detach().reshape(-1).to(self.device, torch.int64)
        priority = torch.as_tensor(priority).detach().to(self.device, torch.float64).reshape(-1)
        if priority.numel() == 1:
            priority = priority.expand(index.numel())
        if priority.numel() != index.numel():
            raise ValueError(
                f"update_priority: {index.numel()} indices but {priority.numel()} priorities."
            )
        if self.device.type != "cpu":
            self._update_priority_device(index, priority)
            return
        if not torch.isfinite(priority).all():
            raise ValueError("update_priority got non-finite priorities (nan or inf).")
        keep = index >= 0
        if not keep.all():
            index, priority = index[keep], priority[keep]
        if index.numel() == 0:
            return
        self._tree.update(index, self._q(priority))
        self._max_priority = max(self._max_priority, float(priority.abs().max()))

    def _update_priority_device(self, index: torch.Tensor, priority: torch.Tensor) -> None:
        if index.numel() == 0:
            return
        # One synchronisation for the three facts the host needs.
        finite, all_kept, top = torch.stack([
            torch.isfinite(priority).all().double(), (index >= 0).all().double(),
            priority.abs().max(),
        ]).tolist()
        if not finite:
            raise ValueError("update_priority got non-finite priorities (nan or inf).")
        if not all_kept:
            keep = index >= 0
            index, priority = index[keep], priority[keep]
        self._tree.update(index, self._q(priority))
        self._max_priority = max(self._max_priority, top)

    def priority(self, index) -> torch.Tensor:
        """Current ``(priority + eps) ** alpha`` of the items at ``index``, float64 ``[K]``."""
        return self._tree[index]

    def empty(self) -> None:
        self._tree = self._new_tree()
        self._max_priority = self._init_max_priority

    def state_dict(self) -> dict:
        return {"tree": self._tree.state_dict(), "max_priority": self._max_priority}

    def load_state_dict(self, state: dict) -> None:
        self._tree.load_state_dict(state["tree"])
        self._max_priority = float(state["max_priority"])
