"""The batched tensor search equals a plain Python-object MCTS (the benchmark's reference)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from tdrl.core.mcts import muzero_policy

_BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "mcts.py"


def _load_benchmark():
    spec = importlib.util.spec_from_file_location("_mcts_benchmark", _BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_batched_search_matches_python_object_mcts(seed):
    bench = _load_benchmark()
    model = bench.TinyModel(dim=8, num_actions=4, seed=seed, dtype=torch.float64)
    embeddings = torch.randn(6, 8, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    out, tree = muzero_policy(
        model.root(embeddings), model.recurrent, 24,
        dirichlet_fraction=0.0, temperature=0.0, return_tree=True,
    )  # fmt: skip
    for b in range(embeddings.shape[0]):
        root = bench.python_puct_search(model, embeddings[b], 24)
        visits = [root.children[a].visit_count if a in root.children else 0 for a in range(4)]
        assert out["visit_counts"][b].tolist() == visits
        assert out["root_value"][b].item() == pytest.approx(root.value(), abs=1e-9)
        # One level down too: the most visited child's own children.
        best = max(range(4), key=lambda a: visits[a])
        child = root.children[best]
        index = tree.children_index[b, 0, best]
        below = [child.children[a].visit_count if a in child.children else 0 for a in range(4)]
        assert tree.children_visits[b, index].long().tolist() == below
