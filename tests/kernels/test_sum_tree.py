"""Sum/min tree op: hand-computed trees, reference vs CPU SumMinTree, Triton vs reference."""

from __future__ import annotations

import pytest
import torch
from tdrl.kernels import (
    sum_tree_find,
    sum_tree_find_reference,
    sum_tree_new,
    sum_tree_update,
    sum_tree_update_reference,
    use_backend,
)


def leaves(sums, capacity):
    p = sums.numel() // 2
    return sums[p:p + capacity]


def test_layout_and_golden_values():
    sums, mins = sum_tree_new(3)  # P = 4: nodes 1..7, leaves at 4..7
    assert sums.shape == mins.shape == (8,)
    sum_tree_update_reference(sums, mins, torch.tensor([0, 2]), torch.tensor([1.0, 3.0]))
    assert sums.tolist() == [0.0, 4.0, 1.0, 3.0, 1.0, 0.0, 3.0, 0.0]
    assert mins[1] == 1.0 and mins[3] == 3.0 and mins[2] == 1.0 and mins[5] == torch.inf
    # masses [0, 1) -> leaf 0, [1, 4) -> leaf 2 (leaf 1 is empty: never drawn)
    found = sum_tree_find_reference(sums, torch.tensor([0.0, 0.999, 1.0, 3.999]))
    assert found.tolist() == [0, 0, 2, 2]
    # a zero value empties a leaf: sum 0, min +inf
    sum_tree_update_reference(sums, mins, torch.tensor([0]), torch.tensor([0.0]))
    assert sums[1] == 3.0 and mins[1] == 3.0
    assert sum_tree_find_reference(sums, torch.tensor([0.0, 2.5])).tolist() == [2, 2]


def test_duplicates_last_write_wins():
    sums, mins = sum_tree_new(5)
    sum_tree_update_reference(sums, mins, torch.tensor([1, 3, 1, 1, 3]),
                              torch.tensor([9.0, 2.0, 7.0, 4.0, 5.0]))
    assert leaves(sums, 5).tolist() == [0.0, 4.0, 0.0, 5.0, 0.0]
    assert sums[1] == 9.0 and mins[1] == 4.0
    from tdrl.core.replay import SumMinTree

    tree = SumMinTree(5)  # the CPU tree of tdrl.core follows the same rule
    tree.update(torch.tensor([1, 3, 1, 1, 3]), torch.tensor([9.0, 2.0, 7.0, 4.0, 5.0]))
    assert tree[torch.arange(5)].tolist() == [0.0, 4.0, 0.0, 5.0, 0.0]


def test_bad_layout_is_refused():
    with pytest.raises(ValueError, match="power of two"):
        sum_tree_find_reference(torch.zeros(6, dtype=torch.float64), torch.zeros(1))
    with pytest.raises(ValueError, match="capacity must be >= 1"):
        sum_tree_new(0)


@pytest.mark.parametrize("capacity", [1, 7, 33, 1000])
def test_reference_matches_cpu_sum_min_tree(capacity):
    """Same leaves as tdrl.core's fan-out-32 tree: same totals, minima and sampled leaves."""
    from tdrl.core.replay import SumMinTree

    g = torch.Generator().manual_seed(capacity)
    tree = SumMinTree(capacity)
    sums, mins = sum_tree_new(capacity)
    for _ in range(5):
        idx = torch.randint(0, capacity, (max(1, capacity // 3),), generator=g)
        val = torch.rand(idx.numel(), generator=g, dtype=torch.float64)
        val[::4] = 0.0
        tree.update(idx, val)
        sum_tree_update_reference(sums, mins, idx, val)
        torch.testing.assert_close(leaves(sums, capacity), tree[torch.arange(capacity)])
        assert sums[1].item() == pytest.approx(tree.total, rel=1e-12)
        assert mins[1].item() == tree.min
    if tree.total > 0:
        # masses away from the leaf boundaries, where the two trees' round-off could differ
        csum = torch.cumsum(tree[torch.arange(capacity)], 0)
        hit = torch.randint(0, capacity, (200,), generator=g)
        hit = hit[tree[hit] > 0]
        mass = csum[hit] - 0.5 * tree[hit]
        assert sum_tree_find_reference(sums, mass).tolist() == hit.tolist()
        assert tree.find_prefix_sum(mass).tolist() == hit.tolist()


@pytest.mark.parametrize("capacity", [1, 7, 1000, 3000])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_triton_matches_reference(capacity, dtype):
    g = torch.Generator().manual_seed(7 + capacity)
    ref = sum_tree_new(capacity, dtype)
    tri = sum_tree_new(capacity, dtype)
    for k in (1, capacity, 3 * capacity + 1):  # the last has many duplicate indices
        idx = torch.randint(0, capacity, (k,), generator=g)
        val = torch.rand(k, generator=g, dtype=dtype)
        val[::5] = 0.0
        sum_tree_update_reference(*ref, idx, val)
        with use_backend("triton"):
            sum_tree_update(*tri, idx, val)
        torch.testing.assert_close(tri[0], ref[0], rtol=0, atol=0)
        torch.testing.assert_close(tri[1], ref[1], rtol=0, atol=0)
        mass = torch.rand(257, generator=g, dtype=dtype) * ref[0][1]
        with use_backend("triton"):
            got = sum_tree_find(tri[0], mass)
        assert torch.equal(got, sum_tree_find_reference(ref[0], mass))
        if ref[0][1] > 0:
            assert bool((leaves(ref[0], capacity)[got] > 0).all())  # never an empty leaf


def test_triton_large_batch_uses_per_level_launches():
    from tdrl.kernels.sum_tree import triton as tri_mod

    capacity, k = 5000, tri_mod.ONE_PROGRAM_MAX + 3
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, capacity, (k,), generator=g)
    val = torch.rand(k, generator=g, dtype=torch.float64)
    ref, tri = sum_tree_new(capacity), sum_tree_new(capacity)
    sum_tree_update_reference(*ref, idx, val)
    # after de-duplication fewer than k leaves remain: feed distinct ones to force the path
    uniq = torch.randperm(tri_mod.ONE_PROGRAM_MAX + 3, generator=g)
    cap2 = uniq.numel()
    ref2, tri2 = sum_tree_new(cap2), sum_tree_new(cap2)
    val2 = torch.rand(cap2, generator=g, dtype=torch.float64)
    sum_tree_update_reference(*ref2, uniq, val2)
    with use_backend("triton"):
        sum_tree_update(*tri, idx, val)
        sum_tree_update(*tri2, uniq, val2)
    assert torch.equal(tri[0], ref[0]) and torch.equal(tri[1], ref[1])
    assert torch.equal(tri2[0], ref2[0]) and torch.equal(tri2[1], ref2[1])


def test_sampling_distribution_is_proportional():
    capacity = 7
    sums, mins = sum_tree_new(capacity)
    val = torch.tensor([1.0, 0.0, 2.0, 3.0, 0.0, 4.0, 10.0], dtype=torch.float64)
    sum_tree_update(sums, mins, torch.arange(capacity), val)
    g = torch.Generator().manual_seed(0)
    n = 200_000
    got = sum_tree_find(sums, torch.rand(n, generator=g, dtype=torch.float64) * sums[1])
    freq = torch.bincount(got, minlength=capacity).double() / n
    torch.testing.assert_close(freq, val / val.sum(), atol=4e-3, rtol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_kernel_matches_cpu_reference():
    capacity = 1_000_003
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, capacity, (4096,), generator=g)
    val = torch.rand(4096, generator=g, dtype=torch.float64)
    ref = sum_tree_new(capacity)
    dev = sum_tree_new(capacity, device="cuda")
    sum_tree_update_reference(*ref, idx, val)
    sum_tree_update(*dev, idx.cuda(), val.cuda())
    assert torch.equal(dev[0].cpu(), ref[0]) and torch.equal(dev[1].cpu(), ref[1])
    mass = torch.rand(4096, generator=g, dtype=torch.float64) * ref[0][1]
    assert torch.equal(sum_tree_find(dev[0], mass.cuda()).cpu(), sum_tree_find_reference(ref[0], mass))
