"""The engines behind ``search(method=...)``: ``"auto"`` takes numba where it applies and
builds the tensor engine's tree; the removed Python-floats engine is refused by name. The random
models and the tree comparison here are shared with tests/core/test_mcts_numba.py."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from tdrl.core.mcts import (
    RecurrentOutput,
    RootOutput,
    gumbel_muzero_policy,
    muzero_policy,
    puct_selection,
    search,
    ucb1_selection,
)

FIELDS = ("node_data", "edge_data", "parents", "action_from_parent", "children_index",
          "invalid_actions")  # fmt: skip


def _model(seed: int, num_actions: int = 5, dim: int = 6, illegal: bool = True,
           terminal: bool = False, uniform: bool = False,
           calls: list | None = None):  # fmt: skip
    """A random MuZero-style model; some actions illegal, some transitions terminal; with
    ``uniform`` every prior is flat, so unvisited children tie (broken to the lowest)."""
    g = torch.Generator().manual_seed(seed)
    dynamics = torch.randn(num_actions, dim, dim, generator=g) / dim**0.5
    policy_w = torch.randn(dim, num_actions, generator=g) * (0.0 if uniform else 1.0)
    value_w = torch.randn(dim, generator=g)

    def recurrent(x, action):
        if calls is not None:
            calls.append((x.clone(), action.clone()))
        nxt = torch.tanh(torch.bmm(dynamics[action], x.unsqueeze(-1)).squeeze(-1))
        invalid = None
        if illegal:
            invalid = nxt[:, :num_actions] > 0.8
            invalid[:, 0] = False
        discount = torch.full((x.shape[0],), 0.9)
        if terminal:
            discount = torch.where(nxt[:, 1] > 0.7, 0.0, discount)
        return RecurrentOutput(nxt, nxt[:, 0], discount, nxt @ policy_w,
                               torch.tanh(nxt @ value_w), invalid)  # fmt: skip

    def root(batch):
        x = torch.randn(batch, dim, generator=g)
        return RootOutput(x @ policy_w, torch.tanh(x @ value_w), x)

    return recurrent, root


def _assert_same(a, b):
    for name in FIELDS:
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert torch.equal(a.embeddings["embedding"], b.embeddings["embedding"])


@pytest.mark.parametrize("batch", [1, 3, 17])
def test_auto_builds_the_tensor_engines_tree_for_every_rule(batch):
    rec, root = _model(0)
    r = root(batch)
    for rule in (puct_selection, partial(puct_selection, pb_c_init=1.0), ucb1_selection):
        auto = search(r, rec, rule, rule, 12)
        _assert_same(auto, search(r, rec, rule, rule, 12, method="tensor"))
    ucb = search(r, rec, ucb1_selection, ucb1_selection, 12)  # numba cannot take UCB1: tensor under auto
    assert int(ucb.node_visits[:, 0].min()) == 13


def test_removed_and_unknown_engines_are_refused_by_name():
    rec, root = _model(0)
    with pytest.raises(ValueError, match="method='python'.*was removed.*method='numba'"):
        search(root(2), rec, puct_selection, puct_selection, 12, method="python")
    with pytest.raises(ValueError, match="method must be one of 'auto', 'tensor', 'numba'"):
        search(root(2), rec, puct_selection, puct_selection, 12, method="jit")


def test_policies_agree_across_paths():
    """muzero_policy (auto: numba where installed) == the same search forced onto tensors;
    Gumbel's root rule differs from its interior one, so it runs on the tensor engine."""
    rec, root = _model(3, illegal=False)
    r = root(2)
    out = muzero_policy(r, rec, 16, dirichlet_fraction=0.0, temperature=0.0, return_tree=True)[1]
    rule = partial(puct_selection)
    _assert_same(out, search(r, rec, rule, rule, 16, method="tensor"))
    g = gumbel_muzero_policy(r, rec, 8, generator=torch.Generator().manual_seed(0))
    assert g["visit_counts"].sum(-1).tolist() == [8, 8]


@pytest.mark.parametrize("method", ["tensor", "numba"])
@pytest.mark.parametrize("max_depth", [None, 1, 2])
def test_root_edge_visits_sum_to_the_simulations(method, max_depth):
    """muzero_policy's target is the root visits / num_simulations: every simulation, also one
    that re-evaluates a leaf at max_depth or ends in a terminal state, backs up through exactly
    one root edge (either engine, one or two players, illegal actions)."""
    if method == "numba":
        pytest.importorskip("numba")
    rec, root = _model(2, terminal=True)
    for two_player in (False, True):
        tree = search(root(4), rec, puct_selection, puct_selection, 9, method=method,
                      max_depth=max_depth, two_player=two_player)  # fmt: skip
        visits = tree.children_visits[:, 0]  # the root edges
        assert visits.sum(-1).tolist() == [9.0] * 4
    out = muzero_policy(root(4), rec, 9, max_depth=max_depth, dirichlet_fraction=0.0)
    assert torch.equal(out["policy_target"], out["visit_counts"].float() / 9)
    assert torch.equal(out["visit_counts"].sum(-1), torch.full((4,), 9))
