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

Both build the same tree. The backup computes the path values level by level (two ops per
level) and updates the distinct node and edge rows of all paths with one gather and one
write each.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import torch
from tensordict import TensorDict, TensorDictBase
from torch import Tensor

from .fused import fused_rule
from .selection import SelectionFn
from .tree import (
    supports_node_batches,
    ROOT_INDEX,
    UNVISITED,
    RecurrentOutput,
    RootOutput,
    Tree,
    init_tree,
    mask_invalid_logits,
)

RecurrentFn = Callable[[TensorDictBase | Tensor, Tensor], RecurrentOutput | tuple]


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

    Returns:
        The filled :class:`Tree`.
    """
    if num_simulations < 1:
        raise ValueError(f"num_simulations must be >= 1, got {num_simulations}")
    max_depth = num_simulations if max_depth is None else max_depth
    if max_depth < 1:
        raise ValueError(f"max_depth must be >= 1, got {max_depth}")
    tree, wrapped = init_tree(root, num_simulations + 1, extra)
    store = _EmbeddingStore(tree.embeddings, wrapped)
    device = tree.node_data.device
    offsets = tree.flat_index(torch.zeros(tree.batch_size, dtype=torch.int64, device=device))
    if not supports_node_batches(interior_action_selection_fn):
        for sim in range(num_simulations):
            path = _simulate(
                tree, offsets, root_action_selection_fn, interior_action_selection_fn, max_depth
            )
            leaf = _expand(tree, store, offsets, recurrent_fn, path, sim + 1, two_player)
            _backward(tree, offsets, path, leaf)
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
        leaf = _expand(tree, store, offsets, recurrent_fn, path, sim + 1, two_player, cache)
        changed = _backward(tree, offsets, path, leaf)
        if sim + 1 < num_simulations:
            cache.rescore(interior_action_selection_fn, changed)
    return tree


class _Path(NamedTuple):
    """The edges one simulation walked down, level by level (``D`` levels).

    Attributes:
        edges: ``[B, D]`` flat index ``(b * N + node) * A + action`` of each edge taken.
        nodes: ``[B, D]`` flat index ``b * N + node`` of each edge's parent.
        active: ``[B, D]`` bool, the tree really took that edge (a prefix of the levels).
        parent: ``[B]`` node index whose child gets expanded.
        action: ``[B]`` action to expand.
    """

    edges: Tensor
    nodes: Tensor
    active: Tensor
    parent: Tensor
    action: Tensor


def _simulate(
    tree: Tree, offsets: Tensor, root_fn: SelectionFn, interior_fn: SelectionFn, max_depth: int
) -> _Path:
    """Walk down every tree, in lockstep, until each one reaches an unexpanded edge."""
    num_actions = tree.num_actions
    children = tree.children_index.view(-1)
    node = torch.full_like(offsets, ROOT_INDEX)
    active = torch.ones_like(offsets, dtype=torch.bool)
    edges, nodes, actions, actives = [], [], [], []
    depth = 0
    while True:
        action = (root_fn if depth == 0 else interior_fn)(tree, node, depth)
        flat_node = offsets + node
        flat_edge = flat_node * num_actions + action
        edges.append(flat_edge)
        nodes.append(flat_node)
        actions.append(action)
        actives.append(active)
        child = children.index_select(0, flat_edge)
        depth += 1
        active = active & (child != UNVISITED)
        if depth >= max_depth or not bool(active.any()):
            break
        node = torch.where(active, child, node)
    stack = partial(torch.stack, dim=1)
    edges, nodes, actions, actives = stack(edges), stack(nodes), stack(actions), stack(actives)
    last = actives.sum(1, keepdim=True) - 1  # the deepest level each tree took
    parent = nodes.gather(1, last).squeeze(1) - offsets
    return _Path(edges, nodes, actives, parent, actions.gather(1, last).squeeze(1))


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

    def rescore(self, interior_fn: SelectionFn, nodes: Tensor) -> None:
        """Rescore the distinct flat nodes ``nodes`` ``[M]`` with the interior rule."""
        if self.fused is not None:
            invalid = self.invalid_rows if self.any_invalid else None
            action = self.fused(self.node_rows, self.edge_rows, invalid, nodes)
        else:
            action = interior_fn(self.flat_tree, nodes[None], 1)[0]
        self.best_edge.index_copy_(0, nodes, nodes * self.num_actions + action)


def _simulate_cached(
    tree: Tree, offsets: Tensor, root_edge: Tensor, cache: _SelectionCache, max_depth: int
) -> _Path:
    """Walk down every tree along the cached choices (lockstep, two gathers per level).

    The same walk as :func:`_simulate` for a node-batched interior rule, from the flat root
    edges ``root_edge`` ``[B]``.
    """
    num_actions = tree.num_actions
    edge = root_edge
    edges = [edge]
    node = cache.child.index_select(0, edge)
    for _ in range(1, max_depth):
        if int(node.min()) == cache.sink_node:  # every tree reached an unexpanded edge
            break
        edge = cache.best_edge.index_select(0, node)
        edges.append(edge)
        node = cache.child.index_select(0, edge)
    edges = torch.stack(edges, 1)
    active = edges != cache.sink_edge  # a prefix of the levels
    last = edges.gather(1, active.sum(1, keepdim=True) - 1).squeeze(1)  # expanded edge
    edges = torch.where(active, edges, last[:, None])  # untaken levels: a harmless real edge
    nodes = torch.div(edges, num_actions, rounding_mode="floor")
    parent = nodes[:, -1] - offsets
    return _Path(edges, nodes, active, parent, last - nodes[:, -1] * num_actions)


class _EmbeddingStore:
    """Fast row reads and writes of the ``[B, N]`` embeddings TensorDict (flat indices)."""

    def __init__(self, embeddings: TensorDictBase, wrapped: bool) -> None:
        self.wrapped = wrapped
        self.keys = list(embeddings.keys(include_nested=True, leaves_only=True))
        self.leaves = [embeddings.get(key).flatten(0, 1) for key in self.keys]
        self.batch = embeddings.batch_size[:1]

    def read(self, flat: Tensor) -> TensorDictBase | Tensor:
        rows = [leaf.index_select(0, flat) for leaf in self.leaves]
        if self.wrapped:
            return rows[0]
        return TensorDict(dict(zip(self.keys, rows, strict=True)), batch_size=self.batch)

    def write(self, flat: Tensor, values: TensorDictBase | Tensor) -> None:
        if self.wrapped:
            self.leaves[0].index_copy_(0, flat, values.to(self.leaves[0].dtype))
            return
        for key, leaf in zip(self.keys, self.leaves, strict=True):
            value = values.get(key, None)
            if value is None:
                raise KeyError(
                    f"recurrent_fn next_embedding lacks the key {key!r} of the root embedding"
                )
            leaf.index_copy_(0, flat, value.to(leaf.dtype))


def _vector(x: Tensor, batch: int, name: str, dtype: torch.dtype) -> Tensor:
    if not isinstance(x, Tensor):
        x = torch.as_tensor(x)
    if x.shape == (batch, 1):
        x = x.squeeze(-1)
    if x.shape != (batch,):
        raise ValueError(f"recurrent_fn {name} must be [B]={batch}, got {tuple(x.shape)}")
    return x.to(dtype)


def _expand(
    tree: Tree,
    store: _EmbeddingStore,
    offsets: Tensor,
    recurrent_fn: RecurrentFn,
    path: _Path,
    new_index: int,
    two_player: bool,
    cache: _SelectionCache | None = None,
) -> Tensor:
    """Call the model on the selected edges and write the new nodes. Returns leaves ``[B]``."""
    num_actions, batch = tree.num_actions, tree.batch_size
    parent, action = path.parent, path.action
    flat_parent = offsets + parent
    flat_edge = flat_parent * num_actions + action
    existing = tree.children_index.view(-1).index_select(0, flat_edge)
    is_new = existing == UNVISITED
    leaf = torch.where(is_new, new_index, existing)
    if not bool(is_new.any()):  # every tree re-evaluates a node at max_depth
        return leaf
    out = RecurrentOutput(*recurrent_fn(store.read(flat_parent), action))
    dtype = tree.value_sums.dtype
    reward = _vector(out.reward, batch, "reward", dtype)
    discount = _vector(out.discount, batch, "discount", dtype)
    value = _vector(out.value, batch, "value", dtype)
    if out.prior_logits.shape != (batch, num_actions):
        raise ValueError(
            f"recurrent_fn prior_logits must be [B, A]={batch, num_actions}, "
            f"got {tuple(out.prior_logits.shape)}"
        )
    logits = out.prior_logits.to(dtype)
    if out.invalid_actions is None:  # all legal: the rows of fresh nodes already say so
        invalid = None
        logits = (logits - logits.amax(-1, keepdim=True)).clamp(min=torch.finfo(dtype).min)
    else:
        invalid = _normalize_invalid(out.invalid_actions, batch, num_actions, offsets.device)
        logits = mask_invalid_logits(logits, invalid)
    next_embedding = out.next_embedding
    if two_player:
        discount = -discount
    flat_leaf = offsets + leaf
    written = leaf
    if not bool(is_new.all()):  # only the trees that grow get written (others hit max_depth)
        keep = is_new.nonzero().squeeze(-1)
        flat_edge, flat_leaf, written = flat_edge[keep], flat_leaf[keep], leaf[keep]
        parent, action = parent[keep], action[keep]
        reward, discount, value = reward[keep], discount[keep], value[keep]
        logits, next_embedding = logits[keep], next_embedding[keep]
        invalid = None if invalid is None else invalid[keep]
    num_fields = tree.edge_data.shape[-1]
    tree.children_index.view(-1).index_copy_(0, flat_edge, written)
    if cache is not None:
        cache.child.index_copy_(0, flat_edge, flat_leaf)
    edge_rows = tree.edge_data.view(-1, num_fields)  # channels 2, 3: reward, discount
    edge_rows[:, 2:4].index_copy_(0, flat_edge, torch.stack([reward, discount], -1))
    tree.parents.view(-1).index_copy_(0, flat_leaf, parent)
    tree.action_from_parent.view(-1).index_copy_(0, flat_leaf, action)
    tree.node_data.view(-1, tree.node_data.shape[-1])[:, 2].index_copy_(0, flat_leaf, value)  # raw
    priors = torch.stack([logits, torch.softmax(logits, -1)], -1)  # channels 4, 5
    tree.edge_data.view(-1, num_actions, num_fields)[:, :, 4:6].index_copy_(0, flat_leaf, priors)
    if invalid is not None:
        tree.invalid_actions.view(-1, num_actions).index_copy_(0, flat_leaf, invalid)
        if cache is not None:
            cache.any_invalid = True
    store.write(flat_leaf, next_embedding)
    return leaf


def _normalize_invalid(
    invalid: Tensor | None, batch: int, num_actions: int, device: torch.device
) -> Tensor:
    if invalid is None:
        return torch.zeros(batch, num_actions, dtype=torch.bool, device=device)
    if invalid.shape != (batch, num_actions):
        raise ValueError(
            f"recurrent_fn invalid_actions must be [B, A]={batch, num_actions}, "
            f"got {tuple(invalid.shape)}"
        )
    invalid = invalid.bool()
    return invalid & ~invalid.all(-1, keepdim=True)


def _backward(tree: Tree, offsets: Tensor, path: _Path, leaf: Tensor) -> Tensor:
    """Back the leaves' raw values up their paths, updating visits, sums and derived means.

    The values are computed level by level (``v_parent = r + discount * v_child``; levels a
    tree did not take pass the value through unchanged). The levels taken are then gathered
    into one list of distinct node and edge rows per tree, updated and written back at once.

    Returns:
        ``[M]`` the distinct flat nodes whose statistics changed (paths and leaves).
    """
    batch, depth = path.edges.shape
    num_actions = tree.num_actions
    flat_leaf = offsets + leaf
    node_rows = tree.node_data.view(-1, tree.node_data.shape[-1])  # visits, sums, raw, mean
    edge_rows = tree.edge_data.view(-1, tree.edge_data.shape[-1])  # visits, sums, r, discount, ...
    leaf_value = node_rows[:, 2].index_select(0, flat_leaf)
    taken = path.active.t().reshape(-1).nonzero().squeeze(-1)  # level-major: d * B + b
    taken_edges = path.edges.t().reshape(-1).index_select(0, taken)
    edges = edge_rows.index_select(0, taken_edges)  # [M, 7]
    # Levels not taken pass the value through: reward 0, discount 1.
    rewards = leaf_value.new_zeros(depth * batch).scatter_(0, taken, edges[:, 2])
    discounts = leaf_value.new_ones(depth * batch).scatter_(0, taken, edges[:, 3])
    rewards, discounts = rewards.view(depth, batch).unbind(), discounts.view(depth, batch).unbind()
    value, backed = leaf_value, [leaf_value]
    for reward, discount in zip(reversed(rewards), reversed(discounts), strict=True):
        value = reward + discount * value
        backed.append(value)
    values = torch.stack(backed[::-1]).view(-1)  # [(D + 1) * B]: level d's node gets row d
    # Distinct rows: the nodes and edges of the levels taken, and the leaves.
    node_index = torch.cat([torch.div(taken_edges, num_actions, rounding_mode="floor"), flat_leaf])
    node_add = torch.cat([values.index_select(0, taken), leaf_value])
    nodes = node_rows.index_select(0, node_index)
    nodes[:, 0] += 1
    nodes[:, 1] += node_add
    nodes[:, 3] = nodes[:, 1] / nodes[:, 0].clamp(min=1)
    node_rows.index_copy_(0, node_index, nodes)
    visits, sums, rewards, discounts = edges[:, 0:4].unbind(-1)
    visits += 1
    sums += values.index_select(0, taken + batch)  # the child's value: one level deeper
    edges[:, 6] = rewards + discounts * (sums / visits.clamp(min=1))
    edge_rows.index_copy_(0, taken_edges, edges)
    return node_index
