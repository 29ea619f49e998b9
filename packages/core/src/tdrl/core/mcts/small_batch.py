"""The search of a few trees with the default PUCT rule, its statistics in Python floats.

The tensor search (:mod:`~tdrl.core.mcts.search`) pays a fixed cost per torch op, some
hundred ops per simulation whatever the number of trees: at ``B = 1`` that is ~0.7 ms per
simulation, against ~0.1 ms for mctx's compiled step. With few trees the statistics are
cheaper as Python floats: walking down a tree and backing a value up cost a few float
operations per level, and the only torch work per simulation is the model call and one
read and one write of the embeddings. :func:`~tdrl.core.mcts.search.search` takes this
path on the CPU for ``B <= SMALL_BATCH`` float32 or float64 trees when the rule is the
default PUCT (the rule that :func:`~tdrl.core.mcts.fused.fused_rule` recognises) at the
root and below it.

It is the same algorithm as the tensor search, step for step: the same actions (ties to the
lowest), the same calls of the model on the same inputs, the same tree at the end (the
tensors are written once, after the last simulation). The statistics are stored in the
tree's float type and updated one rounded operation at a time in the tensor search's order,
so they are bit for bit the tensor search's; the selection scores are computed in float64
(for a float32 tree the tensor search scores in float32),
so two actions whose scores differ by less than a float32 rounding could be ranked the other
way (tests/core/test_mcts_small_batch.py compares the two paths on random models).
"""

from __future__ import annotations

import math
from array import array
from typing import TYPE_CHECKING

import numpy as np
import torch

from .fused import FusedPUCT
from .tree import ROOT_INDEX, UNVISITED, RecurrentOutput, Tree

if TYPE_CHECKING:
    from .search import RecurrentFn, _EmbeddingStore

SMALL_BATCH = 16
"""Up to this many trees (on the CPU) the search keeps its statistics in Python floats;
above it the tensor path is faster (``benchmarks/mcts.py``: they cross near 20 trees here)."""


TYPECODES = {torch.float32: "f", torch.float64: "d"}
"""The tree float types this path handles (``array`` type codes); others take the tensors."""


class _Trees:
    """The statistics of ``B`` trees as flat Python lists, row ``b * N + n`` per node."""

    def __init__(self, tree: Tree) -> None:
        self.num_nodes, self.num_actions = tree.num_nodes, tree.num_actions
        nodes = tree.node_data[:, ROOT_INDEX].tolist()  # [B, 4]
        num_rows, num_actions = tree.batch_size * tree.num_nodes, tree.num_actions
        # storage in the tree's float type (array "f" rounds to float32 on every store): sums
        # and means, computed one operation at a time as the tensor search does, come out
        # bit for bit the same.
        code = TYPECODES[tree.node_data.dtype]
        num_edges = num_rows * num_actions

        def zeros(n: int) -> array:
            return array(code, bytes(array(code).itemsize * n))

        self.visits, self.sums, self.means = zeros(num_rows), zeros(num_rows), zeros(num_rows)
        self.raw = [0.0] * num_rows
        self.e_visits, self.e_sums, self.e_q = zeros(num_edges), zeros(num_edges), zeros(num_edges)
        self.e_rewards = [0.0] * num_edges
        self.e_discounts = [0.0] * num_edges
        self._tmp = zeros(1)
        self.logits = [0.0] * num_edges
        self.probs = [0.0] * num_edges
        self.invalid = [False] * num_edges
        self.any_invalid = False
        self.children = [UNVISITED] * num_edges
        self.parents = [-1] * num_rows
        self.actions = [-1] * num_rows
        root_logits = tree.edge_data[:, ROOT_INDEX, :, 4].tolist()
        root_probs = tree.edge_data[:, ROOT_INDEX, :, 5].tolist()
        root_invalid = tree.invalid_actions[:, ROOT_INDEX].tolist()
        rows = zip(nodes, root_logits, root_probs, root_invalid)
        for b, (row, logits, probs, invalid) in enumerate(rows):
            n = b * self.num_nodes
            self.visits[n], self.sums[n], self.raw[n], self.means[n] = row
            self.logits[n * num_actions:(n + 1) * num_actions] = logits
            self.probs[n * num_actions:(n + 1) * num_actions] = probs
            self.invalid[n * num_actions:(n + 1) * num_actions] = invalid
            self.any_invalid = self.any_invalid or any(invalid)

    def best_action(self, node: int, rule: FusedPUCT) -> int:
        """PUCT with the parent-and-siblings min-max Q, as :class:`FusedPUCT` scores it."""
        num_actions = self.num_actions
        first = node * num_actions
        visit, value = self.visits[node], self.means[node]
        pb_c = math.log((visit + (rule.pb_c_base + 1.0)) / rule.pb_c_base) + rule.pb_c_init
        explore = math.sqrt(visit) * pb_c
        e_visits = self.e_visits[first:first + num_actions]
        e_q = self.e_q[first:first + num_actions]
        low = high = value
        for n, q in zip(e_visits, e_q):
            if n > 0:
                low, high = (q if q < low else low), (q if q > high else high)
        scale = high - low
        if scale < rule.epsilon:
            scale = rule.epsilon
        probs = self.probs[first:first + num_actions]
        invalid = self.invalid[first:first + num_actions] if self.any_invalid else None
        best, best_score = 0, -math.inf
        for a in range(num_actions):
            n = e_visits[a]
            score = explore * probs[a] / (n + 1.0)
            if n > 0:
                score += (e_q[a] - low) / scale
            if invalid is not None and invalid[a]:
                score = -math.inf
            if score > best_score or a == 0:
                best, best_score = a, score
        return best

    def backup(self, path: list[int], leaf: int, leaf_value: float) -> None:
        """Back ``leaf_value`` up the flat edges ``path`` (root first) into ``leaf``."""
        num_actions, tmp = self.num_actions, self._tmp
        self.visits[leaf] += 1.0
        self.sums[leaf] += leaf_value
        self.means[leaf] = self.sums[leaf] / self.visits[leaf]
        value = leaf_value
        for edge in reversed(path):  # each float32 operation rounded, in the tensor order
            self.e_visits[edge] += 1.0
            self.e_sums[edge] += value
            reward, discount = self.e_rewards[edge], self.e_discounts[edge]
            tmp[0] = self.e_sums[edge] / self.e_visits[edge]
            tmp[0] *= discount
            self.e_q[edge] = tmp[0] + reward
            tmp[0] = discount * value
            tmp[0] += reward
            value = tmp[0]
            node = edge // num_actions
            self.visits[node] += 1.0
            self.sums[node] += value
            self.means[node] = self.sums[node] / self.visits[node]

    def write(self, tree: Tree) -> None:
        """Write the statistics into the tree's tensors (the illegal actions are there)."""
        batch, num_nodes, num_actions = tree.batch_size, self.num_nodes, self.num_actions
        dtype = tree.node_data.dtype
        nodes = torch.tensor(
            [list(self.visits), list(self.sums), self.raw, list(self.means)], dtype=dtype
        )
        tree.node_data.copy_(nodes.t().reshape(batch, num_nodes, 4))
        edges = torch.tensor(
            [list(self.e_visits), list(self.e_sums), self.e_rewards, self.e_discounts,
             self.logits, self.probs, list(self.e_q)], dtype=dtype,
        ).t().reshape(batch, num_nodes, num_actions, 7)  # fmt: skip
        tree.edge_data.copy_(edges)
        tree.children_index.copy_(torch.tensor(self.children).view(batch, num_nodes, num_actions))
        tree.parents.copy_(torch.tensor(self.parents).view(batch, num_nodes))
        tree.action_from_parent.copy_(torch.tensor(self.actions).view(batch, num_nodes))


def python_search(
    tree: Tree,
    store: _EmbeddingStore,
    recurrent_fn: RecurrentFn,
    rule: FusedPUCT,
    num_simulations: int,
    max_depth: int,
    two_player: bool,
) -> None:
    """Fill ``tree`` (its root written by ``init_tree``) with ``num_simulations`` simulations.

    Args:
        tree: the initialised tree (``B`` trees on the CPU).
        store: its embeddings store.
        recurrent_fn: the model, called on all ``B`` trees once per simulation in which any
            tree grows (as the tensor search does).
        rule: the PUCT constants, used at the root and below it.
        num_simulations, max_depth, two_player: as :func:`~tdrl.core.mcts.search.search`.
    """
    from .search import _vector, leaf_priors

    trees = _Trees(tree)
    batch, num_nodes, num_actions = tree.batch_size, tree.num_nodes, tree.num_actions
    dtype = tree.node_data.dtype
    children, children_list = trees.children, range(batch)
    for sim in range(num_simulations):
        new_index = sim + 1
        paths, parents, actions, existing = [], [], [], []
        for b in children_list:
            node, path = b * num_nodes, []
            while True:
                action = trees.best_action(node, rule)
                edge = node * num_actions + action
                path.append(edge)
                child = children[edge]
                if child == UNVISITED or len(path) >= max_depth:
                    break
                node = b * num_nodes + child
            paths.append(path)
            parents.append(node)
            actions.append(action)
            existing.append(child)
        grows = [child == UNVISITED for child in existing]
        leaf_values = [0.0] * batch
        if any(grows):
            out = RecurrentOutput(
                *recurrent_fn(store.read(_index(parents)), _index(actions))
            )
            rewards = _vector(out.reward, batch, "reward", dtype).tolist()
            discounts = _vector(out.discount, batch, "discount", dtype).tolist()
            values = _vector(out.value, batch, "value", dtype).tolist()
            priors, invalid = leaf_priors(out, batch, num_actions, dtype)
            if all(grows):
                if invalid is not None:
                    tree.invalid_actions[:, new_index] = invalid
                store.write_slot(new_index, out.next_embedding)
            else:
                keep = torch.tensor(grows).nonzero().squeeze(-1)
                rows = keep * num_nodes + new_index
                if invalid is not None:
                    tree.invalid_actions.view(-1, num_actions).index_copy_(0, rows, invalid[keep])
                store.write(rows, out.next_embedding[keep])
            priors = priors.tolist()
            invalid_rows = invalid.tolist() if invalid is not None else None
            for b in children_list:
                if not grows[b]:
                    continue
                leaf, edge = b * num_nodes + new_index, paths[b][-1]
                children[edge] = new_index
                trees.e_rewards[edge] = rewards[b]
                trees.e_discounts[edge] = -discounts[b] if two_player else discounts[b]
                trees.parents[leaf] = parents[b] - b * num_nodes
                trees.actions[leaf] = actions[b]
                trees.raw[leaf] = values[b]
                span = slice(leaf * num_actions, (leaf + 1) * num_actions)
                trees.logits[span], trees.probs[span] = zip(*priors[b])
                if invalid_rows is not None:
                    trees.invalid[span] = invalid_rows[b]
                    trees.any_invalid = True
                leaf_values[b] = values[b]
        for b in children_list:
            slot = new_index if grows[b] else existing[b]
            leaf = b * num_nodes + slot
            value = leaf_values[b] if grows[b] else trees.raw[leaf]
            trees.backup(paths[b], leaf, value)
    trees.write(tree)


def _index(values: list[int]) -> torch.Tensor:
    """``[B]`` int64 from a list (through numpy: a third of ``torch.tensor``'s cost)."""
    return torch.from_numpy(np.array(values, dtype=np.int64))
