"""The fused PUCT rescoring picks exactly the actions of ``puct_selection``."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from tensordict import TensorDict

from tdrl.core.mcts import (
    RecurrentOutput,
    RootOutput,
    Tree,
    puct_selection,
    qtransform_by_min_max,
    qtransform_by_parent_and_siblings,
    search,
    ucb1_selection,
)
from tdrl.core.mcts.fused import FusedPUCT, first_argmax, fused_rule


def _grown_tree(num_actions: int = 5, batch: int = 6, sims: int = 30) -> Tree:
    g = torch.Generator().manual_seed(0)
    dim = 6
    dynamics = torch.randn(num_actions, dim, dim, generator=g) / dim**0.5
    policy_w = torch.randn(dim, num_actions, generator=g)
    value_w = torch.randn(dim, generator=g)

    def recurrent(x, action):
        nxt = torch.tanh(torch.bmm(dynamics[action], x.unsqueeze(-1)).squeeze(-1))
        invalid = nxt[:, :num_actions] > 0.8  # some illegal actions, never all of them
        invalid[:, 0] = False
        return RecurrentOutput(
            nxt, nxt[:, 0], torch.full((x.shape[0],), 0.9), nxt @ policy_w,
            torch.tanh(nxt @ value_w), invalid,
        )  # fmt: skip

    x = torch.randn(batch, dim, generator=g)
    root = RootOutput(x @ policy_w, torch.tanh(x @ value_w), x)
    return search(root, recurrent, puct_selection, puct_selection, sims)


def _flat(tree: Tree) -> Tree:
    rows = tree.batch_size * tree.num_nodes
    empty = TensorDict({}, batch_size=[1])
    return Tree(
        node_data=tree.node_data.view(1, rows, -1),
        edge_data=tree.edge_data.view(1, rows, tree.num_actions, -1),
        parents=tree.parents.view(1, -1),
        action_from_parent=tree.action_from_parent.view(1, -1),
        children_index=tree.children_index.view(1, rows, -1),
        invalid_actions=tree.invalid_actions.view(1, rows, -1),
        embeddings=empty,
        extra=empty,
    )


@pytest.mark.parametrize("pb_c_init", [1.25, 0.1])
def test_fused_scores_equal_puct_selection(pb_c_init):
    tree = _grown_tree()
    assert bool(tree.invalid_actions.any())
    rule = partial(puct_selection, pb_c_init=pb_c_init)
    fused = fused_rule(rule)
    rows = tree.batch_size * tree.num_nodes
    nodes = torch.randperm(rows, generator=torch.Generator().manual_seed(1))[:100]
    expected = rule(_flat(tree), nodes[None], 1)[0]
    node_rows = tree.node_data.view(rows, -1)
    edge_rows = tree.edge_data.view(rows, tree.num_actions, -1)
    invalid = tree.invalid_actions.view(rows, -1)
    assert torch.equal(fused(node_rows, edge_rows, invalid, nodes), expected)
    prefetched = node_rows.index_select(0, nodes)
    assert torch.equal(fused(node_rows, edge_rows, invalid, nodes, prefetched), expected)
    picked = invalid.index_select(0, nodes).gather(1, expected[:, None])
    assert not bool(picked.any())


def test_first_argmax_breaks_ties_to_the_lowest_index():
    scores = torch.tensor([[1.0, 0.0, 2.0, -torch.inf], [3.0, 0.0, 2.0, -torch.inf],
                           [3.0, 5.0, 2.0, -torch.inf]])  # fmt: skip
    assert first_argmax(scores).tolist() == [1, 2, 0, 0]
    wide = torch.randn(20, 7).round()  # more actions than the unrolled loop handles
    assert torch.equal(first_argmax(wide), wide.argmax(0))
    small = torch.randn(4, 50).round()
    assert torch.equal(first_argmax(small), small.argmax(0))


def test_fused_rule_recognises_only_plain_puct():
    assert isinstance(fused_rule(puct_selection), FusedPUCT)
    rule = fused_rule(partial(puct_selection, pb_c_init=0.5, pb_c_base=100.0))
    assert (rule.pb_c_init, rule.pb_c_base, rule.epsilon) == (0.5, 100.0, 1e-8)
    eps = partial(qtransform_by_parent_and_siblings, epsilon=1e-3)
    assert fused_rule(partial(puct_selection, qtransform=eps)).epsilon == 1e-3
    min_max = partial(qtransform_by_min_max, min_value=-1.0, max_value=1.0)
    assert fused_rule(partial(puct_selection, qtransform=min_max)) is None
    assert fused_rule(ucb1_selection) is None
    assert fused_rule(lambda tree, node, depth: puct_selection(tree, node, depth)) is None
