"""Pure-torch sum/min tree over flat heap arrays (the reference of the Triton kernels).

Layout (shared with :mod:`.triton`): a tree over ``capacity`` leaves is two 1-D tensors
``sums`` and ``mins`` of length ``2 * P`` with ``P = next_power_of_two(capacity)`` (at least
1). Node ``1`` is the root, node ``k`` has children ``2k`` and ``2k + 1``, leaf ``i`` is node
``P + i``; slot ``0`` is unused. ``sums[k]`` is the sum of the leaves below ``k``; ``mins[k]``
their minimum over the *positive* leaves (a zero leaf cannot be drawn, so it holds ``+inf``).
Empty leaves (and the padding ``capacity .. P-1``) hold ``0`` / ``+inf``. Sums are
recomputed from the children on every update, never incremented, so they do not drift.

Duplicate indices in one update: **the last write wins** (the value at the highest position
of ``index`` holding that leaf), as in :class:`tdrl.core.replay.SumMinTree`.
"""

from __future__ import annotations

import torch

__all__ = ["sum_tree_new", "sum_tree_update_reference", "sum_tree_find_reference", "last_writes"]


def tree_depth(sums: torch.Tensor) -> int:
    """The number of levels below the root of a tree stored as ``sums`` (``2 * P`` entries, ``P`` a
    power of two), or a ``ValueError`` naming how to build one."""
    n = sums.numel()
    if n < 2 or n & (n - 1):
        raise ValueError(
            f"sum tree arrays must have length 2 * P with P a power of two, got {n} "
            "(build them with tdrl.kernels.sum_tree_new(capacity))."
        )
    return (n // 2).bit_length() - 1


def sum_tree_new(capacity: int, dtype: torch.dtype = torch.float64,
                 device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """An empty tree over ``capacity`` leaves.

    Args:
        capacity: number of leaves (>= 1).
        dtype: floating dtype of the tree (float64 keeps sums over a million leaves exact
            enough for sampling; float32 halves the memory).
        device: where the tree lives (CUDA for the Triton kernels).

    Returns:
        ``(sums, mins)``, each ``[2 * P]`` with ``P = next_power_of_two(capacity)``: sums all
        ``0``, mins all ``+inf``.
    """
    if capacity < 1:
        raise ValueError(f"sum tree capacity must be >= 1, got {capacity}.")
    p = 1 << (int(capacity) - 1).bit_length()
    sums = torch.zeros(2 * p, dtype=dtype, device=device)
    mins = torch.full((2 * p,), torch.inf, dtype=dtype, device=device)
    return sums, mins


def last_writes(index: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep, for every distinct index, the value of its last occurrence.

    Args:
        index: int64 ``[K]``.
        value: ``[K]``.

    Returns:
        ``(index, value)`` ``[U]`` with distinct indices (sorted), ``U <= K``.
    """
    if index.numel() <= 1:
        return index, value
    # Stable sort keeps equal indices in call order: the last of each run is the last write.
    order = torch.sort(index, stable=True).indices
    idx = index[order]
    last = torch.ones_like(idx, dtype=torch.bool)
    last[:-1] = idx[1:] != idx[:-1]
    return idx[last], value[order][last]


def sum_tree_update_reference(sums: torch.Tensor, mins: torch.Tensor, index: torch.Tensor,
                              value: torch.Tensor) -> None:
    """Set leaves ``index`` to ``value`` and recompute their ancestors, in place.

    Args:
        sums: ``[2P]`` tree sums (see the module layout).
        mins: ``[2P]`` tree minima.
        index: int64 ``[K]`` leaf indices in ``[0, capacity)`` (not checked here: the caller
            does, once); duplicates: the last write wins.
        value: ``[K]`` values >= 0 of the tree's dtype; ``0`` empties a leaf (never drawn,
            ``+inf`` for the min).
    """
    depth = tree_depth(sums)
    p = sums.numel() // 2
    index, value = last_writes(index.reshape(-1), value.reshape(-1).to(sums.dtype))
    if index.numel() == 0:
        return
    node = index + p
    sums.index_copy_(0, node, value)
    mins.index_copy_(0, node, torch.where(value > 0, value, torch.inf))
    for _ in range(depth):
        node = node // 2  # duplicated parents get identical values: their children are final
        left, right = 2 * node, 2 * node + 1
        sums.index_copy_(0, node, sums[left] + sums[right])
        mins.index_copy_(0, node, torch.minimum(mins[left], mins[right]))


def sum_tree_find_reference(sums: torch.Tensor, mass: torch.Tensor) -> torch.Tensor:
    """Leaf ``i`` with ``sum(leaves[:i]) <= mass < sum(leaves[:i+1])``, for a batch of masses.

    The descent goes right when ``mass >= sums[left]`` and the right subtree is not empty,
    so round-off never lands on an empty leaf while the total is positive.

    Args:
        sums: ``[2P]`` tree sums.
        mass: ``[K]`` masses in ``[0, total)`` (any float dtype; computed in the tree's).

    Returns:
        int64 ``[K]`` leaf indices in ``[0, P)`` (in ``[0, capacity)`` while the total is > 0).
    """
    depth = tree_depth(sums)
    p = sums.numel() // 2
    m = mass.reshape(-1).to(sums.dtype).clone()
    node = torch.ones(m.numel(), dtype=torch.int64, device=sums.device)
    for _ in range(depth):
        left = sums[2 * node]
        right = sums[2 * node + 1]
        go_right = (m >= left) & (right > 0)
        m = torch.where(go_right, m - left, m)
        node = 2 * node + go_right.to(torch.int64)
    return node - p
