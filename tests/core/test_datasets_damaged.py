"""Damaged offline datasets (issue 39, item 7): a truncated, bit-flipped or partially
written D4RL / Minari file is refused with :class:`DatasetFormatError` naming the file (and
the key), never a bare h5py error, and a declared row count that differs from the data is
refused with both numbers. The files are real HDF5 files written in ``tmp_path``."""

from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import pytest
import torch

torch.set_num_threads(1)
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning:minari")

h5py = pytest.importorskip("h5py", reason='needs h5py: pip install "packages/core[offline]"')

from tdrl.core.datasets import (DatasetFormatError, load_d4rl, load_minari,  # noqa: E402
                                read_d4rl, read_minari, write_d4rl, write_minari)
from tdrl.core.replay import TensorStorage  # noqa: E402

needs_minari = pytest.mark.skipif(importlib.util.find_spec("minari") is None,
                                  reason='needs minari: pip install "packages/core[offline]"')


def _transitions(n_episodes: int = 3, steps: int = 7):
    """Hand-made Pendulum-shaped episodes ``[n_episodes * steps]`` with distinct values."""
    from tensordict import TensorDict

    n = n_episodes * steps
    obs = torch.arange(n * 3, dtype=torch.float32).view(n, 3)
    done = torch.zeros(n, 1, dtype=torch.bool)
    done[steps - 1::steps] = True
    return TensorDict({
        "observation": obs, "action": torch.linspace(-2, 2, n).view(n, 1),
        "episode": torch.arange(n) // steps,
        "next": {"observation": obs + 0.5, "reward": -torch.arange(n, dtype=torch.float32).view(n, 1),
                 "done": done, "terminated": torch.zeros_like(done), "truncated": done.clone()},
    }, [n])


def _flip(src, dst, pos: int) -> None:
    data = bytearray(open(src, "rb").read())
    data[pos] ^= 0x10
    open(dst, "wb").write(bytes(data))


# ----------------------------------------------------------------------------- D4RL
def test_d4rl_truncated_file_is_refused_naming_it(tmp_path):
    path = tmp_path / "d.hdf5"
    write_d4rl(_transitions(), path)
    os.truncate(path, os.path.getsize(path) // 2)
    with pytest.raises(DatasetFormatError, match=rf"'{path}' is not an HDF5 file or is damaged "
                                                 r"\(truncated.*truncated file: eof = \d+"):
        read_d4rl(path)
    with pytest.raises(DatasetFormatError, match=str(path)):
        load_d4rl(path)


def test_d4rl_bit_flips_name_the_file_and_the_key(tmp_path):
    """A flipped bit anywhere in the metadata (superblock, object headers, symbol tables:
    the first 2 KiB) either still reads or is refused naming the file; none escapes as
    h5py's KeyError / RuntimeError / OSError."""
    good = tmp_path / "good.hdf5"
    write_d4rl(_transitions(), good)
    bad = tmp_path / "flipped.hdf5"
    named_keys, refused = set(), 0
    for pos in range(0, 2048, 3):
        _flip(good, bad, pos)
        try:
            read_d4rl(bad)
        except DatasetFormatError as err:
            refused += 1
            assert str(bad) in str(err), (pos, str(err))
            for key in ("observations", "next_observations", "actions", "rewards", "terminals",
                        "timeouts"):
                if f"cannot read '/{key}'" in str(err):
                    named_keys.add(key)
    assert refused >= 50, refused
    assert len(named_keys) >= 4, named_keys  # the damaged entry is named, not just the file


def _d4rl_arrays(n: int = 8) -> dict:
    return {"observations": np.arange(n * 3, dtype=np.float32).reshape(n, 3),
            "actions": np.zeros((n, 1), np.float32), "rewards": np.ones(n, np.float32),
            "terminals": np.zeros(n, bool), "timeouts": np.eye(1, n, n - 1, dtype=bool)[0]}


@pytest.mark.parametrize("chunked", [False, True])
def test_d4rl_header_declaring_more_rows_than_stored_is_refused(tmp_path, chunked):
    """A writer that died after the header: ``observations`` declares 8 rows, the file
    stores 4 (chunked) or none (contiguous). h5py reads the rest as zeros without a word."""
    path = tmp_path / "partial.hdf5"
    with h5py.File(path, "w") as f:
        for name, arr in _d4rl_arrays().items():
            if name != "observations":
                f[name] = arr
        if chunked:
            ds = f.create_dataset("observations", shape=(8, 3), dtype=np.float32, chunks=(2, 3))
            ds[:4] = _d4rl_arrays()["observations"][:4]
        else:
            f.create_dataset("observations", shape=(8, 3), dtype=np.float32)
    with h5py.File(path) as f:  # what a plain reader sees: zeros, no error
        assert np.asarray(f["observations"][7]).tolist() == [0.0, 0.0, 0.0]
    held = 4 if chunked else 0
    msg = rf"{path}: '/observations' declares 8 rows in its header but the file stores {held}"
    with pytest.raises(DatasetFormatError, match=msg):
        read_d4rl(path)
    with pytest.raises(DatasetFormatError, match=msg):
        load_d4rl(path, TensorStorage(8))


def test_d4rl_whole_file_still_reads(tmp_path):
    """The checks refuse nothing that is whole: the same file fully written reads back."""
    path = tmp_path / "whole.hdf5"
    with h5py.File(path, "w") as f:
        for name, arr in _d4rl_arrays().items():
            f.create_dataset(name, data=arr, chunks=True if name == "observations" else None)
    td = read_d4rl(path)
    assert td.shape == (7,)  # the timeout row has no next observation in the file: dropped
    assert td["observation"][6].tolist() == [18.0, 19.0, 20.0]


# ----------------------------------------------------------------------------- Minari
@pytest.fixture
def minari_dataset(tmp_path, monkeypatch):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    from gymnasium.spaces import Box

    write_minari(_transitions(), "tdrl/damaged-v0", data_format="hdf5",
                 observation_space=Box(-np.inf, np.inf, (3,), np.float32),
                 action_space=Box(-2, 2, (1,), np.float32))
    data = tmp_path / "minari" / "tdrl" / "damaged-v0" / "data"
    assert read_minari("tdrl/damaged-v0").shape == (21,)
    return data


@needs_minari
def test_minari_metadata_total_steps_is_compared_with_the_data(minari_dataset):
    meta = minari_dataset / "metadata.json"
    info = json.loads(meta.read_text())
    info["total_steps"] = 30
    meta.write_text(json.dumps(info))
    msg = r"main_data.hdf5: the dataset's metadata declares total_steps=30 but its episodes hold 21"
    with pytest.raises(DatasetFormatError, match=msg):
        read_minari("tdrl/damaged-v0")
    storage = TensorStorage(30)
    with pytest.raises(DatasetFormatError, match=msg):
        load_minari("tdrl/damaged-v0", storage)
    assert len(storage) == 0  # refused before anything was written


@needs_minari
def test_minari_episode_total_steps_is_compared_with_its_rewards(minari_dataset):
    with h5py.File(minari_dataset / "main_data.hdf5", "a") as f:
        f["episode_1"].attrs["total_steps"] = 9
    with pytest.raises(DatasetFormatError, match=r"main_data.hdf5: episode_1 declares "
                                                 r"total_steps=9 but its rewards hold 7 steps"):
        read_minari("tdrl/damaged-v0")


@needs_minari
def test_minari_truncated_and_bit_flipped_files_name_the_file(minari_dataset):
    main = minari_dataset / "main_data.hdf5"
    good = main.read_bytes()
    os.truncate(main, len(good) // 2)
    with pytest.raises(DatasetFormatError, match=rf"'{main}' is not an HDF5 file or is damaged"):
        read_minari("tdrl/damaged-v0")
    refused = 0
    for pos in range(0, min(len(good), 6144), 5):
        data = bytearray(good)
        data[pos] ^= 0x10
        main.write_bytes(bytes(data))
        try:
            read_minari("tdrl/damaged-v0")
        except DatasetFormatError as err:
            refused += 1
            assert str(main) in str(err), (pos, str(err))
    assert refused >= 50, refused
