"""Search policies: root noise + search + final action, returned as a TensorDict.

* :func:`muzero_policy` — PUCT search (AlphaZero with a simulator model, MuZero with a
  learned one), Dirichlet noise at the root, the action drawn from ``N(a)^(1/T)``, and the
  visit distribution as the policy target.
* :func:`gumbel_muzero_policy` — Gumbel MuZero: sequential halving among the top-``m``
  actions of ``gumbel + logits`` at the root; the action is the best candidate left, and
  the policy target is the improved policy ``softmax(logits + sigma(completed Q))``.

The output TensorDict has batch ``[B]`` and the keys below, ready to be written with the
observation into a replay buffer and trained with a policy cross-entropy and a value loss.
"""

from __future__ import annotations

import math
from functools import partial

import torch
from tensordict import TensorDict
from torch import Tensor

from tdrl.core.keys import ACTION
from tdrl.core.td_access import new_td

from .qtransforms import qtransform_by_parent_and_siblings, qtransform_completed_by_mix_value
from .model_io import RecurrentFn
from .search import search
from .selection import (
    QTransform,
    add_dirichlet_noise,
    gumbel_interior_selection,
    gumbel_root_selection,
    gumbel_score,
    masked_argmax,
    puct_selection,
    sample_from_visits,
    sample_gumbel,
)
from .tree import ROOT_INDEX, EdgeChannel, NodeChannel, RootOutput, Tree, mask_invalid_logits

POLICY_TARGET = "policy_target"
"""``[B, A]`` search policy: the training target of the policy head."""
ROOT_VALUE = "root_value"
"""``[B]`` mean root value after the search (player to act's view): a value target."""
VISIT_COUNTS = "visit_counts"
"""``[B, A]`` int64 root visit counts."""
Q_VALUES = "q_values"
"""``[B, A]`` root Q-values (0 for unvisited actions)."""
CONSIDERED = "considered_actions"
"""``[B, A]`` bool: the actions Gumbel search considered at the root (top-m)."""


def _root_invalid(root: RootOutput, invalid_actions: Tensor | None) -> Tensor | None:
    if invalid_actions is not None and root.invalid_actions is not None:
        return invalid_actions | root.invalid_actions
    return invalid_actions if invalid_actions is not None else root.invalid_actions


def _output(
    tree: Tree, action: Tensor, policy_target: Tensor, visits: Tensor | None = None,
    root_edges: Tensor | None = None,
) -> TensorDict:
    """The policy's TensorDict; ``visits``: the root visit counts ``[B, A]`` int64, and
    ``root_edges`` the root's edge rows ``[B, A, 7]``, if made."""
    if root_edges is None:
        root_edges = tree.edge_data.select(1, ROOT_INDEX)
    if visits is None:
        visits = root_edges.select(-1, EdgeChannel.VISITS).long()  # whole numbers
    entries = {  # each [B, ...] by construction: built unchecked
        ACTION: action,
        POLICY_TARGET: policy_target,
        ROOT_VALUE: tree.node_data.select(1, ROOT_INDEX).select(-1, NodeChannel.VALUE),
        VISIT_COUNTS: visits,
        Q_VALUES: root_edges.select(-1, EdgeChannel.QVALUE),
    }
    return new_td(entries, torch.Size([tree.batch_size]))


def muzero_policy(
    root: RootOutput,
    recurrent_fn: RecurrentFn,
    num_simulations: int,
    *,
    invalid_actions: Tensor | None = None,
    max_depth: int | None = None,
    two_player: bool = False,
    dirichlet_alpha: float = 0.3,
    dirichlet_fraction: float = 0.25,
    pb_c_init: float = 1.25,
    pb_c_base: float = 19652.0,
    qtransform: QTransform = qtransform_by_parent_and_siblings,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
    return_tree: bool = False,
) -> TensorDict | tuple[TensorDict, Tree]:
    """AlphaZero / MuZero search with PUCT (Silver et al., 2018; Schrittwieser et al., 2020).

    Args:
        root: the roots (see :class:`RootOutput`), batch ``[B]``, ``A`` actions.
        recurrent_fn: ``(embedding, action) -> RecurrentOutput``.
        num_simulations: simulations per tree.
        invalid_actions: ``[B, A]`` bool, illegal root actions (merged with the root's own).
        max_depth: largest search depth (default unbounded).
        two_player: zero-sum alternating game (values negated per ply).
        dirichlet_alpha: concentration of the root Dirichlet noise.
        dirichlet_fraction: weight of the noise; ``0`` disables it (evaluation play).
        pb_c_init, pb_c_base: PUCT exploration constants.
        qtransform: how Q-values are normalised in the score (``functools.partial`` of a
            :mod:`~tdrl.core.mcts.qtransforms` function).
        temperature: the action is drawn with probability ``N(a)^(1/T)``; ``0`` plays the
            most visited action.
        generator: optional ``torch.Generator`` for the noise and the sampling.
        return_tree: also return the search tree.

    Returns:
        TensorDict ``[B]`` with ``"action"`` ``[B]``, ``"policy_target"`` ``[B, A]`` (visit
        counts / their sum), ``"root_value"`` ``[B]``, ``"visit_counts"`` ``[B, A]`` and
        ``"q_values"`` ``[B, A]``; and the tree if ``return_tree``.
    """
    invalid = _root_invalid(root, invalid_actions)
    logits = root.prior_logits
    if dirichlet_fraction > 0:
        logits = add_dirichlet_noise(
            logits,
            alpha=dirichlet_alpha,
            fraction=dirichlet_fraction,
            invalid_actions=invalid,
            generator=generator,
        )
    if logits is not root.prior_logits or invalid is not root.invalid_actions:
        root = root._replace(prior_logits=logits, invalid_actions=invalid)
    select = partial(
        puct_selection, pb_c_init=pb_c_init, pb_c_base=pb_c_base, qtransform=qtransform
    )
    tree = search(
        root, recurrent_fn, select, select, num_simulations,
        max_depth=max_depth, two_player=two_player,
    )  # fmt: skip
    root_edges = tree.edge_data.select(1, ROOT_INDEX)
    counts = root_edges.select(-1, EdgeChannel.VISITS)  # whole numbers: long() is exact
    visits = counts.long()
    action = sample_from_visits(
        visits, temperature, invalid_actions=invalid, generator=generator
    )
    # every simulation takes one root edge: the counts sum to num_simulations (>= 1)
    target = counts / float(num_simulations)
    out = _output(tree, action, target, visits, root_edges)
    return (out, tree) if return_tree else out


def gumbel_muzero_policy(
    root: RootOutput,
    recurrent_fn: RecurrentFn,
    num_simulations: int,
    *,
    invalid_actions: Tensor | None = None,
    max_depth: int | None = None,
    two_player: bool = False,
    max_num_considered_actions: int = 16,
    gumbel_scale: float = 1.0,
    qtransform: QTransform = qtransform_completed_by_mix_value,
    generator: torch.Generator | None = None,
    return_tree: bool = False,
) -> TensorDict | tuple[TensorDict, Tree]:
    """Gumbel MuZero search (Danihelka et al., 2022, "Policy improvement by planning with Gumbel").

    Args:
        root, recurrent_fn, num_simulations, invalid_actions, max_depth, two_player,
            return_tree: as in :func:`muzero_policy`.
        max_num_considered_actions: ``m``, actions sampled without replacement at the root.
        gumbel_scale: scale of the Gumbel noise; ``0`` gives a deterministic search.
        qtransform: completed-Q transform (default: mixed value, as in the paper).
        generator: optional ``torch.Generator`` for the Gumbel noise.

    Returns:
        TensorDict ``[B]`` with ``"action"``, ``"policy_target"`` (the improved policy
        ``softmax(logits + sigma(completed Q))`` over valid actions), ``"root_value"``,
        ``"visit_counts"``, ``"q_values"`` and ``"considered_actions"`` ``[B, A]`` bool; and
        the tree if ``return_tree``.
    """
    if max_num_considered_actions < 1:
        raise ValueError(f"max_num_considered_actions must be >= 1, got {max_num_considered_actions}")
    invalid = _root_invalid(root, invalid_actions)
    logits = mask_invalid_logits(root.prior_logits, invalid)
    root = root._replace(prior_logits=logits, invalid_actions=invalid)
    gumbel = gumbel_scale * sample_gumbel(
        tuple(logits.shape), dtype=logits.dtype, device=logits.device, generator=generator
    )
    extra = TensorDict({"gumbel": gumbel}, batch_size=logits.shape[:1])
    root_select = partial(
        gumbel_root_selection,
        num_simulations=num_simulations,
        max_num_considered_actions=max_num_considered_actions,
        qtransform=qtransform,
    )
    interior_select = partial(gumbel_interior_selection, qtransform=qtransform)
    tree = search(
        root, recurrent_fn, root_select, interior_select, num_simulations,
        max_depth=max_depth, two_player=two_player, extra=extra,
    )  # fmt: skip

    root_index = torch.full_like(root.value, ROOT_INDEX, dtype=torch.int64)
    visits = tree.children_visits[:, ROOT_INDEX]
    completed_q = qtransform(tree.node_stats(root_index))
    tree_logits = tree.children_prior_logits[:, ROOT_INDEX]
    # The final action: the best of the actions that received the most visits.
    most = visits.amax(-1)
    action = masked_argmax(gumbel_score(most, gumbel, tree_logits, completed_q, visits), invalid)
    target = torch.softmax(mask_invalid_logits(tree_logits + completed_q, invalid), -1)
    out = _output(tree, action, target)
    out.set(CONSIDERED, considered_actions(gumbel, tree_logits, invalid, max_num_considered_actions))
    return (out, tree) if return_tree else out


def considered_actions(
    gumbel: Tensor, logits: Tensor, invalid_actions: Tensor | None, m: int
) -> Tensor:
    """``[B, A]`` bool mask of the top-``min(m, #valid)`` actions of ``gumbel + logits``."""
    scores = gumbel + logits
    if invalid_actions is not None:
        scores = scores.masked_fill(invalid_actions, -math.inf)
    k = min(m, scores.shape[-1])
    top = scores.topk(k, -1).indices
    mask = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, top, True)
    if invalid_actions is not None:
        mask &= ~invalid_actions
    return mask
