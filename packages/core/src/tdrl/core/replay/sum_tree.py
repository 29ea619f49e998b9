"""A vectorised sum/min tree for prioritized sampling.

Every operation works on a whole batch of indices at once, never with a Python loop per
item. The tree has a wide fan-out (32 children per node by default), so a million leaves
need only four levels: an update recomputes, level by level, the touched parents from
their blocks of children (one gather + one reduction per level), and a prefix-sum search
descends the levels for all queries together (one gather + one cumsum + one batched
``searchsorted`` per level). Sums are recomputed from the children, never incremented, so
they do not drift. The tree is ``float64`` on the CPU.
"""

from __future__ import annotations

import torch

__all__ = ["SumMinTree"]


def _as_index(index) -> torch.Tensor:
    if isinstance(index, torch.Tensor):
        return index.detach().reshape(-1).to("cpu", torch.int64)
    return torch.as_tensor(index, dtype=torch.int64).reshape(-1)


def _as_values(value, n: int) -> torch.Tensor:
    value = torch.as_tensor(value, dtype=torch.float64).detach().to("cpu").reshape(-1)
    return value.expand(n) if value.numel() == 1 else value


class SumMinTree:
    """Tree holding, for every node, the sum and the min of the leaves below it.

    Leaves are the priorities of the storage slots ``0 .. capacity-1``; empty slots hold
    ``0`` for the sum and ``+inf`` for the min, so they are never sampled and never the
    minimum. The min is over the positive leaves (a zero leaf cannot be drawn).

    Args:
        capacity: number of leaves (storage slots).
        fanout: children per node (>= 2).
    """

    def __init__(self, capacity: int, fanout: int = 32) -> None:
        if capacity < 1:
            raise ValueError(f"SumMinTree capacity must be >= 1, got {capacity}.")
        if fanout < 2:
            raise ValueError(f"SumMinTree fanout must be >= 2, got {fanout}.")
        self.capacity = int(capacity)
        self.fanout = f = int(fanout)
        # Level 0 holds the leaves; level l+1 holds one node per block of f nodes of
        # level l. Every level is padded to a multiple of f so it views as [-1, f].
        self._sums: list[torch.Tensor] = []
        self._mins: list[torch.Tensor] = []
        n = self.capacity
        while True:
            padded = -(-n // f) * f
            self._sums.append(torch.zeros(padded, dtype=torch.float64))
            self._mins.append(torch.full((padded,), torch.inf, dtype=torch.float64))
            if padded == f:
                break
            n = padded // f

    # ------------------------------------------------------------------ queries
    @property
    def total(self) -> float:
        """Sum of all leaves."""
        return float(self._sums[-1].sum())

    @property
    def min(self) -> float:
        """Smallest positive leaf (``inf`` when there is none)."""
        return float(self._mins[-1].min())

    def __getitem__(self, index) -> torch.Tensor:
        """Leaf values at ``index`` (int tensor / array-like ``[K]``), float64 ``[K]``."""
        return self._sums[0].index_select(0, _as_index(index))

    # ------------------------------------------------------------------ updates
    def update(self, index, value, empty: bool = False) -> None:
        """Set the leaves ``index`` to ``value`` and refresh their ancestors.

        Args:
            index: int tensor / array-like ``[K]`` with values in ``[0, capacity)``.
                Duplicated indices: the last write wins (``index_copy_`` on the CPU
                writes in order), as in ``tdrl.kernels.sum_tree_update``.
            value: float tensor / array-like broadcastable to ``[K]``; must be >= 0.
            empty: mark the leaves empty instead (sum 0, min ``inf``); ``value`` ignored.
        """
        idx = _as_index(index)
        if idx.numel() == 0:
            return
        lo, hi = int(idx.min()), int(idx.max())
        if lo < 0 or hi >= self.capacity:
            raise IndexError(
                f"SumMinTree index out of range: got values in [{lo}, {hi}], "
                f"capacity is {self.capacity}."
            )
        if empty:
            self._sums[0].index_fill_(0, idx, 0.0)
            self._mins[0].index_fill_(0, idx, torch.inf)
        else:
            val = _as_values(value, idx.numel())
            if val.shape != idx.shape:
                raise ValueError(f"SumMinTree.update: {idx.numel()} indices, {val.numel()} values.")
            self._sums[0].index_copy_(0, idx, val)
            # Zero leaves are never drawn, so they do not count for the minimum.
            self._mins[0].index_copy_(0, idx, torch.where(val > 0, val, torch.inf))
        self._refresh(idx)

    def _refresh(self, node: torch.Tensor) -> None:
        f = self.fanout
        for level in range(len(self._sums) - 1):
            node = node.div(f, rounding_mode="floor")
            # Duplicated parents get identical values: their children are already final.
            sums = self._sums[level].view(-1, f).index_select(0, node).sum(1)
            mins = self._mins[level].view(-1, f).index_select(0, node).amin(1)
            self._sums[level + 1].index_copy_(0, node, sums)
            self._mins[level + 1].index_copy_(0, node, mins)

    def clear(self, index) -> None:
        """Empty the leaves ``index`` (sum 0, min ``inf``)."""
        self.update(index, 0.0, empty=True)

    def find_prefix_sum(self, mass) -> torch.Tensor:
        """Leaf index ``i`` such that ``sum(leaves[:i]) <= mass < sum(leaves[:i+1])``.

        Args:
            mass: float tensor / array-like ``[K]`` with values in ``[0, total)``.

        Returns:
            int64 tensor ``[K]`` of leaf indices in ``[0, capacity)``.
        """
        v = torch.as_tensor(mass, dtype=torch.float64).reshape(-1, 1).clone()
        f = self.fanout
        node = torch.zeros(v.shape[0], dtype=torch.int64)
        for level in range(len(self._sums) - 1, -1, -1):
            block = self._sums[level].view(-1, f).index_select(0, node)  # [K, f]
            csum = block.cumsum(1)
            child = torch.searchsorted(csum, v, right=True).clamp_(max=f - 1)  # [K, 1]
            v -= csum.gather(1, child) - block.gather(1, child)
            node = node * f + child.squeeze(1)
        # Float round-off can land on an empty padding leaf; clamp back into range.
        return node.clamp_(max=self.capacity - 1)

    def sample(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """Draw ``n`` leaf indices with probability proportional to their values.

        Args:
            n: number of draws (with replacement).
            generator: optional torch generator; by default torch's global RNG, so
                ``torch.manual_seed`` makes sampling reproducible.

        Returns:
            int64 tensor ``[n]`` of leaf indices.
        """
        total = self.total
        if not total > 0:
            raise RuntimeError("Cannot sample from a SumMinTree whose total priority is 0.")
        mass = torch.rand(n, dtype=torch.float64, generator=generator).mul_(total)
        return self.find_prefix_sum(mass)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        return {"capacity": self.capacity, "fanout": self.fanout,
                "sum": self._sums[0].clone(), "min": self._mins[0].clone()}

    def load_state_dict(self, state: dict) -> None:
        if int(state["capacity"]) != self.capacity or int(state["fanout"]) != self.fanout:
            raise ValueError(
                f"SumMinTree state has capacity {state['capacity']} / fanout {state['fanout']}, "
                f"this tree has {self.capacity} / {self.fanout}."
            )
        self._sums[0].copy_(torch.as_tensor(state["sum"]))
        self._mins[0].copy_(torch.as_tensor(state["min"]))
        f = self.fanout
        for level in range(len(self._sums) - 1):  # parents; the padding stays empty
            sums = self._sums[level].view(-1, f).sum(1)
            mins = self._mins[level].view(-1, f).amin(1)
            self._sums[level + 1].zero_()[: sums.numel()].copy_(sums)
            self._mins[level + 1].fill_(torch.inf)[: mins.numel()].copy_(mins)
