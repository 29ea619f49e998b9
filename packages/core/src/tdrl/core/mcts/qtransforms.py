"""Q-value transforms: how the children's Q-values of a node enter a selection score.

Each transform is ``(stats: NodeStats) -> [B, A]`` (``stats = tree.node_stats(node_index)``)
and is passed to a selection function (``functools.partial`` binds its options). Following
mctx:

* :func:`qtransform_by_parent_and_siblings` — min-max normalisation over the node's value and
  its visited children's Q-values (MuZero's normalisation, but local to the node).
* :func:`qtransform_by_min_max` — normalisation by fixed bounds known in advance, e.g.
  ``[-1, 1]`` for a game's outcome (AlphaZero).
* :func:`qtransform_completed_by_mix_value` — Gumbel MuZero's completed Q-values: unvisited
  children take a mixed value estimate, then the values are rescaled to ``[0, 1]`` and scaled
  by ``(maxvisit_init + max visits) * value_scale`` (Danihelka et al., 2022, eq. 8 and 33).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .tree import NodeStats, node_batched


@node_batched
def qtransform_by_parent_and_siblings(stats: NodeStats, *, epsilon: float = 1e-8) -> Tensor:
    """Min-max normalise the Q-values by the node's value and its visited children.

    Unvisited children get the minimum, i.e. a normalised score of 0.

    Args:
        stats: the scored node of each tree (``Tree.node_stats``).
        epsilon: lower bound of the normaliser ``max - min``.

    Returns:
        ``[B, A]`` Q-values in ``[0, 1]``.
    """
    qvalues, visited = stats.qvalues, stats.visits > 0
    node_value = stats.node_value[..., None]
    safe_q = torch.where(visited, qvalues, node_value)
    low = torch.minimum(node_value, safe_q.amin(-1, keepdim=True))
    high = torch.maximum(node_value, safe_q.amax(-1, keepdim=True))
    completed = torch.where(visited, qvalues, low)
    return (completed - low) / (high - low).clamp(min=epsilon)


@node_batched
def qtransform_by_min_max(stats: NodeStats, *, min_value: float, max_value: float) -> Tensor:
    """Normalise the Q-values by fixed bounds; unvisited children score 0 (``min_value``).

    Args:
        stats: the scored node of each tree (``Tree.node_stats``).
        min_value: lowest possible Q-value, mapped to 0.
        max_value: highest possible Q-value, mapped to 1.

    Returns:
        ``[B, A]`` normalised Q-values.
    """
    if not max_value > min_value:
        raise ValueError(f"need max_value > min_value, got [{min_value}, {max_value}]")
    qvalues = torch.where(stats.visits > 0, stats.qvalues, min_value)
    return (qvalues - min_value) / (max_value - min_value)


def _mixed_value(
    raw_value: Tensor, qvalues: Tensor, visit_counts: Tensor, prior_probs: Tensor
) -> Tensor:
    """Gumbel MuZero's ``v_mix`` (eq. 33): raw value mixed with the prior-weighted visited Q.

    Args:
        raw_value: ``[B]``; qvalues, visit_counts, prior_probs: ``[B, A]``.

    Returns:
        ``[B]`` mixed value.
    """
    visited = visit_counts > 0
    total_visits = visit_counts.sum(-1).to(qvalues.dtype)
    prior_probs = prior_probs.clamp(min=torch.finfo(prior_probs.dtype).tiny)
    visited_probs = torch.where(visited, prior_probs, torch.zeros_like(prior_probs))
    sum_probs = visited_probs.sum(-1, keepdim=True)
    weighted_q = (visited_probs * qvalues / torch.where(sum_probs > 0, sum_probs, 1.0)).sum(-1)
    return (raw_value + total_visits * weighted_q) / (total_visits + 1)


@node_batched
def qtransform_completed_by_mix_value(
    stats: NodeStats,
    *,
    value_scale: float = 0.1,
    maxvisit_init: float = 50.0,
    rescale_values: bool = True,
    use_mixed_value: bool = True,
    epsilon: float = 1e-8,
) -> Tensor:
    """Gumbel MuZero's completed Q-values, scaled for adding to logits.

    Args:
        stats: the scored node of each tree (``Tree.node_stats``).
        value_scale: ``c_scale`` of the paper.
        maxvisit_init: ``c_visit`` of the paper.
        rescale_values: min-max rescale the completed Q-values over the actions to ``[0, 1]``.
        use_mixed_value: complete unvisited children with ``v_mix`` (else the node's value).
        epsilon: lower bound of the rescaling normaliser.

    Returns:
        ``[B, A]`` ``sigma(completed Q)``.
    """
    qvalues, visit_counts = stats.qvalues, stats.visits
    if use_mixed_value:
        value = _mixed_value(stats.raw_value, qvalues, visit_counts, stats.prior_probs)
    else:
        value = stats.node_value
    completed = torch.where(visit_counts > 0, qvalues, value[..., None])
    if rescale_values:
        low = completed.amin(-1, keepdim=True)
        high = completed.amax(-1, keepdim=True)
        completed = (completed - low) / (high - low).clamp(min=epsilon)
    max_visit = visit_counts.amax(-1, keepdim=True).to(completed.dtype)
    return (maxvisit_init + max_visit) * value_scale * completed
