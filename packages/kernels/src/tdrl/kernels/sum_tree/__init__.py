"""Sum/min tree for prioritized replay: prefix-sum sampling and batched leaf updates."""

from __future__ import annotations

from .api import sum_tree_find, sum_tree_update
from .reference import sum_tree_find_reference, sum_tree_new, sum_tree_update_reference

__all__ = [
    "sum_tree_find",
    "sum_tree_find_reference",
    "sum_tree_new",
    "sum_tree_update",
    "sum_tree_update_reference",
]
