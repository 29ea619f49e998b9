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


def counting_updates(rb):
    """Wrap the buffer's sampler.update_priority to count the tree updates it makes."""
    calls = []
    inner = rb.sampler.update_priority

    def update(index, priority):
        calls.append(int(torch.as_tensor(index).numel()))
        return inner(index, priority)

    rb.sampler.update_priority = update
    return calls


def priority_script(seed, n_calls, cap):
    """update_priority arguments with duplicates within and across calls, mixed forms."""
    g = torch.Generator().manual_seed(seed)
    script = []
    for c in range(n_calls):
        k = 1 + c % 9
        index = torch.randint(0, cap, (k,), generator=g)
        if c % 4 == 0:
            script.append((index, float(c % 5) + 0.25))  # one priority for every index
        elif c % 4 == 1:
            script.append((index.reshape(-1, 1), torch.rand(k, 1, generator=g) * 4))
        else:
            script.append((index, torch.rand(k, generator=g) * 4))
    return script


def test_queued_priority_updates_are_applied_as_one_with_the_synchronous_result():
    cap = 40
    sync = PrioritizedReplayBuffer(0.6, 0.4, storage=TensorStorage(cap))
    sync.extend(batch(cap))
    script = priority_script(5, 25, cap)
    for index, priority in script:
        sync.update_priority(index, priority)
    with AsyncPrioritizedReplayBuffer(0.6, 0.4, storage=TensorStorage(cap), queue_size=64) as rb:
        rb.extend(batch(cap))
        rb.flush()
        calls = counting_updates(rb)
        with rb._state.lock:  # hold the writer back: all 25 calls are queued together
            for index, priority in script:
                rb.update_priority(index, priority)
        rb.flush()
        assert calls == [sum(int(i.numel()) for i, _ in script)]  # one merged tree update
        all_ = torch.arange(cap)
        assert torch.equal(rb.sampler.priority(all_), sync.sampler.priority(all_))
        assert rb.sampler.state_dict()["max_priority"] == sync.sampler.state_dict()["max_priority"]
        for seed in range(3):  # the same draws and weights after the flush
            torch.manual_seed(seed)
            a = sync.sample(64)
            torch.manual_seed(seed)
            b = rb.sample(64)
            assert torch.equal(a["index"], b["index"]) and torch.equal(a["_weight"], b["_weight"])


def test_a_bad_update_among_queued_ones_fails_alone():
    cap = 20
    sync = PrioritizedReplayBuffer(1.0, 0.4, storage=TensorStorage(cap))
    sync.extend(batch(cap))
    good = priority_script(7, 6, cap)
    for index, priority in good:
        sync.update_priority(index, priority)
    rb = AsyncPrioritizedReplayBuffer(1.0, 0.4, storage=TensorStorage(cap))
    rb.extend(batch(cap))
    rb.flush()
    with rb._state.lock:
        for j, (index, priority) in enumerate(good):
            rb.update_priority(index, priority)
            if j == 2:  # a non-finite priority in the middle of the run
                rb.update_priority(torch.tensor([0, 1]), torch.tensor([1.0, float("nan")]))
    with pytest.raises(RuntimeError, match="asynchronous update_priority failed") as info:
        rb.flush()
    assert "non-finite" in str(info.value.__cause__)
    all_ = torch.arange(cap)
    assert torch.equal(rb.sampler.priority(all_), sync.sampler.priority(all_))
    rb.close()
