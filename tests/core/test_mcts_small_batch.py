"""The Python-float search of a few trees builds the tensor search's tree, bit for bit."""

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
    qtransform_by_parent_and_siblings,
    search,
    ucb1_selection,
)
from tdrl.core.mcts.small_batch import SMALL_BATCH

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


@pytest.mark.parametrize("two_player", [False, True])
@pytest.mark.parametrize("max_depth", [None, 3])
@pytest.mark.parametrize("batch", [1, 5])
def test_python_search_is_the_tensor_search(two_player, max_depth, batch):
    rule = partial(puct_selection, pb_c_init=1.0, qtransform=qtransform_by_parent_and_siblings)
    for seed in range(6):
        calls_t, calls_p = [], []
        kinds = dict(illegal=seed % 2 == 0, terminal=seed % 3 == 0, uniform=seed % 4 == 1)
        rec_t, root_t = _model(seed, calls=calls_t, **kinds)
        rec_p, root_p = _model(seed, calls=calls_p, **kinds)
        kw = dict(two_player=two_player, max_depth=max_depth)
        tensor = search(root_t(batch), rec_t, rule, rule, 20, method="tensor", **kw)
        python = search(root_p(batch), rec_p, rule, rule, 20, method="python", **kw)
        _assert_same(tensor, python)
        # the model saw the same inputs in the same order
        assert len(calls_t) == len(calls_p)
        for (xt, at), (xp, ap) in zip(calls_t, calls_p):
            assert torch.equal(xt, xp) and torch.equal(at, ap)
        if max_depth is not None:  # the trees were cut: some simulations re-evaluated a node
            assert len(calls_t) < 20


def test_auto_takes_the_python_path_only_where_it_applies():
    rec, root = _model(0)
    r = root(SMALL_BATCH + 1)
    auto = search(r, rec, puct_selection, puct_selection, 12)
    _assert_same(auto, search(r, rec, puct_selection, puct_selection, 12, method="tensor"))
    small = RootOutput(r.prior_logits[:3], r.value[:3], r.embedding[:3])
    auto = search(small, rec, puct_selection, puct_selection, 12)
    _assert_same(auto, search(small, rec, puct_selection, puct_selection, 12, method="python"))
    # another rule (UCB1) stays on the tensor path under auto, and python refuses it
    ucb = search(small, rec, ucb1_selection, ucb1_selection, 12)
    assert int(ucb.node_visits[:, 0].min()) == 13
    with pytest.raises(ValueError, match="default PUCT rule"):
        search(small, rec, ucb1_selection, ucb1_selection, 12, method="python")
    with pytest.raises(ValueError, match="method must be"):
        search(small, rec, puct_selection, puct_selection, 12, method="jit")


def test_policies_agree_across_paths():
    """muzero_policy (auto: python at B=2) == the same search forced onto tensors; Gumbel's
    root rule differs from its interior one, so it never takes the python path."""
    rec, root = _model(3, illegal=False)
    r = root(2)
    out = muzero_policy(r, rec, 16, dirichlet_fraction=0.0, temperature=0.0, return_tree=True)[1]
    rule = partial(puct_selection)
    _assert_same(out, search(r, rec, rule, rule, 16, method="tensor"))
    g = gumbel_muzero_policy(r, rec, 8, generator=torch.Generator().manual_seed(0))
    assert g["visit_counts"].sum(-1).tolist() == [8, 8]
