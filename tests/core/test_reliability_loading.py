"""Replay folders are loaded as data only: crafted pickles are refused and never run.

The payload is a pickle whose unpickling creates a marker file; each test first proves
that the payload is live (``pickle.loads`` creates the marker), then places it where a
loader reads and checks that the loader refuses with ``ReplayFormatError`` and that the
marker does not appear.
"""

from __future__ import annotations

import json
import os
import pathlib
import pickle

import pytest
import torch
from tensordict import NonTensorData, TensorDict

from tdrl.core.replay import (MemmapStorage, ReplayBuffer, ReplayFormatError, TensorStorage)
from tdrl.core.replay.memmap import META_FILE


class _Evil:
    def __init__(self, marker: pathlib.Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (self.marker,))


@pytest.fixture
def marker(tmp_path):
    path = tmp_path / "PWNED"
    pickle.loads(pickle.dumps(_Evil(path)))  # the payload is live
    assert path.exists()
    path.unlink()
    return path


def _items(n=4):
    i = torch.arange(n)
    return TensorDict({"obs": i[:, None].float().expand(n, 3).clone(), "id": i}, [n])


def _tensordict_memmap_with_pickle(folder: pathlib.Path, marker: pathlib.Path) -> None:
    """A folder as tensordict's memmap writes it, with a pickled non-tensor field."""
    td = TensorDict({"obs": torch.zeros(4, 3), "x": NonTensorData(_Evil(marker), batch_size=[4])},
                    [4])
    td.memmap(prefix=str(folder))


def test_memmap_reopen_refuses_a_tensordict_memmap_with_pickle(tmp_path, marker):
    scratch = tmp_path / "rb"
    _tensordict_memmap_with_pickle(scratch, marker)
    # the metadata the earlier MemmapStorage wrote next to it
    (scratch / META_FILE).write_text(json.dumps({"max_size": 4, "len": 4, "cursor": 0,
                                                 "is_tensor": False, "dirty": None}))
    with pytest.raises(ReplayFormatError, match="format None.*can run code"):
        MemmapStorage(4, scratch_dir=scratch)
    assert not marker.exists()


def test_memmap_reopen_refuses_pickled_metadata(tmp_path, marker):
    scratch = tmp_path / "rb"
    MemmapStorage(4, scratch_dir=scratch).set(slice(0, 4), _items())
    (scratch / META_FILE).write_bytes(pickle.dumps(_Evil(marker)))
    with pytest.raises(ReplayFormatError, match="not valid JSON"):
        MemmapStorage(4, scratch_dir=scratch)
    assert not marker.exists()


def test_loads_refuses_pickled_state(tmp_path, marker):
    rb = ReplayBuffer(TensorStorage(8))
    rb.extend(_items())
    rb.dumps(tmp_path / "d")
    (state,) = (tmp_path / "d").glob("dump_*/state.pt")
    torch.save({"storage": {"len": 4, "cursor": 4, "data": None, "x": _Evil(marker)}}, state)
    with pytest.raises(ReplayFormatError, match="weights_only=True"):
        ReplayBuffer(TensorStorage(8)).loads(tmp_path / "d")
    assert not marker.exists()


def test_loads_refuses_an_older_dump_folder(tmp_path, marker):
    """The layout ReplayBuffer.dumps wrote before: state.pt + a tensordict memmap folder."""
    folder = tmp_path / "d"
    folder.mkdir()
    torch.save({"storage": {"len": 4, "cursor": 0, "data": "memmap"}, "sampler": {},
                "writer": {}, "x": _Evil(marker)}, folder / "state.pt")
    _tensordict_memmap_with_pickle(folder / "storage", marker)
    with pytest.raises(ReplayFormatError, match="older tdrl"):
        ReplayBuffer(TensorStorage(8)).loads(folder)
    assert not marker.exists()


def test_loads_refuses_pickle_in_the_storage_half(tmp_path, marker):
    rb = ReplayBuffer(TensorStorage(8))
    rb.extend(_items())
    rb.dumps(tmp_path / "d")
    (leaves,) = (tmp_path / "d").glob("dump_*/storage/leaves.json")
    leaves.write_bytes(pickle.dumps(_Evil(marker)))
    with pytest.raises(ReplayFormatError, match="not valid JSON"):
        ReplayBuffer(TensorStorage(8)).loads(tmp_path / "d")
    # a leaf description naming a file outside the folder, or a dtype not in the list
    meta = {"format": "tdrl-leaves-1", "rows": 4,
            "leaves": [{"key": ["obs"], "dtype": "float32", "shape": [3], "file": "../x.bin"}]}
    leaves.write_text(json.dumps(meta))
    with pytest.raises(ReplayFormatError, match="malformed leaf"):
        ReplayBuffer(TensorStorage(8)).loads(tmp_path / "d")
    meta["leaves"][0].update(file="leaf_0.bin", dtype="object")
    leaves.write_text(json.dumps(meta))
    with pytest.raises(ReplayFormatError, match="dtype 'object'"):
        ReplayBuffer(TensorStorage(8)).loads(tmp_path / "d")
    assert not marker.exists()


def test_memmap_refuses_len_above_max_size_at_open(tmp_path):
    scratch = tmp_path / "rb"
    MemmapStorage(4, scratch_dir=scratch).set(slice(0, 4), _items())
    meta = json.loads((scratch / META_FILE).read_text())
    meta["len"] = 9
    (scratch / META_FILE).write_text(json.dumps(meta))
    with pytest.raises(ReplayFormatError, match=r"len=9, expected an integer in \[0, 4\]"):
        MemmapStorage(4, scratch_dir=scratch)


def test_memmap_refuses_truncated_data_file(tmp_path):
    scratch = tmp_path / "rb"
    MemmapStorage(4, scratch_dir=scratch).set(slice(0, 4), _items())
    (leaf,) = [p for p in scratch.glob("gen_*/leaf_*.bin") if p.stat().st_size == 48]
    os.truncate(leaf, 20)
    with pytest.raises(ReplayFormatError, match="truncated"):
        MemmapStorage(4, scratch_dir=scratch)


def test_dumps_round_trip_of_memmap_and_list_storages(tmp_path):
    rb = ReplayBuffer(MemmapStorage(8, scratch_dir=tmp_path / "a"))
    rb.extend(_items(6))
    rb.dumps(tmp_path / "d")
    rb.extend(_items(6))  # a second dump replaces the first
    rb.dumps(tmp_path / "d")
    assert sorted(os.listdir(tmp_path / "d")) == ["CURRENT.json", "dump_2"]
    other = ReplayBuffer(MemmapStorage(8, scratch_dir=tmp_path / "b"))
    other.loads(tmp_path / "d")
    assert len(other) == 8 and other.storage.cursor == 4
    assert other.storage.get(slice(0, 8))["id"].tolist() == [2, 3, 4, 5, 4, 5, 0, 1]
    # and the memmap copy persists: a reopen of its folder sees the loaded items
    again = MemmapStorage(8, scratch_dir=tmp_path / "b")
    assert again.get(slice(0, 8))["id"].tolist() == rb.storage.get(slice(0, 8))["id"].tolist()
