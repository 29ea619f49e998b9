"""Batched tree search: simulate (select down the tree), expand (one model call), back up.

``B`` trees are searched at once; the only Python loops are over simulations and, inside a
simulation, over depth (all trees walk down in lockstep, a tree that has reached its leaf
idles until the deepest one arrives). Follows mctx's ``search`` (Danihelka et al., 2022).

Two ways down the trees:

* cached (interior rule marked :func:`~tdrl.core.mcts.tree.node_batched`: PUCT, UCB1,
  Gumbel's interior rule): every node's chosen edge is kept in a flat table and rescored
  after each simulation, in one call, only for the nodes whose statistics changed (the
  path and the new leaf); walking down is then two gathers of ``[B]`` indices per level.
* level by level (any other rule): the rule scores the current node of every tree at each
  level.

Both build the same tree. The default PUCT rule is rescored by a fused, bit-identical
scorer (:mod:`~tdrl.core.mcts.fused`). Paths are level-major ``[D, B]`` with a sink entry
past each tree's end; the new nodes of a simulation all sit in the same slot, so they are
written with plain strided copies. The backup computes the path values level by level (two
ops per level, into one preallocated buffer) and updates the distinct node and edge rows of
all paths with one gather and one write each; the rescoring reuses the node rows it wrote.
"""

from __future__ import annotations

import functools
import importlib.util
from typing import NamedTuple

import torch
from tensordict import TensorDict, TensorDictBase
from torch import Tensor

from .fused import fused_rule
from .model_io import EmbeddingStore, RecurrentFn, check_vector, leaf_priors
from .selection import SelectionFn
from .tree import EdgeChannel as _E  # noqa: N814 - channel names read as _E.REWARD
from .tree import NodeChannel as _N  # noqa: N814
from .tree import (
    supports_node_batches,
    ROOT_INDEX,
    UNVISITED,
    RecurrentOutput,
    RootOutput,
    Tree,
    init_tree,
)


def search(
    root: RootOutput,
    recurrent_fn: RecurrentFn,
    root_action_selection_fn: SelectionFn,
    interior_action_selection_fn: SelectionFn,
    num_simulations: int,
    *,
    max_depth: int | None = None,
    two_player: bool = False,
    extra: TensorDictBase | None = None,
    method: str = "auto",
) -> Tree:
    """Run ``num_simulations`` simulations in each of ``B`` trees.

    Args:
        root: :class:`RootOutput` with ``prior_logits`` ``[B, A]``, ``value`` ``[B]``, the root
            ``embedding`` (TensorDict ``[B]`` or tensor ``[B, ...]``) and optional
            ``invalid_actions`` ``[B, A]``.
        recurrent_fn: model ``(embedding [B], action [B]) -> RecurrentOutput`` (or the same
            5- or 6-tuple). AlphaZero: a simulator stepping cloned states + a prior/value
            net; MuZero: the learned dynamics + prediction nets.
        root_action_selection_fn: ``(tree, node_index [B], depth) -> action [B]`` at depth 0.
        interior_action_selection_fn: the same, below the root.
        num_simulations: simulations per tree (the tree has ``num_simulations + 1`` nodes).
        max_depth: largest depth of a selected action; a simulation that reaches it
            re-evaluates the existing child instead of growing the tree. Default: unbounded.
        two_player: zero-sum alternating game: each node's value is seen by the player to
            act there and rewards by the player who acted; the search negates discounts so
            that a child's value counts against its parent.
        extra: per-tree extras ``[B]`` stored in ``tree.extra`` (e.g. the root Gumbel).
        method: the engine: ``"tensor"`` (statistics in the tree's tensors, any rule, any
            device), ``"numba"`` (walked and backed up by compiled calls on numpy views of the
            same tensors, :mod:`~tdrl.core.mcts.numba_backend`: the same PUCT rule at the root
            and below it with the default or the fixed-bounds min-max Q-transform, on the CPU;
            needs numba) or ``"auto"``: ``"numba"`` where it applies and numba is installed,
            else ``"tensor"``. Both build the same tree.

    Returns:
        The filled :class:`Tree`.
    """
    if num_simulations < 1:
        raise ValueError(f"num_simulations must be >= 1, got {num_simulations}")
    max_depth = num_simulations if max_depth is None else max_depth
    if max_depth < 1:
        raise ValueError(f"max_depth must be >= 1, got {max_depth}")
    if method == "python":
        raise ValueError("method='python' (the Python-floats engine) was removed: the numba engine builds the "
                         "same tree and was as fast at B=1 and 2-5x faster at B=4-16; use method='numba' "
                         "(pip install 'tdrl-core[mcts]') or 'auto'")
    if method not in _METHODS:
        raise ValueError(f"method must be one of {', '.join(map(repr, _METHODS))}, got {method!r}")
    rule = None
    if method in ("auto", "numba"):
        rule = _numba_rule(root, root_action_selection_fn, interior_action_selection_fn, method)
    if rule is not None:
        backend = _numba_backend()
        compiled_root = backend.writes_root(root)  # else init_tree writes it, in torch
        tree, wrapped = init_tree(root, num_simulations + 1, extra, write_root=not compiled_root)
        backend.numba_search(
            tree, EmbeddingStore(tree.embeddings, wrapped), recurrent_fn, rule, num_simulations,
            max_depth, two_player, root if compiled_root else None,
        )  # fmt: skip
        return tree
    tree, wrapped = init_tree(root, num_simulations + 1, extra)
    store = EmbeddingStore(tree.embeddings, wrapped)
    device = tree.node_data.device
    offsets = tree.flat_index(torch.zeros(tree.batch_size, dtype=torch.int64, device=device))
    # A tree of s simulations is at most s deep, so below this every path ends unexpanded.
    may_revisit = max_depth < num_simulations
    if not supports_node_batches(interior_action_selection_fn):
        for sim in range(num_simulations):
            path = _simulate(
                tree, offsets, root_action_selection_fn, interior_action_selection_fn, max_depth
            )
            leaf = _expand(
                tree, store, offsets, recurrent_fn, path, sim + 1, two_player, None, may_revisit
            )
            _backward(tree, path, *leaf)
        return tree
    # Cached selection: the interior rule's choice at every node is kept as a flat edge index
    # and rescored after each simulation only for the nodes whose statistics it changed.
    cache = _SelectionCache(tree, interior_action_selection_fn)
    root_index = torch.full_like(offsets, ROOT_INDEX)
    # The same rule at the root (PUCT, UCB1): its choice there is cached like any other node's.
    cache_root = root_action_selection_fn is interior_action_selection_fn
    if cache_root:
        cache.rescore(interior_action_selection_fn, offsets)
    for sim in range(num_simulations):
        if cache_root:
            root_edge = cache.best_edge.index_select(0, offsets)
        else:
            root_edge = offsets * tree.num_actions + root_action_selection_fn(tree, root_index, 0)
        path = _simulate_cached(tree, offsets, root_edge, cache, max_depth)
        leaf = _expand(
            tree, store, offsets, recurrent_fn, path, sim + 1, two_player, cache, may_revisit
        )
        changed, changed_stats = _backward(tree, path, *leaf)
        if sim + 1 < num_simulations:
            cache.rescore(interior_action_selection_fn, changed, changed_stats)
    return tree


_METHODS = ("auto", "tensor", "numba")
_NUMBA_MISSING = (
    "method='numba' needs numba, which is not installed: pip install 'tdrl-core[mcts]' "
    "(or numba>=0.60), or use method='auto' / 'tensor'"
)


@functools.cache
def _numba_installed() -> bool:
    return importlib.util.find_spec("numba") is not None


@functools.cache
def _numba_backend():
    """The numba engine's module, imported on first use (it loads or compiles numba code)."""
    from . import numba_backend

    return numba_backend


def _numba_rule(root: RootOutput, root_fn: SelectionFn, interior_fn: SelectionFn, method: str):
    """The numba backend's form of the rules, or None where ``"auto"`` passes it by (the tree
    takes the root value's dtype and the root logits' device).

    Under ``method="numba"`` a missing numba or an unsupported configuration is an error.
    """
    if not _numba_installed():
        if method == "numba":
            raise ImportError(_NUMBA_MISSING)
        return None
    backend = _numba_backend()
    rule = backend.numba_rule(root_fn, interior_fn)
    dtype, device = root.value.dtype, root.prior_logits.device
    usable = device.type == "cpu" and dtype in backend.DTYPES
    if method == "numba" and (rule is None or not usable):
        raise ValueError(
            "method='numba' supports the same rule at the root and below it, puct_selection "
            "(optionally bound to pb_c_init / pb_c_base) with qtransform_by_parent_and_siblings "
            "(optionally its epsilon) or qtransform_by_min_max (min_value, max_value), on the "
            f"CPU, in float32 or float64; got root rule {root_fn!r}, interior rule "
            f"{interior_fn!r}, a {dtype} tree on {device}; "
            "use method='auto' or 'tensor' otherwise"
        )
    return rule if usable else None


class _Path(NamedTuple):
    """The edges one simulation walked down, level by level (``D`` levels), level-major.

    Attributes:
        edges: ``[D, B]`` flat index ``(b * N + node) * A + action`` of each edge taken; the
            levels a tree did not take (after its expanded edge) hold ``B * N * A``.
        active: ``[D, B]`` bool, the tree really took that edge (a prefix of the levels).
        flat_edge: ``[B]`` flat index of the edge to expand (each tree's last edge taken).
        flat_parent: ``[B]`` flat node ``b * N + node`` whose child gets expanded.
        action: ``[B]`` action to expand.
    """

    edges: Tensor
    active: Tensor
    flat_edge: Tensor
    flat_parent: Tensor
    action: Tensor


def _path(edges: list[Tensor], num_actions: int, sink_edge: int) -> _Path:
    """Pack the per-level ``[B]`` edges (``sink_edge`` past each tree's end) into a path."""
    edges = torch.stack(edges)  # [D, B]
    active = edges != sink_edge
    last = edges.gather(0, active.sum(0, keepdim=True).sub_(1)).squeeze(0)  # expanded edge
    flat_parent = torch.div(last, num_actions, rounding_mode="floor")
    return _Path(edges, active, last, flat_parent, last - flat_parent * num_actions)


def _simulate(
    tree: Tree, offsets: Tensor, root_fn: SelectionFn, interior_fn: SelectionFn, max_depth: int
) -> _Path:
    """Walk down every tree, in lockstep, until each one reaches an unexpanded edge."""
    num_actions = tree.num_actions
    sink_edge = tree.children_index.numel()
    children = tree.children_index.view(-1)
    node = torch.full_like(offsets, ROOT_INDEX)
    active = torch.ones_like(offsets, dtype=torch.bool)
    edges = []
    depth = 0
    while True:
        action = (root_fn if depth == 0 else interior_fn)(tree, node, depth)
        flat_edge = (offsets + node) * num_actions + action
        edges.append(torch.where(active, flat_edge, sink_edge))
        child = children.index_select(0, flat_edge)
        depth += 1
        active = active & (child != UNVISITED)
        if depth >= max_depth or not bool(active.any()):
            break
        node = torch.where(active, child, node)
    return _path(edges, num_actions, sink_edge)


class _SelectionCache:
    """Flat lookup tables that turn walking down the trees into two gathers per level.

    ``child[e]`` is the flat node ``b * N + n`` at the end of the flat edge ``e`` (or the
    sink node ``B * N`` if unexpanded) and ``best_edge[n]`` the flat edge that the interior
    rule picks at flat node ``n``; the sink node's best edge is the sink edge ``B * N * A``,
    which leads back to the sink, so a tree that left the expanded part stays there.
    """

    def __init__(self, tree: Tree, interior_fn: SelectionFn) -> None:
        batch, num_nodes, num_actions = tree.batch_size, tree.num_nodes, tree.num_actions
        device = tree.node_data.device
        self.num_actions = num_actions
        self.sink_node = batch * num_nodes
        self.sink_edge = batch * num_nodes * num_actions
        self.child = torch.full((self.sink_edge + 1,), self.sink_node, device=device)
        self.best_edge = torch.full((self.sink_node + 1,), self.sink_edge, device=device)
        # The rules see all nodes as one tree (they read only node_stats), so that any set of
        # nodes can be rescored in one call.
        self.flat_tree = Tree(
            node_data=tree.node_data.view(1, self.sink_node, -1),
            edge_data=tree.edge_data.view(1, self.sink_node, num_actions, -1),
            parents=tree.parents.view(1, -1),
            action_from_parent=tree.action_from_parent.view(1, -1),
            children_index=tree.children_index.view(1, self.sink_node, num_actions),
            invalid_actions=tree.invalid_actions.view(1, self.sink_node, num_actions),
            embeddings=TensorDict({}, batch_size=[1], device=device),
            extra=TensorDict({}, batch_size=[1], device=device),
        )

        # The default PUCT rule has a fused, bit-identical scorer; it skips the illegal-action
        # mask while no node has an illegal action (``any_invalid``, kept by the expansion).
        self.fused = fused_rule(interior_fn)
        self.any_invalid = bool(tree.invalid_actions[:, ROOT_INDEX].any())
        self.node_rows = tree.node_data.view(self.sink_node, -1)
        self.edge_rows = tree.edge_data.view(self.sink_node, num_actions, -1)
        self.invalid_rows = tree.invalid_actions.view(self.sink_node, num_actions)

    def rescore(
        self, interior_fn: SelectionFn, nodes: Tensor, node_stats: Tensor | None = None
    ) -> None:
        """Rescore the distinct flat nodes ``nodes`` ``[M]`` with the interior rule.

        ``node_stats`` (``[M, 4]``, optional) are their packed node rows, if already read.
        """
        if self.fused is not None:
            invalid = self.invalid_rows if self.any_invalid else None
            action = self.fused(self.node_rows, self.edge_rows, invalid, nodes, node_stats)
        else:
            action = interior_fn(self.flat_tree, nodes[None], 1)[0]
        edge = nodes * self.num_actions
        self.best_edge.scatter_(0, nodes, edge.add_(action))


def _simulate_cached(
    tree: Tree, offsets: Tensor, root_edge: Tensor, cache: _SelectionCache, max_depth: int
) -> _Path:
    """Walk down every tree along the cached choices (lockstep, two gathers per level).

    The same walk as :func:`_simulate` for a node-batched interior rule, from the flat root
    edges ``root_edge`` ``[B]``.
    """
    edge = root_edge
    edges = [edge]
    node = cache.child.index_select(0, edge)
    for _ in range(1, max_depth):
        if int(node.min()) == cache.sink_node:  # every tree reached an unexpanded edge
            break
        edge = cache.best_edge.index_select(0, node)
        edges.append(edge)
        node = cache.child.index_select(0, edge)
    return _path(edges, tree.num_actions, cache.sink_edge)


def _expand(
    tree: Tree,
    store: EmbeddingStore,
    offsets: Tensor,
    recurrent_fn: RecurrentFn,
    path: _Path,
    new_index: int,
    two_player: bool,
    cache: _SelectionCache | None = None,
    may_revisit: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """Call the model on the selected edges and write the new nodes.

    Args:
        new_index: the node slot that the growing trees fill (``simulation + 1``).
        may_revisit: whether a path can end on an expanded edge (at ``max_depth``); if not,
            every tree grows and the check is skipped.

    Returns:
        ``(flat_leaf, leaf_value)``: ``[B]`` flat index of each tree's leaf, and ``[B]`` the
        leaves' raw values when every tree grew (None otherwise: read them from the tree).
    """
    num_actions, batch = tree.num_actions, tree.batch_size
    flat_edge, flat_parent, action = path.flat_edge, path.flat_parent, path.action
    all_new = True
    if may_revisit:
        existing = tree.children_index.view(-1).index_select(0, flat_edge)
        is_new = existing == UNVISITED
        if not bool(is_new.any()):  # every tree re-evaluates a node at max_depth
            return offsets + existing, None
        all_new = bool(is_new.all())
    out = RecurrentOutput(*recurrent_fn(store.read(flat_parent), action))
    dtype = tree.node_data.dtype
    reward = check_vector(out.reward, batch, "reward", dtype)
    discount = check_vector(out.discount, batch, "discount", dtype)
    value = check_vector(out.value, batch, "value", dtype)
    priors, invalid = leaf_priors(out, batch, num_actions, dtype)  # PRIOR_LOGIT, PRIOR_PROB
    if invalid is not None and cache is not None:
        cache.any_invalid = True
    next_embedding = out.next_embedding
    if two_player:
        discount = -discount
    edge_rows = tree.edge_data.view(-1, tree.edge_data.shape[-1])
    if all_new:  # the new nodes are slot new_index of every tree: plain strided writes
        flat_leaf = offsets + new_index
        tree.children_index.view(-1).index_fill_(0, flat_edge, new_index)
        if cache is not None:
            cache.child.index_copy_(0, flat_edge, flat_leaf)
        edge_rows[:, _E.REWARD:_E.DISCOUNT + 1].index_copy_(0, flat_edge, torch.stack([reward, discount], -1))
        tree.parents[:, new_index] = flat_parent - offsets
        tree.action_from_parent[:, new_index] = action
        tree.node_data[:, new_index, _N.RAW_VALUE] = value
        tree.edge_data[:, new_index, :, _E.PRIOR_LOGIT:_E.PRIOR_PROB + 1] = priors
        if invalid is not None:
            tree.invalid_actions[:, new_index] = invalid
        store.write_slot(new_index, next_embedding)
        return flat_leaf, value
    # Only the trees that grow get written (the others re-evaluate a node at max_depth).
    leaf = torch.where(is_new, new_index, existing)
    flat_leaf = offsets + leaf
    keep = is_new.nonzero().squeeze(-1)
    flat_edge, written_leaf, written = flat_edge[keep], flat_leaf[keep], leaf[keep]
    parent, action = flat_parent[keep] - offsets[keep], action[keep]
    tree.children_index.view(-1).index_copy_(0, flat_edge, written)
    if cache is not None:
        cache.child.index_copy_(0, flat_edge, written_leaf)
    edge_rows[:, _E.REWARD:_E.DISCOUNT + 1].index_copy_(0, flat_edge, torch.stack([reward, discount], -1)[keep])
    tree.parents.view(-1).index_copy_(0, written_leaf, parent)
    tree.action_from_parent.view(-1).index_copy_(0, written_leaf, action)
    node_rows = tree.node_data.view(-1, tree.node_data.shape[-1])
    node_rows[:, _N.RAW_VALUE].index_copy_(0, written_leaf, value[keep])
    edge_rows.view(-1, num_actions, edge_rows.shape[-1])[:, :, _E.PRIOR_LOGIT:_E.PRIOR_PROB + 1].index_copy_(
        0, written_leaf, priors[keep]
    )
    if invalid is not None:
        tree.invalid_actions.view(-1, num_actions).index_copy_(0, written_leaf, invalid[keep])
    store.write(written_leaf, next_embedding[keep])
    return flat_leaf, None


def _backward(tree: Tree, path: _Path, flat_leaf: Tensor, leaf_value: Tensor | None) -> Tensor:
    """Back the leaves' raw values up their paths, updating visits, sums and derived means.

    The values are computed level by level (``v_parent = r + discount * v_child``; levels a
    tree did not take pass the value through unchanged). The levels taken are then gathered
    into one list of distinct node and edge rows per tree, updated and written back at once.

    Args:
        path: the simulation's path (level-major).
        flat_leaf: ``[B]`` flat index of each tree's leaf.
        leaf_value: ``[B]`` raw values of the leaves, or None to read them from the tree.

    Returns:
        ``(nodes, rows)``: ``[M]`` the distinct flat nodes whose statistics changed (paths
        and leaves) and ``[M, 4]`` their new packed rows.
    """
    depth, batch = path.edges.shape
    num_actions = tree.num_actions
    node_rows = tree.node_data.view(-1, tree.node_data.shape[-1])
    edge_rows = tree.edge_data.view(-1, tree.edge_data.shape[-1])
    if leaf_value is None:
        leaf_value = node_rows[:, _N.RAW_VALUE].index_select(0, flat_leaf)
    taken = path.active.view(-1).nonzero().squeeze(-1)  # level-major: d * B + b
    taken_edges = path.edges.view(-1).index_select(0, taken)
    edges = edge_rows.index_select(0, taken_edges)  # [M, 7]
    # Levels not taken pass the value through: reward 0, discount 1.
    rewards = leaf_value.new_zeros(depth, batch)
    rewards.view(-1).scatter_(0, taken, edges[:, _E.REWARD])
    discounts = leaf_value.new_ones(depth, batch)
    discounts.view(-1).scatter_(0, taken, edges[:, _E.DISCOUNT])
    values = leaf_value.new_empty(depth + 1, batch)  # row d: the value backed into level d
    rows = values.unbind(0)
    rows[depth].copy_(leaf_value)
    for d, reward, discount in zip(range(depth - 1, -1, -1), rewards.unbind(0)[::-1],
                                   discounts.unbind(0)[::-1]):  # fmt: skip
        torch.add(reward, torch.mul(discount, rows[d + 1]), out=rows[d])
    values = values.view(-1)
    # Distinct rows: the nodes and edges of the levels taken, and the leaves.
    node_index = torch.cat([torch.div(taken_edges, num_actions, rounding_mode="floor"), flat_leaf])
    nodes = node_rows.index_select(0, node_index)
    nodes[:, _N.VISITS] += 1  # now >= 1
    nodes[:, _N.VALUE_SUM] += torch.cat([values.index_select(0, taken), leaf_value])
    torch.div(nodes[:, _N.VALUE_SUM], nodes[:, _N.VISITS], out=nodes[:, _N.VALUE])
    node_rows.index_copy_(0, node_index, nodes)
    edges[:, _E.VISITS] += 1
    edges[:, _E.VALUE_SUM] += values.index_select(0, taken + batch)  # the child's value: one level down
    # Q = r + discount * (sums / visits)
    torch.div(edges[:, _E.VALUE_SUM], edges[:, _E.VISITS], out=edges[:, _E.QVALUE]).mul_(
        edges[:, _E.DISCOUNT]).add_(edges[:, _E.REWARD])
    edge_rows.index_copy_(0, taken_edges, edges)
    return node_index, nodes
