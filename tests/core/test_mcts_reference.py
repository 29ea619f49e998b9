"""The batched tensor search equals a plain Python-object MCTS (the benchmark's reference)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from tdrl.core.mcts import gumbel_muzero_policy, muzero_policy

_BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "mcts.py"


def _load_benchmark():
    return importlib.import_module("benchmarks.mcts")


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


@pytest.mark.gpu
def test_cuda_search_matches_cpu():
    bench = _load_benchmark()
    cpu = bench.TinyModel(dim=8, num_actions=4, seed=0, dtype=torch.float64)
    cuda = bench.TinyModel(dim=8, num_actions=4, seed=0, dtype=torch.float64).to("cuda")
    embeddings = torch.randn(64, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    kwargs = dict(dirichlet_fraction=0.0, temperature=0.0)
    out_cpu = muzero_policy(cpu.root(embeddings), cpu.recurrent, 16, **kwargs)
    out_cuda = muzero_policy(cuda.root(embeddings.cuda()), cuda.recurrent, 16, **kwargs)
    assert out_cuda["visit_counts"].cpu().tolist() == out_cpu["visit_counts"].tolist()
    torch.testing.assert_close(out_cuda["root_value"].cpu(), out_cpu["root_value"])
    gen = torch.Generator("cuda").manual_seed(0)
    out = gumbel_muzero_policy(cuda.root(embeddings.cuda()), cuda.recurrent, 16, generator=gen)
    assert out["considered_actions"].gather(1, out["action"][:, None]).all()
    out = muzero_policy(cuda.root(embeddings.cuda()), cuda.recurrent, 8, generator=gen)  # noise
    assert out["action"].device.type == "cuda"
