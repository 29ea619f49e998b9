"""The numba tree backend builds the tensor search's tree (same model calls, same statistics)."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from tdrl.core.mcts import (
    puct_selection,
    qtransform_by_min_max,
    qtransform_by_parent_and_siblings,
    search,
    ucb1_selection,
)

pytest.importorskip("numba", reason="the numba backend needs numba (tdrl-core[mcts])")

import importlib  # noqa: E402
import importlib.util  # noqa: E402
from pathlib import Path  # noqa: E402

_spec = importlib.util.spec_from_file_location("_mcts_engines", Path(__file__).with_name("test_mcts_engines.py"))
_small = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_small)
_assert_same, _model = _small._assert_same, _small._model  # the same random models and comparison


@pytest.mark.parametrize("two_player", [False, True])
@pytest.mark.parametrize("max_depth", [None, 3])
@pytest.mark.parametrize("batch", [1, 3, 64])
def test_numba_search_is_the_tensor_search(two_player, max_depth, batch):
    rules = [partial(puct_selection, pb_c_init=1.25, qtransform=qtransform_by_parent_and_siblings),
             partial(puct_selection, qtransform=partial(qtransform_by_min_max, min_value=-1.0, max_value=1.0)),
             puct_selection]
    for seed in range(4):
        rule = rules[seed % len(rules)]
        calls_t, calls_n = [], []
        kinds = dict(illegal=seed % 2 == 0, terminal=seed % 3 == 0, uniform=seed == 1)
        rec_t, root_t = _model(seed, calls=calls_t, **kinds)
        rec_n, root_n = _model(seed, calls=calls_n, **kinds)
        kw = dict(two_player=two_player, max_depth=max_depth)
        tensor = search(root_t(batch), rec_t, rule, rule, 24, method="tensor", **kw)
        fast = search(root_n(batch), rec_n, rule, rule, 24, method="numba", **kw)
        _assert_same(tensor, fast)
        assert len(calls_t) == len(calls_n)
        for (xt, at), (xn, an) in zip(calls_t, calls_n):
            assert torch.equal(xt, xn) and torch.equal(at, an)


def test_unsupported_rule_is_refused_by_name():
    rec, root = _model(0)
    with pytest.raises((ValueError, TypeError), match="numba"):
        search(root(2), rec, ucb1_selection, ucb1_selection, 4, method="numba")


@pytest.mark.parametrize("form", ["tensordict", "scalar", "other_dtype", "images"])
def test_numba_search_stores_every_embedding_form_as_the_tensor_search(form):
    """The compiled embedding writes (a plain tensor of the model's dtype) and the store's
    fallbacks (a TensorDict, a next embedding of another dtype) give the tensor search's tree,
    and the model sees the same inputs; a [B] embedding (no feature dim) and a [B, 2, 3] one
    are flattened to rows and back."""
    from tensordict import TensorDict

    from tdrl.core.mcts import RecurrentOutput, RootOutput

    batch, num_actions = 3, 4
    g = torch.Generator().manual_seed(7)
    policy_w = torch.randn(6, num_actions, generator=g)
    mix = torch.randn(num_actions, 6, 6, generator=g) / 6**0.5

    def features(x):  # the model's view of an embedding, as [B, 6]
        if form == "tensordict":
            x = x["state"]
        elif form == "scalar":
            x = torch.stack([x * (k + 1) for k in range(6)], -1)
        return x.reshape(x.shape[0], 6).float()

    def wrap(h):  # a [B, 6] state in the embedding's form
        if form == "tensordict":
            return TensorDict({"state": h}, batch_size=[h.shape[0]])
        if form == "scalar":
            return h.sum(-1)
        if form == "images":
            return h.reshape(-1, 2, 3)
        return h.double() if form == "other_dtype" else h

    def make(calls):
        def recurrent(x, action):
            calls.append((features(x).clone(), action.clone()))
            h = torch.tanh(torch.bmm(mix[action], features(x).unsqueeze(-1)).squeeze(-1))
            discount = torch.full((h.shape[0],), 0.9)
            return RecurrentOutput(wrap(h), h[:, 0], discount, h @ policy_w, torch.tanh(h[:, 1]))

        return recurrent

    h0 = torch.randn(batch, 6, generator=g)
    root_embedding = wrap(h0).float() if form == "other_dtype" else wrap(h0)
    trees, seen = [], []
    for method in ("tensor", "numba"):
        calls = []
        root = RootOutput(h0 @ policy_w, torch.tanh(h0[:, 1]), root_embedding.clone())
        rule = puct_selection
        trees.append(search(root, make(calls), rule, rule, 12, method=method, max_depth=4))
        seen.append(calls)
    for name in ("node_data", "edge_data", "parents", "action_from_parent", "children_index"):
        assert torch.equal(getattr(trees[0], name), getattr(trees[1], name)), name
    assert (trees[0].embeddings == trees[1].embeddings).all()
    assert int(trees[1].node_data[:, 0, 0].min()) == 13  # each root: 12 simulations + 1
    assert len(seen[0]) == len(seen[1]) >= 4  # max_depth 4: some simulations re-evaluate a leaf
    for (xt, at), (xn, an) in zip(*seen):
        assert torch.equal(xt, xn) and torch.equal(at, an)


@pytest.mark.parametrize("per_simulation_inputs", [False, True])
@pytest.mark.parametrize("form", ["plain", "column", "float64", "strided", "tuple"])
def test_numba_search_reads_every_output_form_as_the_tensor_search(form, per_simulation_inputs, monkeypatch):
    """Outputs read in place (contiguous CPU tensors of the tree's dtype) and those converted
    first ([B, 1] vectors, another float type, strided views, a plain tuple) give the tensor
    search's tree; the inputs the model keeps (not cloned) are never overwritten, whether
    they are views of one buffer or allocated per simulation."""
    from tdrl.core.mcts import RecurrentOutput, RootOutput

    if per_simulation_inputs:
        monkeypatch.setattr(importlib.import_module("tdrl.core.mcts.numba_backend"), "_INPUT_BYTES", 0)
    batch, num_actions, dim = 3, 4, 5
    g = torch.Generator().manual_seed(11)
    mix = torch.randn(num_actions, dim, dim, generator=g) / dim**0.5
    policy_w, value_w = torch.randn(dim, num_actions, generator=g), torch.randn(dim, generator=g)

    def make(kept):
        def recurrent(x, action):
            kept.append((x, action))  # held as given
            h = torch.tanh(torch.bmm(mix[action], x.unsqueeze(-1)).squeeze(-1))
            reward, value, logits = h[:, 0].contiguous(), torch.tanh(h @ value_w), h @ policy_w
            discount = torch.full((batch,), 0.95)
            if form == "column":
                reward, discount, value = reward[:, None], discount[:, None], value[:, None]
            elif form == "float64":
                reward, value, logits = reward.double(), value.double(), logits.double()
            elif form == "strided":
                reward, logits = h[:, 1], (policy_w.t() @ h.t()).t()
            out = (h, reward, discount, logits, value)
            return out if form == "tuple" else RecurrentOutput(*out)

        return recurrent

    h0 = torch.randn(batch, dim, generator=g)
    trees, seen = [], []
    for method in ("tensor", "numba"):
        kept = []
        root = RootOutput(h0 @ policy_w, torch.tanh(h0 @ value_w), h0.clone())
        trees.append(search(root, make(kept), puct_selection, puct_selection, 10, method=method))
        seen.append(kept)
    for name in ("node_data", "edge_data", "parents", "action_from_parent", "children_index"):
        assert torch.equal(getattr(trees[0], name), getattr(trees[1], name)), name
    assert int(trees[1].node_data[:, 0, 0].min()) == 11
    assert len(seen[1]) == 10
    for (xt, at), (xn, an) in zip(*seen):
        assert torch.equal(xt, xn) and torch.equal(at, an)


def test_numba_search_fills_every_slot_of_the_unfilled_tree():
    """Roots without illegal actions: init_tree leaves the arrays unfilled (torch.empty) and
    the first compiled call fills them; over memory just freed from tensors of 7s, every slot
    (the unused ones of a max_depth search included) is as the tensor search leaves it."""
    from tdrl.core.mcts import init_tree
    from tdrl.core.mcts.numba_backend import writes_root

    rec, root = _model(1, illegal=False)
    r = root(3)
    assert writes_root(r)
    tensor = search(r, rec, puct_selection, puct_selection, 16, method="tensor", max_depth=2)
    assert int((tensor.parents == -1).sum()) > 3  # unused slots: max_depth 2 re-evaluates leaves
    fields = ("node_data", "edge_data", "parents", "action_from_parent", "children_index", "invalid_actions")
    for _ in range(3):
        junk = [torch.full_like(getattr(tensor, name), 7) for name in fields]
        junk.append(torch.full_like(tensor.embeddings["embedding"], 7))
        del junk  # the next tensors of these sizes may take this memory
        fast = search(r, rec, puct_selection, puct_selection, 16, method="numba", max_depth=2)
        _assert_same(tensor, fast)
    with pytest.raises(ValueError, match="illegal"):
        init_tree(r._replace(invalid_actions=torch.zeros(3, 5, dtype=torch.bool)), 4, write_root=False)
