"""AsyncPrioritizedReplayBuffer: same samples as the synchronous buffer after a flush,
writer errors surfaced at the next call, dumps unchanged, no leaked thread."""

from __future__ import annotations

import gc
import threading
import time

import pytest
import torch
from tensordict import TensorDict

from tdrl.core.replay import (
    AsyncPrioritizedReplayBuffer,
    PrioritizedReplayBuffer,
    TensorStorage,
)


def batch(n, start=0):
    return TensorDict({"obs": torch.arange(start, start + n, dtype=torch.float32).unsqueeze(-1),
                       "td_error": torch.zeros(n)}, [n])


def writer_threads():
    return [t for t in threading.enumerate() if t.name == "tdrl-replay-writer" and t.is_alive()]


def drive(rb, seed, rounds=6, cap=50):
    """The same script of extends / samples / priority updates on either buffer."""
    out = []
    g = torch.Generator().manual_seed(seed)
    for r in range(rounds):
        rb.extend(batch(13, start=13 * r))
        torch.manual_seed(seed + r)
        s = rb.sample(32)
        out.append((s["index"].clone(), s["_weight"].clone(), s["obs"].clone()))
        s["td_error"] = torch.rand(32, generator=g) * 3
        rb.update_priority(s)
    return out


@pytest.mark.parametrize("copy", [True, False])
def test_same_indices_as_sync_buffer_on_fixed_seed(copy):
    sync = PrioritizedReplayBuffer(0.7, 0.5, storage=TensorStorage(50))
    with AsyncPrioritizedReplayBuffer(0.7, 0.5, storage=TensorStorage(50), queue_size=2,
                                      copy=copy) as rb:
        a, b = drive(sync, 3), drive(rb, 3)
        for (i1, w1, o1), (i2, w2, o2) in zip(a, b, strict=True):
            assert torch.equal(i1, i2) and torch.equal(w1, w2) and torch.equal(o1, o2)
        rb.flush()
        all_ = torch.arange(50)
        assert torch.equal(rb.sampler.priority(all_), sync.sampler.priority(all_))
        assert len(rb) == len(sync) == 50


def test_distribution_after_flush_matches_priorities():
    """flush_on_sample=False: after an explicit flush, the draws follow q_i / sum q."""
    with AsyncPrioritizedReplayBuffer(1.0, 0.4, storage=TensorStorage(8),
                                      flush_on_sample=False) as rb:
        rb.extend(batch(8))
        pr = torch.tensor([1.0, 2.0, 0.0, 4.0, 8.0, 1.0, 0.5, 0.5])
        rb.update_priority(torch.arange(8), pr)
        rb.flush()
        torch.manual_seed(0)
        idx = rb.sample(100_000)["index"]
    q = pr + 1e-8
    freq = torch.bincount(idx, minlength=8).double() / idx.numel()
    torch.testing.assert_close(freq, q.double() / q.sum(), atol=5e-3, rtol=0)
    # a chi-square statistic well inside what 7 degrees of freedom allow (p ~ 1e-3 at 24)
    expected = (q.double() / q.sum() * idx.numel()).clamp(min=1e-9)
    obs = torch.bincount(idx, minlength=8).double()
    keep = expected > 1
    assert float(((obs - expected) ** 2 / expected)[keep].sum()) < 24.0


def test_writer_error_surfaces_at_next_call_and_later_writes_apply():
    rb = AsyncPrioritizedReplayBuffer(1.0, 0.4, storage=TensorStorage(10))
    rb.extend(batch(4))
    rb.flush()
    with rb._state.lock:  # hold the writer back so that both calls are queued before it runs
        rb.update_priority(torch.tensor([0, 1]), torch.tensor([float("nan"), 1.0]))  # refused in the writer
        rb.update_priority(torch.tensor([2]), torch.tensor([5.0]))  # queued after: still applied
    with pytest.raises(RuntimeError, match="asynchronous update_priority failed") as info:
        rb.sample(4)
    assert isinstance(info.value.__cause__, ValueError)
    assert "non-finite" in str(info.value.__cause__)
    rb.flush()  # reported once, not again
    assert rb.sampler.priority(torch.tensor([2])).item() == pytest.approx(5.0)
    rb.close()


def test_error_is_not_lost_when_the_next_call_is_a_write():
    rb = AsyncPrioritizedReplayBuffer(1.0, 0.4, storage=TensorStorage(10))
    rb.update_priority(torch.tensor([0]), torch.tensor([float("inf")]))
    rb._state.drain()  # applied, error kept for the next call
    with pytest.raises(RuntimeError, match="non-finite"):
        rb.extend(batch(2))
    rb.close()


def test_extend_copies_by_default():
    with AsyncPrioritizedReplayBuffer(1.0, 0.4, storage=TensorStorage(10)) as rb:
        data = batch(3)
        rb.extend(data)
        data["obs"].fill_(-1.0)  # the caller reuses its batch at once
        rb.flush()
        assert rb[:]["obs"].flatten().tolist() == [0.0, 1.0, 2.0]


def test_dumps_hold_every_write_before_the_call(tmp_path):
    sync = PrioritizedReplayBuffer(0.7, 0.5, storage=TensorStorage(30))
    with AsyncPrioritizedReplayBuffer(0.7, 0.5, storage=TensorStorage(30)) as rb:
        drive(sync, 5, rounds=3)
        drive(rb, 5, rounds=3)
        rb.dumps(tmp_path / "a")
    back = PrioritizedReplayBuffer(0.7, 0.5, storage=TensorStorage(30))
    back.loads(tmp_path / "a")
    all_ = torch.arange(30)
    assert torch.equal(back.sampler.priority(all_), sync.sampler.priority(all_))
    assert torch.equal(back[:]["obs"], sync[:]["obs"])


def test_close_stops_the_thread_and_refuses_writes():
    before = len(writer_threads())
    rb = AsyncPrioritizedReplayBuffer(1.0, 0.4, storage=TensorStorage(10))
    assert len(writer_threads()) == before + 1
    rb.extend(batch(2))
    rb.close()
    rb.close()  # idempotent
    assert len(writer_threads()) == before
    assert len(rb) == 2  # the queued write was applied before the stop
    with pytest.raises(RuntimeError, match="closed"):
        rb.extend(batch(1))


def test_garbage_collection_stops_the_thread():
    before = len(writer_threads())
    rb = AsyncPrioritizedReplayBuffer(1.0, 0.4, storage=TensorStorage(10))
    rb.extend(batch(2))
    rb.flush()
    del rb
    gc.collect()
    deadline = time.monotonic() + 5
    while len(writer_threads()) > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(writer_threads()) == before


def test_bad_queue_size_is_refused():
    with pytest.raises(ValueError, match="queue_size must be >= 1"):
        AsyncPrioritizedReplayBuffer(1.0, 0.4, storage=TensorStorage(10), queue_size=0)


def test_writes_apply_in_call_order_whoever_applies_them():
    """The writer thread and flush() both apply queued writes: the last call still wins."""
    with AsyncPrioritizedReplayBuffer(1.0, 0.4, storage=TensorStorage(4), queue_size=3,
                                      eps=0.0) as rb:
        rb.extend(batch(4))
        for v in range(1, 301):
            rb.update_priority(torch.tensor([0, 1]), torch.tensor([float(v), float(301 - v)]))
            if v % 7 == 0:
                rb.flush()
        rb.flush()
        assert rb.sampler.priority(torch.tensor([0, 1])).tolist() == [300.0, 1.0]
