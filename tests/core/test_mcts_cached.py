"""Cached selection (node-batched rules) builds exactly the tree of the level-by-level walk."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from tensordict import TensorDict

from tdrl.core.mcts import (
    RecurrentOutput,
    RootOutput,
    TicTacToe,
    gumbel_interior_selection,
    gumbel_root_selection,
    node_batched,
    puct_selection,
    qtransform_by_min_max,
    sample_gumbel,
    search,
    simulator_model,
    supports_node_batches,
    ucb1_selection,
)

MIN_MAX = partial(qtransform_by_min_max, min_value=-2.0, max_value=3.0)
FIELDS = ("node_data", "edge_data", "parents", "action_from_parent", "children_index",
          "invalid_actions")  # fmt: skip


def _random_model(num_actions: int = 4, dim: int = 5, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    dynamics = torch.randn(num_actions, dim, dim, generator=g) / dim**0.5
    reward_w = torch.randn(num_actions, dim, generator=g)
    policy_w = torch.randn(dim, num_actions, generator=g)
    value_w = torch.randn(dim, generator=g)

    def root(x):
        return RootOutput(x @ policy_w, torch.tanh(x @ value_w), x)

    def recurrent(x, action):
        nxt = torch.tanh(torch.bmm(dynamics[action], x.unsqueeze(-1)).squeeze(-1))
        reward = torch.tanh((reward_w[action] * x).sum(-1))
        # Action 0 ends the episode (discount 0) so some trees stop growing along it.
        discount = torch.where(action == 0, 0.0, 0.95)
        return RecurrentOutput(nxt, reward, discount, nxt @ policy_w, torch.tanh(nxt @ value_w))

    return root, recurrent


def _level_by_level(fn):
    """The same rule without the node-batched mark: search walks and scores each level."""
    return lambda tree, node, depth: fn(tree, node, depth)


def _assert_same_tree(fast, slow):
    for name in FIELDS:
        assert torch.equal(getattr(fast, name), getattr(slow, name)), name
    assert torch.equal(fast.embeddings["embedding"], slow.embeddings["embedding"])


@pytest.mark.parametrize("max_depth", [None, 2, 4])
@pytest.mark.parametrize(
    "rule",
    [
        partial(puct_selection),
        partial(puct_selection, pb_c_init=0.5),
        partial(ucb1_selection),
        partial(puct_selection, qtransform=MIN_MAX),
    ],
)
def test_cached_search_equals_level_by_level(rule, max_depth):
    assert supports_node_batches(rule)
    root_fn, recurrent_fn = _random_model()
    roots = root_fn(torch.randn(7, 5, generator=torch.Generator().manual_seed(3)))
    fast = search(roots, recurrent_fn, rule, rule, 40, max_depth=max_depth)
    slow = search(roots, recurrent_fn, rule, _level_by_level(rule), 40, max_depth=max_depth)
    _assert_same_tree(fast, slow)
    assert int(fast.node_visits[:, 0].min()) == 41


def test_cached_gumbel_search_equals_level_by_level():
    root_fn, recurrent_fn = _random_model(num_actions=6, seed=4)
    roots = root_fn(torch.randn(5, 5, generator=torch.Generator().manual_seed(5)))
    gumbel = sample_gumbel((5, 6), generator=torch.Generator().manual_seed(6))
    extra = TensorDict({"gumbel": gumbel}, batch_size=[5])
    root_rule = partial(gumbel_root_selection, num_simulations=30, max_num_considered_actions=4)
    fast = search(roots, recurrent_fn, root_rule, gumbel_interior_selection, 30, extra=extra)
    slow = search(roots, recurrent_fn, root_rule, _level_by_level(gumbel_interior_selection), 30,
                  extra=extra)  # fmt: skip
    _assert_same_tree(fast, slow)


def test_cached_two_player_game_equals_level_by_level():
    game = TicTacToe()
    uniform = lambda s: (torch.zeros(s.shape[0], 9), torch.zeros(s.shape[0]))  # noqa: E731
    root_fn, recurrent_fn = simulator_model(game, uniform)
    roots = root_fn(game.from_strings(["X........", "XO..X....", ".........", "XXOOX...."]))
    rule = partial(puct_selection)
    fast = search(roots, recurrent_fn, rule, rule, 60, two_player=True)
    slow = search(roots, recurrent_fn, rule, _level_by_level(rule), 60, two_player=True)
    for name in FIELDS:
        assert torch.equal(getattr(fast, name), getattr(slow, name)), name


def test_node_stats_of_several_nodes_per_tree_match_one_at_a_time():
    root_fn, recurrent_fn = _random_model()
    tree = search(root_fn(torch.randn(3, 5)), recurrent_fn, puct_selection, puct_selection, 12)
    nodes = torch.tensor([[0, 3, 5], [1, 2, 12], [7, 0, 4]])
    stats = tree.node_stats(nodes)
    assert stats.visits.shape == (3, 3, 4) and stats.node_visit.shape == (3, 3)
    for k in range(3):
        column = tree.node_stats(nodes[:, k])
        for many, one in zip(stats, column, strict=True):
            assert torch.equal(many[:, k], one)
    assert torch.equal(puct_selection(tree, nodes)[:, 1], puct_selection(tree, nodes[:, 1]))


def test_only_marked_rules_and_qtransforms_are_cached():
    assert supports_node_batches(puct_selection)
    assert supports_node_batches(gumbel_interior_selection)
    assert not supports_node_batches(_level_by_level(puct_selection))
    custom_q = lambda stats: stats.qvalues  # noqa: E731
    assert not supports_node_batches(partial(puct_selection, qtransform=custom_q))
    assert supports_node_batches(partial(puct_selection, qtransform=node_batched(custom_q)))
