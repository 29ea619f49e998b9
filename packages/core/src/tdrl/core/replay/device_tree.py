"""A sum/min tree that lives on an accelerator, for a :class:`PrioritizedSampler` whose
storage is on CUDA: sampling and priority updates run as ``tdrl.kernels`` sum-tree ops
(Triton on CUDA, the torch reference elsewhere) and never copy the priorities to the host.

It has the interface :class:`PrioritizedSampler` uses of :class:`SumMinTree`; ``total`` and
``min`` are 0-d tensors on the device (reading them as floats would synchronise).
"""

from __future__ import annotations

import torch
from tdrl.kernels import sum_tree_find, sum_tree_new, sum_tree_update

__all__ = ["DeviceSumTree"]


class DeviceSumTree:
    """Sum/min tree over ``capacity`` leaves in the flat heap layout of ``tdrl.kernels``.

    Args:
        capacity: number of leaves (storage slots).
        device: where the tree lives (``"cuda"`` for the Triton kernels).
        dtype: float64 by default (sums over a million leaves stay exact enough).

    Duplicate indices in one update: the last write wins, as in :class:`SumMinTree`.
    Indices are not range-checked on the device (that would synchronise); the sampler only
    passes slots it was given by its writer or sampled itself, and refuses negative ones.
    """

    def __init__(self, capacity: int, device: torch.device | str,
                 dtype: torch.dtype = torch.float64) -> None:
        self.capacity = int(capacity)
        self.device = torch.device(device)
        self._sums, self._mins = sum_tree_new(self.capacity, dtype, self.device)
        self._p = self._sums.numel() // 2

    @property
    def total(self) -> torch.Tensor:
        """Sum of all leaves, a 0-d tensor on the device."""
        return self._sums[1]

    @property
    def min(self) -> torch.Tensor:
        """Smallest positive leaf (``inf`` when there is none), a 0-d tensor on the device."""
        return self._mins[1]

    def _index(self, index) -> torch.Tensor:
        return torch.as_tensor(index).reshape(-1).to(self.device, torch.int64)

    def __getitem__(self, index) -> torch.Tensor:
        """Leaf values at ``index`` ``[K]``, ``[K]`` on the device."""
        return self._sums[self._index(index) + self._p]

    def update(self, index, value) -> None:
        """Set the leaves ``index`` ``[K]`` to ``value`` (>= 0, broadcastable to ``[K]``)."""
        idx = self._index(index)
        if idx.numel() == 0:
            return
        val = torch.as_tensor(value, dtype=self._sums.dtype).to(self.device).reshape(-1)
        sum_tree_update(self._sums, self._mins, idx, val)

    def clear(self, index) -> None:
        """Empty the leaves ``index`` (sum 0, min ``inf``)."""
        self.update(index, 0.0)

    def sample(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """Draw ``n`` leaves in proportion to their values (int64 ``[n]`` on the device).

        The total is not checked for being positive (that would synchronise): a tree whose
        leaves are all zero returns leaf 0.
        """
        mass = torch.rand(n, dtype=self._sums.dtype, device=self.device, generator=generator)
        return sum_tree_find(self._sums, mass.mul_(self._sums[1]))

    def state_dict(self) -> dict:
        """Leaves as CPU tensors: ``{"capacity", "sum" [capacity], "min" [capacity]}``."""
        leaves = slice(self._p, self._p + self.capacity)
        return {"capacity": self.capacity, "sum": self._sums[leaves].cpu(),
                "min": self._mins[leaves].cpu()}

    def load_state_dict(self, state: dict) -> None:
        """Load leaves saved by this class or by :class:`SumMinTree` (its first ``capacity``
        leaves are used; the padding it saves is empty)."""
        if int(state["capacity"]) != self.capacity:
            raise ValueError(f"DeviceSumTree state has capacity {state['capacity']}, "
                             f"this tree has {self.capacity}.")
        values = torch.as_tensor(state["sum"])[: self.capacity]
        self._sums, self._mins = sum_tree_new(self.capacity, self._sums.dtype, self.device)
        self.update(torch.arange(self.capacity), values)
