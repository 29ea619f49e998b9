"""Samplers: sum tree parity with a naive reference, prioritized probabilities and weights,
trajectory slices."""

from __future__ import annotations

import math

import pytest
import torch
from tensordict import TensorDict

from tdrl.core.replay import (
    PrioritizedReplayBuffer,
    PrioritizedSampler,
    ReplayBuffer,
    SliceSampler,
    SumMinTree,
    TensorStorage,
)


@pytest.mark.parametrize("capacity,fanout", [(1, 2), (7, 2), (100, 4), (1000, 32), (1025, 32)])
def test_sum_tree_matches_naive_reference(capacity, fanout):
    g = torch.Generator().manual_seed(capacity)
    tree = SumMinTree(capacity, fanout=fanout)
    ref = torch.zeros(capacity, dtype=torch.float64)
    filled = torch.zeros(capacity, dtype=torch.bool)
    for _ in range(5):
        idx = torch.randint(capacity, (min(capacity, 37),), generator=g).unique()
        val = torch.rand(idx.numel(), generator=g, dtype=torch.float64)
        val[::3] = 0.0  # zero priorities are never drawn
        tree.update(idx, val)
        ref[idx], filled[idx] = val, True
        assert math.isclose(tree.total, float(ref.sum()), rel_tol=1e-12)
        pos = ref[filled & (ref > 0)]
        assert tree.min == (float(pos.min()) if pos.numel() else math.inf)
        if tree.total == 0:
            continue
        mass = torch.rand(500, generator=g, dtype=torch.float64) * tree.total
        expect = torch.searchsorted(ref.cumsum(0), mass, right=True)
        assert torch.equal(tree.find_prefix_sum(mass), expect)
        assert (ref[tree.sample(200)] > 0).all()
    tree.clear(torch.arange(capacity))
    assert tree.total == 0 and tree.min == math.inf


def test_sum_tree_bad_index():
    with pytest.raises(IndexError, match="capacity is 4"):
        SumMinTree(4).update(torch.tensor([4]), 1.0)


def _items(n):
    i = torch.arange(n)
    return TensorDict({"obs": i.float()[:, None], "id": i}, [n])


def test_prioritized_sampling_frequencies_and_weights():
    torch.manual_seed(0)
    alpha, beta = 0.5, 0.4
    s = PrioritizedSampler(8, alpha=alpha, beta=beta, eps=0.0)
    rb = ReplayBuffer(TensorStorage(8), s, batch_size=20_000)
    rb.extend(_items(4))
    prio = torch.tensor([1.0, 4.0, 9.0, 0.0])
    rb.update_priority(torch.arange(4), prio)
    out = rb.sample()
    q = prio**alpha  # [1, 2, 3, 0]
    p = q / q.sum()
    freq = torch.bincount(out["index"], minlength=4).double() / out.numel()
    assert torch.allclose(freq, p.double(), atol=0.015)
    assert (out["index"] != 3).all()
    # w_i = (N P(i))^-beta / max_j (N P(j))^-beta, the max over stored items (min q).
    n = 4
    w_ref = (n * p) ** -beta
    w_ref = w_ref / w_ref[:3].max()
    got = out["_weight"]
    assert torch.allclose(got, w_ref[out["index"]], rtol=1e-5)
    assert math.isclose(got.max().item(), 1.0, rel_tol=1e-6)


def test_prioritized_new_items_get_max_priority_and_update_from_td():
    torch.manual_seed(0)
    rb = PrioritizedReplayBuffer(alpha=1.0, beta=1.0, storage=TensorStorage(10), batch_size=6)
    rb.extend(_items(2))
    rb.update_priority(torch.tensor([0, 1]), torch.tensor([5.0, 0.5]))
    rb.extend(_items(1))  # gets the max priority seen: 5
    pr = rb.sampler.priority(torch.arange(3))
    assert torch.allclose(pr, torch.tensor([5.0, 0.5, 5.0], dtype=torch.float64))
    s = rb.sample()
    s["td_error"] = torch.full((6, 1), 2.0)
    rb.update_priority(s)
    assert torch.allclose(rb.sampler.priority(s["index"]), torch.tensor(2.0, dtype=torch.float64))
    with pytest.raises(ValueError, match="non-finite"):
        rb.update_priority(torch.tensor([0]), torch.tensor([float("nan")]))
    with pytest.raises(ValueError, match="2 indices"):
        rb.update_priority(torch.tensor([0, 1]), torch.tensor([1.0, 2.0, 3.0]))


def test_prioritized_overwritten_slot_resets_priority():
    rb = PrioritizedReplayBuffer(alpha=1.0, beta=0.0, storage=TensorStorage(3))
    rb.extend(_items(3))
    rb.update_priority(torch.arange(3), torch.tensor([0.1, 0.2, 0.3]))
    rb.extend(_items(1))  # slot 0 is overwritten: new item, max priority 1.0
    assert torch.allclose(rb.sampler.priority(torch.arange(3)),
                          torch.tensor([1.0, 0.2, 0.3], dtype=torch.float64))


def _episodes(lengths, traj_ids=None):
    """Concatenated episodes; step entry = position inside its episode."""
    steps = torch.cat([torch.arange(n) for n in lengths])
    ep = torch.cat([torch.full((n,), k) for k, n in enumerate(lengths)])
    done = torch.cat([torch.arange(n) == n - 1 for n in lengths])
    td = TensorDict({"step": steps, "ep": ep, "next": {"done": done[:, None]}}, [len(steps)])
    if traj_ids is not None:
        td["collector", "traj_ids"] = traj_ids
    return td


def _check_slices(out, slice_len):
    assert out.shape[-1] == slice_len
    assert (out["ep"] == out["ep"][:, :1]).all(), "slice crosses an episode boundary"
    assert (out["step"].diff(dim=-1) == 1).all(), "slice is not contiguous in time"


def test_slice_sampler_by_done_flags_never_crosses_episodes():
    torch.manual_seed(0)
    rb = ReplayBuffer(TensorStorage(100), SliceSampler(slice_len=4), batch_size=400)
    rb.extend(_episodes([3, 7, 4, 10, 2]))
    out = rb.sample()
    assert out.batch_size == (100, 4)
    _check_slices(out, 4)
    # episodes of length 3 and 2 are too short; valid starts: 4 + 1 + 7 = 12
    assert set(out["ep"][:, 0].tolist()) == {1, 2, 3}
    starts = {(e, s) for e, s in zip(out["ep"][:, 0].tolist(), out["step"][:, 0].tolist())}
    assert len(starts) == 12  # every valid start is reachable


def test_slice_sampler_by_traj_ids_and_ring_wrap():
    torch.manual_seed(0)
    # traj ids differ from the done flags on purpose: ids win when present
    data = _episodes([6, 6])
    data["collector", "traj_ids"] = data["ep"] + 100
    data["next", "done"] = torch.zeros(12, 1, dtype=torch.bool)
    rb = ReplayBuffer(TensorStorage(10), SliceSampler(num_slices=50), batch_size=150)
    rb.extend(data[:8])
    rb.extend(data[8:])  # wraps: slots 0,1 hold ep 1 steps 4,5 (the newest items)
    out = rb.sample()
    assert out.batch_size == (50, 3)
    _check_slices(out, 3)
    # ep 0 kept steps 2..5 (slots 2..5), ep 1 steps 0..3 in slots 6..9 and 4..5 in
    # slots 0..1: the ring split at slot 0 forbids slices across 9 -> 0.
    assert set(out["index"][:, 0].tolist()) <= {2, 3, 6, 7}


def test_slice_sampler_errors():
    rb = ReplayBuffer(TensorStorage(20), SliceSampler(slice_len=5), batch_size=10)
    rb.extend(_episodes([3, 4]))
    with pytest.raises(ValueError, match="longest has 4"):
        rb.sample()
    with pytest.raises(ValueError, match="multiple of slice_len"):
        rb.sample(12)
    with pytest.raises(ValueError, match="exactly one"):
        SliceSampler(num_slices=2, slice_len=3)
    with pytest.raises(KeyError, match="nope"):
        r = ReplayBuffer(TensorStorage(20), SliceSampler(slice_len=2, traj_key="nope"))
        r.extend(_episodes([3]))
        r.sample(2)


@pytest.mark.parametrize("capacity", [64, 33, 1000])
def test_sum_tree_state_round_trip_with_padded_levels(capacity):
    """load_state_dict rebuilds parent levels that are shorter than their padded size."""
    tree = SumMinTree(capacity)
    idx = torch.arange(0, capacity, 3)
    tree.update(idx, idx.double() + 1)
    other = SumMinTree(capacity)
    other.load_state_dict(tree.state_dict())
    assert other.total == pytest.approx(tree.total) and other.min == tree.min
    mass = torch.linspace(0, tree.total * 0.999, 50)
    assert torch.equal(other.find_prefix_sum(mass), tree.find_prefix_sum(mass))


# ---------------------------------------------------------------- device sum tree (issue 43)
def _device_sampler_pair(device, capacity=37):
    from tdrl.core.replay import PrioritizedSampler, TensorStorage

    storage = TensorStorage(capacity)
    storage.set(torch.arange(capacity), TensorDict({"x": torch.arange(capacity)}, [capacity]))
    cpu = PrioritizedSampler(capacity, alpha=0.7, beta=0.5)
    dev = PrioritizedSampler(capacity, alpha=0.7, beta=0.5, device=device)
    return storage, cpu, dev


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_device_tree_sampler_matches_cpu_sampler(backend):
    """The DeviceSumTree path (run here on CPU tensors: reference, or Triton's interpreter)
    keeps the same priorities and weights as the CPU SumMinTree, and samples in proportion."""
    from tdrl.core.replay import WEIGHT_KEY, DeviceSumTree
    from tdrl.kernels import use_backend

    storage, cpu, dev = _device_sampler_pair("cpu")
    dev._tree = DeviceSumTree(dev.max_capacity, "cpu")  # the device tree, on CPU tensors
    dev.device = torch.device("cpu")
    g = torch.Generator().manual_seed(0)
    with use_backend(backend):
        for s in (cpu, dev):
            s.mark_update(torch.arange(37), storage)
        idx = torch.tensor([3, 5, 3, -1, 36])
        pr = torch.tensor([2.0, 0.5, 4.0, 9.0, 1.5])
        cpu.update_priority(idx, pr)
        dev._update_priority_device(idx, pr.double())  # the branch a CUDA sampler takes
        all_ = torch.arange(37)
        torch.testing.assert_close(dev.priority(all_), cpu.priority(all_))
        assert dev._tree.min == cpu._tree.min and float(dev._tree.total) == pytest.approx(cpu._tree.total)
        assert dev.priority(torch.tensor([3])).item() == pytest.approx((4.0 + 1e-8) ** 0.7)
        torch.manual_seed(1)
        index, info = dev.sample(storage, 50_000)
    q = cpu.priority(all_)
    freq = torch.bincount(index, minlength=37).double() / index.numel()
    torch.testing.assert_close(freq, q / q.sum(), atol=6e-3, rtol=0)
    torch.testing.assert_close(info[WEIGHT_KEY], (q[index] / q.min()).pow(-0.5).float())


def test_device_sampler_refuses_non_finite_priorities():
    from tdrl.core.replay import DeviceSumTree

    storage, _, dev = _device_sampler_pair("cpu")
    dev._tree = DeviceSumTree(dev.max_capacity, "cpu")
    dev.device = torch.device("meta")  # any non-CPU device takes the device branch
    with pytest.raises(ValueError, match="non-finite"):
        dev._update_priority_device(torch.tensor([1]), torch.tensor([float("nan")]))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_prioritized_sampler_stays_on_device():
    from tdrl.core.replay import WEIGHT_KEY

    storage, cpu, dev = _device_sampler_pair("cuda")
    for s in (cpu, dev):
        s.mark_update(torch.arange(37), storage)
    idx = torch.tensor([3, 5, 3, 36])
    pr = torch.tensor([2.0, 0.5, 4.0, 1.5])
    cpu.update_priority(idx, pr)
    dev.update_priority(idx.cuda(), pr.cuda())
    torch.testing.assert_close(dev.priority(torch.arange(37)).cpu(), cpu.priority(torch.arange(37)))
    index, info = dev.sample(storage, 64)
    assert index.is_cuda and info[WEIGHT_KEY].is_cuda
