"""Public sum/min tree ops: Triton on CUDA, the torch reference elsewhere."""

from __future__ import annotations

import torch

from .._dispatch import use_triton
from .reference import sum_tree_find_reference, sum_tree_update_reference


def sum_tree_update(sums: torch.Tensor, mins: torch.Tensor, index: torch.Tensor,
                    value: torch.Tensor) -> None:
    """Set the leaves ``index`` of a sum/min tree to ``value`` and refresh their ancestors.

    The tree is the flat heap layout of :func:`sum_tree_new` (see
    :mod:`tdrl.kernels.sum_tree.reference`). On CUDA one Triton launch (a batch of up to 16k
    leaves; one launch per level above that) writes the leaves and recomputes the touched
    ancestors; elsewhere the vectorised torch reference runs.

    Args:
        sums: ``[2P]`` tree sums, updated in place.
        mins: ``[2P]`` tree minima over the positive leaves, updated in place.
        index: int64 ``[K]`` leaf indices in ``[0, capacity)``, on the tree's device.
            Duplicates: **the last write wins**.
        value: ``[K]`` values >= 0 (a scalar tensor is broadcast); ``0`` empties a leaf.

    Raises:
        ValueError: ``index`` and ``value`` sizes differ.
    """
    index = index.reshape(-1)
    value = value.reshape(-1)
    if value.numel() == 1 and index.numel() != 1:
        value = value.expand(index.numel())
    if value.numel() != index.numel():
        raise ValueError(f"sum_tree_update: {index.numel()} indices but {value.numel()} values.")
    if use_triton(sums, mins, index, value):
        from .triton import sum_tree_update_triton

        sum_tree_update_triton(sums, mins, index, value)
    else:
        sum_tree_update_reference(sums, mins, index, value)


def sum_tree_find(sums: torch.Tensor, mass: torch.Tensor) -> torch.Tensor:
    """Prefix-sum search: for each mass, the leaf ``i`` with
    ``sum(leaves[:i]) <= mass < sum(leaves[:i+1])``.

    Sampling ``K`` leaves in proportion to their values is
    ``sum_tree_find(sums, torch.rand(K, device=d, dtype=sums.dtype) * sums[1])``: the root
    ``sums[1]`` is the total, and no value leaves the device.

    Args:
        sums: ``[2P]`` tree sums.
        mass: ``[K]`` masses in ``[0, total)``, on the tree's device.

    Returns:
        int64 ``[K]`` leaf indices; never an empty leaf while the total is positive.
    """
    if use_triton(sums, mass):
        from .triton import sum_tree_find_triton

        return sum_tree_find_triton(sums, mass)
    return sum_tree_find_reference(sums, mass)
