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
