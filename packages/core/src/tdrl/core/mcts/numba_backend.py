"""The search with its tree statistics walked and backed up by compiled (numba) calls.

The tensor search (:mod:`~tdrl.core.mcts.search`) spends a fixed cost per torch op, some
hundred small ops per simulation. Here the compiled code reads and writes the tree's tensors
in place (no copies) and a simulation is one model call and one compiled call, :func:`_step`:
it shifts the new leaves' prior logits, writes the new nodes (and, for a plain tensor
embedding, their embeddings), backs the values up the paths as mctx's ``backward`` does, then
walks all ``B`` trees down to their next leaves with the PUCT rule (:func:`_walk`) and gathers
the model's next inputs (:func:`_gather`) into tensors allocated once per search; the first
call fills the tree (allocated unfilled) and writes the roots. Outside the model only the
priors' softmax goes through torch (a compiled exp-and-sum differed from torch's vectorised
softmax in the last bit on 6-98% of random rows, float32 and float64, A = 2-16). The call
takes the tree's arrays and the model's outputs by address (checked contiguous CPU tensors
of the right dtype and shape, else converted first), since numba's dispatcher types
every array argument on every call, which at ``B = 1`` cost as much as the search itself.

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

import math
from typing import NamedTuple

import numba
import numpy as np
import torch
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .fused import fused_rule, puct_settings, unwrap_partial
from .qtransforms import qtransform_by_min_max
from .selection import SelectionFn
from .model_io import EmbeddingStore, RecurrentFn, check_vector, leaf_logits
from .tree import NO_PARENT, UNVISITED, EdgeChannel, NodeChannel, RecurrentOutput, RootOutput, Tree

# The tree's channels as plain module constants (what a compiled function can read).
N_VISITS, N_VALUE_SUM, N_RAW_VALUE, N_VALUE = (NodeChannel.VISITS, NodeChannel.VALUE_SUM,
                                              NodeChannel.RAW_VALUE, NodeChannel.VALUE)
E_VISITS, E_VALUE_SUM, E_REWARD, E_DISCOUNT = (EdgeChannel.VISITS, EdgeChannel.VALUE_SUM,
                                               EdgeChannel.REWARD, EdgeChannel.DISCOUNT)
E_PRIOR_LOGIT, E_PRIOR_PROB, E_QVALUE = EdgeChannel.PRIOR_LOGIT, EdgeChannel.PRIOR_PROB, EdgeChannel.QVALUE

DTYPES = (torch.float32, torch.float64)
"""The tree float types this path handles."""
_LOWEST = {dtype: torch.finfo(dtype).min for dtype in DTYPES}

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
    kwargs = puct_settings(interior_fn)
    if kwargs is None:
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


@numba.njit(cache=True, nogil=True)
def _gather(grid, out, inputs, actions):
    """Copy each tree's parent embedding ``grid[b, node]`` (``[B, N, F]``) into ``inputs``
    ``[B, F]`` and the actions ``out[1]`` into ``actions`` ``[B]`` (the model's inputs)."""
    num_nodes = grid.shape[1]
    for b in range(grid.shape[0]):
        node = out[0, b] - b * num_nodes
        for f in range(grid.shape[2]):
            inputs[b, f] = grid[b, node, f]
        actions[b] = out[1, b]


@numba.njit(cache=True, nogil=True)
def _shift_logits(raw, shifted, low):
    """``shifted = clamp(raw - max(raw), min=low)`` per row, as :func:`~tdrl.core.mcts.
    model_io.leaf_logits` computes it without illegal actions (one rounded subtraction)."""
    for b in range(raw.shape[0]):
        top = raw[b, 0]
        for a in range(1, raw.shape[1]):
            if raw[b, a] > top or raw[b, a] != raw[b, a]:  # a NaN wins, as torch's amax
                top = raw[b, a]
        for a in range(raw.shape[1]):
            x = raw[b, a] - top
            shifted[b, a] = low if x < low else x


# The per-simulation call takes the search's arrays by address: numba's dispatcher types every
# array argument on every call (~0.1-0.3 us each), an int64 costs a fraction of that. Every
# address is that of a contiguous CPU tensor or array of the dtype and shape the compiled code
# reads it as, checked in Python before its address is taken, and kept alive across the call.
# The int64 ``meta`` array holds the tree's addresses and sizes (slots below), then the walk's
# scratch: ``paths`` [B, D], ``depths`` [B], ``out`` [3, B]. The float array ``c`` holds the
# rule's constants, the low clamp of the logits (slot ``_LOW``), then a [B, A] scratch.
_M_NODE, _M_EDGE, _M_CHILDREN, _M_INVALID, _M_PARENTS, _M_FROM = range(6)
_M_BATCH, _M_NODES, _M_ACTIONS, _M_PATH, _M_MAX_DEPTH, _M_KIND, _M_NEGATE, _M_HEADER = range(6, 14)
_LOW = 8
_EXPAND, _SHIFT, _INVALID, _NEXT, _WALK, _ROOT = 1, 2, 4, 8, 16, 32  # flags of one call


@intrinsic
def _pointer(typingctx, address):
    """The int64 ``address`` as a ``void*`` (what ``numba.carray`` views)."""

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], cgutils.voidptr_t)

    return types.voidptr(types.int64), codegen


@numba.njit(cache=True, nogil=True)
def _step(
    meta, c, grid, flags, new_index, p_reward, p_discount, p_value, p_logits, p_probs, p_invalid,
    p_next, p_inputs, p_actions,
):  # fmt: skip
    """One simulation's end and the next one's start, in one call: (``_ROOT``, in the first
    call) fill the tree's arrays (zero statistics, no children or parents, all actions legal)
    and write the roots from their values ``p_value`` [B], raw prior logits ``p_logits`` and
    probabilities ``p_probs`` [B, A] as ``init_tree`` does (and, ``_NEXT``, their embeddings
    ``p_next`` [B, F] into every slot); (``_EXPAND``) shift the raw
    prior logits at ``p_logits`` (``_SHIFT``; else they are the masked logits), write the new
    nodes in slot ``new_index`` (with their illegal actions, ``_INVALID``, and their embeddings,
    ``_NEXT``), back up; then (``_WALK``) walk the trees down again and gather the model's next
    inputs into ``p_inputs`` [B, F] / ``p_actions`` [B]. Returns how many trees grow next."""
    batch, num_nodes, num_actions = meta[_M_BATCH], meta[_M_NODES], meta[_M_ACTIONS]
    depth, kind, dtype, features = meta[_M_PATH], meta[_M_KIND], c.dtype, grid.shape[2]
    node_data = numba.carray(_pointer(meta[_M_NODE]), (batch, num_nodes, 4), dtype)
    edge_data = numba.carray(_pointer(meta[_M_EDGE]), (batch, num_nodes, num_actions, 7), dtype)
    children = numba.carray(_pointer(meta[_M_CHILDREN]), (batch, num_nodes, num_actions), np.int64)
    invalid = numba.carray(_pointer(meta[_M_INVALID]), (batch, num_nodes, num_actions), np.bool_)
    head, paths_end = _M_HEADER, _M_HEADER + batch * depth
    paths = meta[head:paths_end].reshape(batch, depth)
    depths = meta[paths_end:paths_end + batch]
    out = meta[paths_end + batch:paths_end + 4 * batch].reshape(3, batch)
    if flags & _ROOT:  # init_tree(write_root=False) left every array unfilled
        node_data[:] = 0
        edge_data[:] = 0
        children[:] = UNVISITED
        invalid[:] = False
        numba.carray(_pointer(meta[_M_PARENTS]), (batch, num_nodes), np.int64)[:] = NO_PARENT
        numba.carray(_pointer(meta[_M_FROM]), (batch, num_nodes), np.int64)[:] = NO_PARENT
        values = numba.carray(_pointer(p_value), (batch,), dtype)
        probs = numba.carray(_pointer(p_probs), (batch, num_actions), dtype)
        shifted = c[_LOW + 1:_LOW + 1 + batch * num_actions].reshape(batch, num_actions)
        _shift_logits(numba.carray(_pointer(p_logits), (batch, num_actions), dtype), shifted, c[_LOW])
        for b in range(batch):
            node_data[b, 0, N_VISITS] = c[_ONE]
            node_data[b, 0, N_VALUE_SUM] = node_data[b, 0, N_RAW_VALUE] = node_data[b, 0, N_VALUE] = values[b]
            for a in range(num_actions):
                edge_data[b, 0, a, E_PRIOR_LOGIT] = shifted[b, a]
                edge_data[b, 0, a, E_PRIOR_PROB] = probs[b, a]
        if flags & _NEXT:  # the root embeddings at p_next, into every slot
            root_embedding = numba.carray(_pointer(p_next), (batch, features), grid.dtype)
            for b in range(batch):
                for n in range(num_nodes):
                    for f in range(features):
                        grid[b, n, f] = root_embedding[b, f]
    if flags & _EXPAND:
        parents = numba.carray(_pointer(meta[_M_PARENTS]), (batch, num_nodes), np.int64)
        action_from_parent = numba.carray(_pointer(meta[_M_FROM]), (batch, num_nodes), np.int64)
        rewards = numba.carray(_pointer(p_reward), (batch,), dtype)
        discounts = numba.carray(_pointer(p_discount), (batch,), dtype)
        values = numba.carray(_pointer(p_value), (batch,), dtype)
        probs = numba.carray(_pointer(p_probs), (batch, num_actions), dtype)
        logits = numba.carray(_pointer(p_logits), (batch, num_actions), dtype)
        has_invalid = flags & _INVALID != 0  # else the tree's invalid array stands in, unread
        leaf_invalid = numba.carray(_pointer(p_invalid if has_invalid else meta[_M_INVALID]),
                                    (batch, num_actions), np.bool_)  # fmt: skip
        tree_arrays = (node_data, edge_data, children, invalid, parents, action_from_parent)
        if flags & _SHIFT:
            shifted = c[_LOW + 1:_LOW + 1 + batch * num_actions].reshape(batch, num_actions)
            _shift_logits(logits, shifted, c[_LOW])
            _expand_backup(
                *tree_arrays, paths, depths, out, new_index, rewards, discounts, values, shifted,
                probs, leaf_invalid, has_invalid, meta[_M_NEGATE] != 0, c,
            )  # fmt: skip
        else:
            _expand_backup(
                *tree_arrays, paths, depths, out, new_index, rewards, discounts, values, logits,
                probs, leaf_invalid, has_invalid, meta[_M_NEGATE] != 0, c,
            )  # fmt: skip
        if flags & _NEXT:
            following = numba.carray(_pointer(p_next), (batch, features), grid.dtype)
            for b in range(batch):
                if out[2, b] == UNVISITED:
                    for f in range(features):
                        grid[b, new_index, f] = following[b, f]
    if not flags & _WALK:
        return 0
    growing = _walk(node_data, edge_data, children, invalid, kind, c, meta[_M_MAX_DEPTH], paths, depths, out)
    inputs = numba.carray(_pointer(p_inputs), (batch, features), grid.dtype)
    actions = numba.carray(_pointer(p_actions), (batch,), np.int64)
    _gather(grid, out, inputs, actions)
    return growing


def numba_search(
    tree: Tree,
    store: EmbeddingStore,
    recurrent_fn: RecurrentFn,
    rule: NumbaRule,
    num_simulations: int,
    max_depth: int,
    two_player: bool,
    root: RootOutput | None = None,
) -> None:
    """Fill ``tree`` with ``num_simulations`` simulations.

    A simulation is one model call and one compiled call (:func:`_step`: the last
    simulation's writes and backup, then the next walk and the gather of the model's inputs);
    outside the model only the prior softmax goes through torch. Model outputs that are
    contiguous CPU tensors of the tree's dtype and of the right shape are read in place;
    others are converted first (:func:`_vector_address`, :func:`_address`).

    Args:
        tree: the initialised tree (``B`` trees on the CPU, float32 or float64).
        store: its embeddings store.
        recurrent_fn: the model, called on all ``B`` trees once per simulation in which any
            tree grows (as the tensor search does).
        rule: from :func:`numba_rule`.
        num_simulations, max_depth, two_player: as :func:`~tdrl.core.mcts.search.search`.
        root: the roots to write (where :func:`writes_root`; ``init_tree(..., write_root=False)``
            left the tree unfilled: the first compiled call fills it), or None if
            ``init_tree`` filled the tree and wrote them.
    """
    batch, num_nodes, num_actions = tree.batch_size, tree.num_nodes, tree.num_actions
    dtype = tree.node_data.dtype
    np_dtype = np.float32 if dtype is torch.float32 else np.float64
    vector, matrix = (batch,), (batch, num_actions)
    # a path takes at most max_depth edges, and a tree of s nodes is at most s - 1 deep
    depth = min(max_depth, num_simulations)
    fields = (tree.node_data, tree.edge_data, tree.children_index, tree.invalid_actions,
              tree.parents, tree.action_from_parent)  # fmt: skip
    if not all(map(torch.Tensor.is_contiguous, fields)):
        raise ValueError("the numba search needs the contiguous tensors of init_tree")
    meta = np.zeros(_M_HEADER + batch * (depth + 4), dtype=np.int64)
    meta[:_M_HEADER] = (*map(torch.Tensor.data_ptr, fields), batch, num_nodes, num_actions,
                        depth, max_depth, rule.kind, two_player)  # fmt: skip
    out = meta[_M_HEADER + batch * (depth + 1):].reshape(3, batch)  # the walk's last edges
    c = np.empty(_LOW + 1 + batch * num_actions, dtype=np_dtype)
    c[:_LOW] = rule.constants
    c[_LOW] = _LOWEST[dtype]
    # The embeddings as [B, N, F] rows that the compiled calls read and write (a plain tensor
    # embedding; a TensorDict one is read and written by the store, in torch).
    grid_t = store.grids[0] if store.wrapped else None
    direct = grid_t is not None and grid_t.is_contiguous() and grid_t.is_cpu
    if direct:
        grid = grid_t.numpy().reshape(batch, num_nodes, -1)
        trailing, input_dtype = tuple(grid_t.shape[2:]), grid_t.dtype
    else:
        grid = np.zeros((batch, num_nodes, 1), dtype=np_dtype)
        trailing, input_dtype = (1,), dtype
    embedding_shape = (batch, *trailing)
    embeddings, actions = _model_inputs(num_simulations, embedding_shape, input_dtype)
    fresh = embeddings is None  # (large embeddings) allocated per simulation
    embedding_in = torch.empty(embedding_shape, dtype=input_dtype) if fresh else embeddings[0]
    action_in = actions[0]
    flags, p_value, p_logits, p_probs = _WALK, 0, 0, 0
    p_next = 0
    if root is not None:  # softmax(raw) is softmax(raw - max) bit for bit (see below)
        probs = torch.softmax(root.prior_logits, -1)
        flags, p_value, p_logits = _WALK | _ROOT, root.value.data_ptr(), root.prior_logits.data_ptr()
        p_probs = probs.data_ptr()
        # init_tree left a plain tensor embedding's slots for this call to write
        if direct and _plain(root.embedding, embedding_shape, input_dtype):
            p_next, flags = root.embedding.data_ptr(), flags | _NEXT
        elif store.wrapped:
            grid_t.copy_(root.embedding.unsqueeze(1))
    growing = _step(meta, c, grid, flags, 0, 0, 0, p_value, p_logits, p_probs, 0, p_next,
                    embedding_in.data_ptr(), action_in.data_ptr())  # fmt: skip
    for sim in range(num_simulations):
        new_index = sim + 1
        flags = _EXPAND
        p_reward = p_discount = p_value = p_logits = p_probs = p_invalid = p_next = 0
        if growing:
            if direct:
                result = recurrent_fn(embedding_in, action_in)
            else:
                result = recurrent_fn(store.read(torch.from_numpy(out[0].copy())), action_in)
            if type(result) is not RecurrentOutput:
                result = RecurrentOutput(*result)
            following, reward, discount, prior, value, leaf_invalid = result
            # the outputs read in place (kept referenced until the compiled call has read them)
            if not _plain(reward, vector, dtype):
                reward = _vector_address(reward, batch, "reward", dtype)
            if not _plain(discount, vector, dtype):
                discount = _vector_address(discount, batch, "discount", dtype)
            if not _plain(value, vector, dtype):
                value = _vector_address(value, batch, "value", dtype)
            p_reward, p_discount, p_value = reward.data_ptr(), discount.data_ptr(), value.data_ptr()
            if leaf_invalid is None and _plain(prior, matrix, dtype):
                # the shift is compiled; softmax(raw) is softmax(raw - max) bit for bit (torch
                # subtracts the same max; where it is not finite both are NaN)
                probs = torch.softmax(prior, -1)
                p_logits, p_probs, flags = prior.data_ptr(), probs.data_ptr(), flags | _SHIFT
            else:
                logits, probs, leaf_invalid = leaf_logits(result, batch, num_actions, dtype)
                logits, probs = _address(logits), _address(probs)
                p_logits, p_probs = logits.data_ptr(), probs.data_ptr()
                if leaf_invalid is not None:
                    leaf_invalid = _address(leaf_invalid)
                    p_invalid, flags = leaf_invalid.data_ptr(), flags | _INVALID
            if direct and _plain(following, embedding_shape, input_dtype):
                p_next, flags = following.data_ptr(), flags | _NEXT
            elif growing == batch:
                store.write_slot(new_index, following)
            else:
                keep = torch.from_numpy(np.flatnonzero(out[2] == UNVISITED))
                store.write(keep * num_nodes + new_index, following[keep])
        p_inputs = p_actions = 0
        if new_index < num_simulations:
            embedding_in = torch.empty(embedding_shape, dtype=input_dtype) if fresh else embeddings[new_index]
            action_in = actions[new_index]
            p_inputs, p_actions, flags = embedding_in.data_ptr(), action_in.data_ptr(), flags | _WALK
        growing = _step(
            meta, c, grid, flags, new_index, p_reward, p_discount, p_value, p_logits, p_probs,
            p_invalid, p_next, p_inputs, p_actions,
        )  # fmt: skip


def writes_root(root: RootOutput) -> bool:
    """Whether :func:`numba_search` writes these roots itself: all actions legal, and the
    logits ``[B, A]`` and values ``[B]`` contiguous CPU tensors of one float type."""
    value, logits = root.value, root.prior_logits
    return root.invalid_actions is None and type(value) is torch.Tensor and value.dim() == 1 \
        and type(logits) is torch.Tensor and logits.dim() == 2 \
        and _plain(logits, (value.shape[0], logits.shape[1]), value.dtype) \
        and _plain(value, value.shape, value.dtype)  # fmt: skip


def _plain(x, shape: tuple, dtype: torch.dtype) -> bool:
    """Whether ``x`` is a contiguous CPU tensor of ``dtype`` and ``shape`` (read in place)."""
    return type(x) is torch.Tensor and x.dtype is dtype and x.is_cpu and x.shape == shape and x.is_contiguous()


def _vector_address(x, batch: int, name: str, dtype: torch.dtype) -> torch.Tensor:
    """The model output ``name`` as a ``[batch]`` contiguous CPU tensor of ``dtype``."""
    return _address(check_vector(x, batch, name, dtype))


def _address(x: torch.Tensor) -> torch.Tensor:
    """``x`` as a contiguous CPU tensor (whose ``data_ptr`` the compiled call reads)."""
    if not x.is_cpu:
        raise ValueError(f"the numba search reads the model's outputs on the CPU, got a tensor on {x.device}")
    return x.contiguous()


_INPUT_BYTES = 1 << 24
"""Largest size of the model inputs preallocated for a whole search (else per simulation)."""


def _model_inputs(
    num_simulations: int, shape: tuple, dtype: torch.dtype
) -> tuple[tuple[torch.Tensor, ...] | None, tuple[torch.Tensor, ...]]:
    """Each simulation's model inputs, ``shape`` ``[B, *trailing]`` embeddings and ``[B]``
    actions: distinct tensors, so that none is overwritten while the model may still hold it;
    views of one buffer allocated once per search, except embeddings larger than
    ``_INPUT_BYTES`` in all (``None``: allocated per simulation)."""
    actions = torch.empty((num_simulations, shape[0]), dtype=torch.int64).unbind(0)
    if num_simulations * math.prod(shape) * dtype.itemsize > _INPUT_BYTES:
        return None, actions
    return torch.empty((num_simulations, *shape), dtype=dtype).unbind(0), actions
