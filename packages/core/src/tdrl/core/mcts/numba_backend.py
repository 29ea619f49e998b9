"""The search with its tree statistics walked and backed up by two compiled (numba) calls.

The tensor search (:mod:`~tdrl.core.mcts.search`) spends a fixed cost per torch op, some
hundred small ops per simulation; at 64 trees that is ~1 ms per simulation, against ~0.45 ms
for mctx's compiled step. Here the tree's tensors are viewed as numpy arrays (no copies) and
a simulation is three calls: :func:`_walk` (numba) walks all ``B`` trees down to their
leaves with the PUCT rule and returns the parents and actions ``[B]``; the model's
``recurrent_fn`` (torch) is called on those; :func:`_expand_backup` (numba) writes the new
nodes and backs the values up the paths, as mctx's ``backward`` does. Only the embeddings
and the model's outputs go through torch.

It is the tensor search, step for step (the same actions, ties to the lowest; the same calls
of the model on the same inputs; the same tree): every statistic is stored in the tree's
float type and computed one rounded operation at a time in the tensor search's order, in
that type (float32 arithmetic for a float32 tree, no fused multiply-adds). The one
operation that may round differently is the ``log`` of the PUCT exploration constant (torch's
vectorised ``log`` and the C library's can differ in the last bit), so two actions whose
scores differ by about one rounding could be ranked the other way
(tests/core/test_mcts_numba.py compares the two paths on random models).

Supported: the same rule at the root and below it, :func:`~tdrl.core.mcts.selection.
puct_selection` (optionally bound to ``pb_c_init`` / ``pb_c_base``) with the default
Q-transform (:func:`~tdrl.core.mcts.qtransforms.qtransform_by_parent_and_siblings`,
optionally with ``epsilon``) or :func:`~tdrl.core.mcts.qtransforms.qtransform_by_min_max`;
one or two players, any ``max_depth``, illegal actions; a float32 or float64 tree on the
CPU. :func:`~tdrl.core.mcts.search.search` takes this path with ``method="numba"`` or, when
numba is installed (``pip install 'tdrl-core[mcts]'``), under ``method="auto"``.
"""

from __future__ import annotations

from typing import NamedTuple

import numba
import numpy as np
import torch

from .fused import fused_rule, unwrap_partial
from .qtransforms import qtransform_by_min_max
from .selection import SelectionFn, puct_selection
from .model_io import EmbeddingStore, RecurrentFn, check_vector, leaf_logits
from .tree import UNVISITED, EdgeChannel, NodeChannel, RecurrentOutput, Tree

# The tree's channels as plain module constants (what a compiled function can read).
N_VISITS, N_VALUE_SUM, N_RAW_VALUE, N_VALUE = (NodeChannel.VISITS, NodeChannel.VALUE_SUM,
                                              NodeChannel.RAW_VALUE, NodeChannel.VALUE)
E_VISITS, E_VALUE_SUM, E_REWARD, E_DISCOUNT = (EdgeChannel.VISITS, EdgeChannel.VALUE_SUM,
                                               EdgeChannel.REWARD, EdgeChannel.DISCOUNT)
E_PRIOR_LOGIT, E_PRIOR_PROB, E_QVALUE = EdgeChannel.PRIOR_LOGIT, EdgeChannel.PRIOR_PROB, EdgeChannel.QVALUE

DTYPES = (torch.float32, torch.float64)
"""The tree float types this path handles."""

_PARENT_AND_SIBLINGS, _MIN_MAX = 0, 1  # Q-transform kinds
# Slots of the constants array (in the tree's float type, rounded as torch rounds a scalar).
_BASE_PLUS_ONE, _BASE, _INIT, _EPSILON, _MIN_VALUE, _RANGE, _ONE, _NEG_INF = range(8)


class NumbaRule(NamedTuple):
    """The PUCT rule as the compiled walk scores it.

    Attributes:
        kind: ``0`` parent-and-siblings min-max Q, ``1`` fixed-bounds min-max Q.
        constants: ``pb_c_base + 1``, ``pb_c_base``, ``pb_c_init``, ``epsilon``,
            ``min_value``, ``max_value - min_value`` (computed in Python floats, as torch
            receives it), ``1``, ``-inf``.
    """

    kind: int
    constants: tuple[float, ...]


def numba_rule(root_fn: SelectionFn, interior_fn: SelectionFn) -> NumbaRule | None:
    """The compiled form of the search's rules, or None if this backend cannot run them."""
    if root_fn is not interior_fn:
        return None
    fused = fused_rule(interior_fn)
    if fused is not None:
        base, init = fused.pb_c_base, fused.pb_c_init
        return NumbaRule(_PARENT_AND_SIBLINGS, (base + 1.0, base, init, fused.epsilon, 0.0, 1.0, 1.0, -np.inf))
    unwrapped = unwrap_partial(interior_fn)
    if unwrapped is None:
        return None
    fn, kwargs = unwrapped
    if fn is not puct_selection or set(kwargs) - {"pb_c_init", "pb_c_base", "qtransform"}:
        return None
    unwrapped = unwrap_partial(kwargs.get("qtransform"))
    if unwrapped is None or unwrapped[0] is not qtransform_by_min_max:
        return None
    bounds = unwrapped[1]
    if set(bounds) != {"min_value", "max_value"}:
        return None
    low, high = float(bounds["min_value"]), float(bounds["max_value"])
    if not high > low:
        raise ValueError(f"need max_value > min_value, got [{low}, {high}]")
    base, init = float(kwargs.get("pb_c_base", 19652.0)), float(kwargs.get("pb_c_init", 1.25))
    return NumbaRule(_MIN_MAX, (base + 1.0, base, init, 0.0, low, high - low, 1.0, -np.inf))


@numba.njit(cache=True, nogil=True)
def _best_action(node_data, edge_data, invalid, b, node, kind, c):
    """PUCT's choice at ``node`` of tree ``b``, in the operations of the torch scorers.

    ``c`` holds the constants in the tree's float type, so that every operation below stays
    in that type (a Python literal would promote float32 to float64, and a float64 score
    would rank sums that float32 rounds equal).
    """
    num_actions = edge_data.shape[2]
    visit = node_data[b, node, N_VISITS]
    value = node_data[b, node, N_VALUE]
    pb_c = np.log((visit + c[_BASE_PLUS_ONE]) / c[_BASE]) + c[_INIT]
    explore = np.sqrt(visit) * pb_c
    low, scale = value, c[_ONE]
    if kind == _PARENT_AND_SIBLINGS:
        high = value
        for a in range(num_actions):
            if edge_data[b, node, a, E_VISITS] > 0:
                q = edge_data[b, node, a, E_QVALUE]
                if q < low:
                    low = q
                if q > high:
                    high = q
        scale = high - low
        if scale < c[_EPSILON]:
            scale = c[_EPSILON]
    else:
        low, scale = c[_MIN_VALUE], c[_RANGE]
    best, best_score = 0, c[_NEG_INF]
    for a in range(num_actions):
        visits = edge_data[b, node, a, E_VISITS]
        score = explore * edge_data[b, node, a, E_PRIOR_PROB] / (visits + c[_ONE])
        if visits > 0:
            score = (edge_data[b, node, a, E_QVALUE] - low) / scale + score
        if invalid[b, node, a]:
            score = c[_NEG_INF]
        if a == 0 or score > best_score:
            best, best_score = a, score
    return best


@numba.njit(cache=True, nogil=True)
def _walk(node_data, edge_data, children, invalid, kind, c, max_depth, paths, depths, out):
    """Walk every tree from its root along PUCT's choices to its first unexpanded edge.

    Args:
        node_data, edge_data, children, invalid: the tree's arrays (``Tree`` fields).
        kind, c: the rule (:class:`NumbaRule`, ``c`` in the tree's float type).
        max_depth: largest number of edges a path takes.
        paths: ``[B, max_depth]`` int64, written: the nodes the paths leave, root first.
        depths: ``[B]`` int64, written: edges taken per tree.
        out: ``[3, B]`` int64, written: the flat parent ``b * N + node`` and the action of
            each tree's last edge, and its child (``UNVISITED`` if the tree grows).

    Returns:
        How many trees grow (their last edge is unexpanded).
    """
    num_trees, num_nodes = node_data.shape[0], node_data.shape[1]
    growing = 0
    for b in range(num_trees):
        node, depth = 0, 0
        while True:
            action = _best_action(node_data, edge_data, invalid, b, node, kind, c)
            paths[b, depth] = node
            depth += 1
            child = children[b, node, action]
            if child == UNVISITED or depth >= max_depth:
                break
            node = child
        depths[b] = depth
        out[0, b] = b * num_nodes + node
        out[1, b] = action
        out[2, b] = child
        if child == UNVISITED:
            growing += 1
    return growing


@numba.njit(cache=True, nogil=True)
def _expand_backup(
    node_data, edge_data, children, invalid, parents, action_from_parent,
    paths, depths, out, new_index, rewards, discounts, values, logits, probs, leaf_invalid,
    has_invalid, negate, c,
):  # fmt: skip
    """Write the new nodes (slot ``new_index``) of the growing trees; back all values up.

    Args:
        node_data ... action_from_parent: the tree's arrays, updated in place.
        paths, depths, out: what :func:`_walk` wrote.
        rewards, discounts, values: ``[B]`` the model's outputs (unused where a tree
            re-evaluates an existing node).
        logits, probs: ``[B, A]`` the new leaves' masked prior logits and probabilities.
        leaf_invalid: ``[B, A]`` their illegal actions (read if ``has_invalid``).
        negate: two players: store the discounts negated.
        c: the rule's constants (``c[_ONE]`` keeps the counts in the tree's float type).
    """
    num_trees, num_actions = node_data.shape[0], edge_data.shape[2]
    for b in range(num_trees):
        parent = out[0, b] - b * node_data.shape[1]
        action = out[1, b]
        node = out[2, b]
        if node == UNVISITED:  # the tree grows: write the new node
            node = new_index
            children[b, parent, action] = node
            edge_data[b, parent, action, E_REWARD] = rewards[b]
            edge_data[b, parent, action, E_DISCOUNT] = -discounts[b] if negate else discounts[b]
            parents[b, node] = parent
            action_from_parent[b, node] = action
            node_data[b, node, N_RAW_VALUE] = values[b]
            for a in range(num_actions):
                edge_data[b, node, a, E_PRIOR_LOGIT] = logits[b, a]
                edge_data[b, node, a, E_PRIOR_PROB] = probs[b, a]
                if has_invalid:
                    invalid[b, node, a] = leaf_invalid[b, a]
        # Back up, in the tensor search's order: the leaf, then each level upwards.
        value = node_data[b, node, N_RAW_VALUE]
        node_data[b, node, N_VISITS] += c[_ONE]
        node_data[b, node, N_VALUE_SUM] += value
        node_data[b, node, N_VALUE] = node_data[b, node, N_VALUE_SUM] / node_data[b, node, N_VISITS]
        for d in range(depths[b] - 1, -1, -1):
            up = paths[b, d]
            a = action_from_parent[b, node]
            edge = edge_data[b, up, a]
            reward, discount = edge[E_REWARD], edge[E_DISCOUNT]
            edge[E_VISITS] += c[_ONE]
            edge[E_VALUE_SUM] += value
            edge[E_QVALUE] = edge[E_VALUE_SUM] / edge[E_VISITS] * discount + reward
            value = discount * value + reward
            node_data[b, up, N_VISITS] += c[_ONE]
            node_data[b, up, N_VALUE_SUM] += value
            node_data[b, up, N_VALUE] = node_data[b, up, N_VALUE_SUM] / node_data[b, up, N_VISITS]
            node = up


def numba_search(
    tree: Tree,
    store: EmbeddingStore,
    recurrent_fn: RecurrentFn,
    rule: NumbaRule,
    num_simulations: int,
    max_depth: int,
    two_player: bool,
) -> None:
    """Fill ``tree`` (its root written by ``init_tree``) with ``num_simulations`` simulations.

    Args:
        tree: the initialised tree (``B`` trees on the CPU, float32 or float64).
        store: its embeddings store.
        recurrent_fn: the model, called on all ``B`` trees once per simulation in which any
            tree grows (as the tensor search does).
        rule: from :func:`numba_rule`.
        num_simulations, max_depth, two_player: as :func:`~tdrl.core.mcts.search.search`.
    """
    batch, num_nodes, num_actions = tree.batch_size, tree.num_nodes, tree.num_actions
    dtype = tree.node_data.dtype
    node_data, edge_data = tree.node_data.numpy(), tree.edge_data.numpy()
    children, invalid = tree.children_index.numpy(), tree.invalid_actions.numpy()
    parents, action_from_parent = tree.parents.numpy(), tree.action_from_parent.numpy()
    constants = np.array(rule.constants, dtype=node_data.dtype)
    # a path takes at most max_depth edges, and a tree of s nodes is at most s - 1 deep
    paths = np.zeros((batch, min(max_depth, num_simulations)), dtype=np.int64)
    depths = np.zeros(batch, dtype=np.int64)
    out_t = torch.zeros(3, batch, dtype=torch.int64)
    out = out_t.numpy()
    flat_parent, action = out_t[0], out_t[1]
    no_invalid = np.zeros((1, 1), dtype=np.bool_)
    no_vector = np.zeros(1, dtype=node_data.dtype)
    no_priors = np.zeros((1, 1), dtype=node_data.dtype)
    args = (node_data, edge_data, children, invalid)
    for sim in range(num_simulations):
        new_index = sim + 1
        growing = _walk(*args, rule.kind, constants, max_depth, paths, depths, out)
        rewards = discounts = values = no_vector
        logits = probs = no_priors
        leaf_invalid = no_invalid
        if growing:
            result = recurrent_fn(store.read(flat_parent), action.clone())
            if not isinstance(result, RecurrentOutput):
                result = RecurrentOutput(*result)
            rewards = check_vector(result.reward, batch, "reward", dtype).detach().numpy()
            discounts = check_vector(result.discount, batch, "discount", dtype).detach().numpy()
            values = check_vector(result.value, batch, "value", dtype).detach().numpy()
            logits_t, probs_t, invalid_t = leaf_logits(result, batch, num_actions, dtype)
            logits, probs = logits_t.detach().numpy(), probs_t.detach().numpy()
            if invalid_t is not None:
                leaf_invalid = invalid_t.numpy()
            if growing == batch:
                store.write_slot(new_index, result.next_embedding)
            else:
                keep = torch.from_numpy(np.flatnonzero(out[2] == UNVISITED))
                store.write(keep * num_nodes + new_index, result.next_embedding[keep])
        _expand_backup(
            *args, parents, action_from_parent, paths, depths, out, new_index, rewards, discounts,
            values, logits, probs, leaf_invalid, leaf_invalid is not no_invalid, two_player, constants,
        )  # fmt: skip
