"""Replay buffer: storages, writers, bad input, state save/load."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdrl.core.replay import (
    ListStorage,
    MaxValueWriter,
    PrioritizedReplayBuffer,
    ReplayBuffer,
    SamplerWithoutReplacement,
    TensorStorage,
)


def _batch(start: int, n: int) -> TensorDict:
    """Items whose every entry encodes the item number, so reads can be checked exactly."""
    i = torch.arange(start, start + n, dtype=torch.float32)
    return TensorDict(
        {
            "observation": i[:, None].expand(n, 3).clone(),
            "action": i.long(),
            "next": {"reward": i[:, None], "done": (i % 5 == 4)[:, None]},
        },
        [n],
    )


def test_tensor_storage_round_robin_overwrites_oldest():
    rb = ReplayBuffer(TensorStorage(10), batch_size=4)
    idx = rb.extend(_batch(0, 6))
    assert idx.tolist() == [0, 1, 2, 3, 4, 5]
    idx = rb.extend(_batch(6, 7))  # wraps: items 6..9 -> slots 6..9, 10..12 -> slots 0..2
    assert idx.tolist() == [6, 7, 8, 9, 0, 1, 2]
    assert len(rb) == 10
    stored = rb.storage.get(torch.arange(10))
    assert stored["action"].tolist() == [10, 11, 12, 3, 4, 5, 6, 7, 8, 9]
    assert rb.storage.cursor == 3


def test_batch_larger_than_storage_keeps_last_items():
    rb = ReplayBuffer(TensorStorage(4))
    idx = rb.extend(_batch(0, 6))
    assert idx.tolist() == [-1, -1, 0, 1, 2, 3]
    assert rb.storage.get(torch.arange(4))["action"].tolist() == [2, 3, 4, 5]


def test_sample_returns_consistent_items_and_index():
    torch.manual_seed(0)
    rb = ReplayBuffer(TensorStorage(100), batch_size=32)
    rb.extend(_batch(0, 50))
    s = rb.sample()
    assert s.batch_size == (32,)
    assert (s["observation"][:, 0] == s["action"].float()).all()
    assert (s["next", "reward"][:, 0] == s["action"].float()).all()
    assert (s["index"] == s["action"]).all()  # item k sits in slot k
    assert s["action"].max() < 50


def test_add_single_item_and_rollout_flattening():
    rb = ReplayBuffer(TensorStorage(20))
    assert rb.add(_batch(7, 1)[0]) == 0
    rollout = _batch(0, 6).reshape(2, 3)  # (n_envs, T)
    idx = rb.extend(rollout)
    assert idx.tolist() == [1, 2, 3, 4, 5, 6]
    assert rb.storage.get(torch.arange(7))["action"].tolist() == [7, 0, 1, 2, 3, 4, 5]


def test_plain_tensor_storage():
    rb = ReplayBuffer(TensorStorage(8), batch_size=5)
    rb.extend(torch.arange(12).reshape(6, 2))
    s = rb.sample()
    assert isinstance(s, torch.Tensor) and s.shape == (5, 2)
    assert (s[:, 1] == s[:, 0] + 1).all()


def test_list_storage_any_objects():
    torch.manual_seed(0)
    rb = ReplayBuffer(ListStorage(3), batch_size=4)
    rb.extend(["a", {"b": 1}, 3])
    rb.add("d")  # overwrites "a"
    assert len(rb) == 3
    s = rb.sample()
    assert len(s) == 4 and all(x in ("d", 3) or x == {"b": 1} for x in s)
    # TensorDict items are stacked back into a batch.
    rb2 = ReplayBuffer(ListStorage(10), batch_size=3)
    rb2.extend(_batch(0, 4))
    out = rb2.sample()
    assert isinstance(out, TensorDict) and out.batch_size == (3,)
    assert (out["observation"][:, 0] == out["action"].float()).all()


def test_extend_wrong_key_names_the_key():
    rb = ReplayBuffer(TensorStorage(10))
    rb.extend(_batch(0, 2))
    bad = _batch(0, 2)
    del bad["next", "reward"]
    with pytest.raises(KeyError, match=r"\('next', 'reward'\)"):
        rb.extend(bad)
    extra = _batch(0, 2).set("other", torch.zeros(2))
    with pytest.raises(KeyError, match="'other'"):
        rb.extend(extra)


def test_extend_wrong_shape_names_the_key():
    rb = ReplayBuffer(TensorStorage(10))
    rb.extend(_batch(0, 2))
    bad = _batch(0, 2)
    bad["observation"] = torch.zeros(2, 4)
    with pytest.raises(ValueError, match=r"'observation'.*\(3,\).*\(4,\)"):
        rb.extend(bad)


def test_without_replacement_epochs_and_oversampling_raises():
    torch.manual_seed(0)
    rb = ReplayBuffer(TensorStorage(20), SamplerWithoutReplacement(), batch_size=4)
    rb.extend(_batch(0, 10))
    seen = [b["action"] for b in rb]  # iterates one epoch
    assert [len(b) for b in seen] == [4, 4, 2]
    assert sorted(torch.cat(seen).tolist()) == list(range(10))
    with pytest.raises(ValueError, match="without replacement"):
        rb.sample(11)
    rb_drop = ReplayBuffer(TensorStorage(20), SamplerWithoutReplacement(drop_last=True),
                           batch_size=4)
    rb_drop.extend(_batch(0, 10))
    assert [len(b["action"]) for b in rb_drop] == [4, 4]


def test_sample_empty_buffer_raises():
    with pytest.raises(RuntimeError, match="empty"):
        ReplayBuffer(TensorStorage(4), batch_size=2).sample()


def test_max_value_writer_keeps_highest_ranked():
    rb = ReplayBuffer(TensorStorage(4), writer=MaxValueWriter(rank_key=("next", "reward")))
    rb.extend(_batch(0, 3))  # ranks 0, 1, 2 -> fill slots 0..2
    idx = rb.extend(_batch(10, 1))  # rank 10 -> free slot 3
    assert idx.tolist() == [3]
    rewards = torch.tensor([[5.0], [-1.0], [7.0]])
    new = _batch(20, 3)
    new["next", "reward"] = rewards
    idx = rb.extend(new)  # 5 and 7 evict ranks 0 and 1; -1 is dropped
    assert idx[1] == -1 and sorted(idx[[0, 2]].tolist()) == [0, 1]
    kept = sorted(rb.storage.get(torch.arange(4))["next", "reward"].squeeze(-1).tolist())
    assert kept == [2.0, 5.0, 7.0, 10.0]


def test_transform_applied_on_sample():
    rb = ReplayBuffer(TensorStorage(10), batch_size=3,
                      transform=lambda td: td.set("double", td["observation"] * 2))
    rb.extend(_batch(0, 5))
    s = rb.sample()
    assert (s["double"] == 2 * s["observation"]).all()


def test_tensor_storage_device_and_lazy_allocation():
    st = TensorStorage(10, device="cpu")
    assert not st.initialized
    st.set(slice(0, 2), _batch(0, 2))
    assert st.initialized and st._data.batch_size == (10,)
    assert st._data["observation"].dtype == torch.float32


def test_state_dict_roundtrip_with_priorities():
    torch.manual_seed(0)
    rb = PrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=TensorStorage(16), batch_size=8)
    rb.extend(_batch(0, 12))
    rb.update_priority(torch.arange(12), torch.arange(12.0) + 1)
    rb2 = PrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=TensorStorage(16), batch_size=8)
    rb2.load_state_dict(rb.state_dict())
    assert len(rb2) == 12 and rb2.storage.cursor == 12
    torch.manual_seed(1)
    a = rb.sample()
    torch.manual_seed(1)
    b = rb2.sample()
    assert (a == b).all()


def test_dumps_loads(tmp_path):
    torch.manual_seed(0)
    rb = PrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=TensorStorage(32), batch_size=4)
    rb.extend(_batch(0, 20))
    s = rb.sample()
    s["td_error"] = torch.full((4,), 3.0)
    rb.update_priority(s)
    rb.dumps(tmp_path / "rb")
    rb2 = PrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=TensorStorage(32), batch_size=4)
    rb2.loads(tmp_path / "rb")
    assert len(rb2) == 20
    assert (rb2.storage.get(torch.arange(20))["action"] == torch.arange(20)).all()
    assert torch.equal(rb2.sampler.priority(torch.arange(20)), rb.sampler.priority(torch.arange(20)))
    # list storages dump their items too
    lb = ReplayBuffer(ListStorage(5))
    lb.extend(["x", "y"])
    lb.dumps(tmp_path / "lb")
    lb2 = ReplayBuffer(ListStorage(5))
    lb2.loads(tmp_path / "lb")
    assert lb2.storage.get(slice(0, 2)) == ["x", "y"]
