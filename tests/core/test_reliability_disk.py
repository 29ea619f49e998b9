"""A full disk is an ``OSError`` naming the file and the bytes needed, never a SIGBUS or
torch's "unexpected pos": for memmap storages, replay dumps and checkpoints; the previous
dump and checkpoint stay loadable. Leaf files are never read or written through a symlink,
and a flipped bit in a checkpoint is refused by its checksum.

As root a small tmpfs is mounted for the test (a real ENOSPC from the kernel); elsewhere
``posix_fallocate`` is made to fail with ENOSPC, which is what the kernel returns."""

from __future__ import annotations

import errno
import os
import subprocess

import pytest
import torch
from tensordict import TensorDict

from tdrl.core.diskio import DiskFullError
from tdrl.core.replay import MemmapStorage, ReplayBuffer, TensorStorage
from tdrl.core.replay._files import ReplayFormatError
from tdrl.core.train.checkpoint import Checkpointer, ChecksumError, load_checkpoint, save_checkpoint


@pytest.fixture
def small_disk(tmp_path, monkeypatch):
    """A folder on a 2 MiB file system (a real tmpfs as root, else a failing fallocate)."""
    folder = tmp_path / "disk"
    folder.mkdir()
    mounted = os.geteuid() == 0 and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(folder)], capture_output=True).returncode == 0
    if not mounted:
        real = os.posix_fallocate

        def fallocate(fd, offset, length):
            if offset + length > 2 << 20:
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(fd, offset, length)

        monkeypatch.setattr(os, "posix_fallocate", fallocate)
    yield folder
    if mounted:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def _items(n: int, width: int) -> TensorDict:
    return TensorDict({"obs": torch.arange(n * width, dtype=torch.float32).view(n, width)}, batch_size=[n])


def test_memmap_storage_on_a_full_disk_names_the_file(small_disk):
    storage = MemmapStorage(10_000, scratch_dir=small_disk / "rb")
    with pytest.raises(DiskFullError, match=r"no space left.*leaf_.*needs 40,000,000 bytes") as info:
        storage.set(torch.arange(4), _items(4, 1000))  # 10k slots x 1000 floats = 40 MB
    assert info.value.errno == errno.ENOSPC and str(small_disk) in str(info.value)


def test_a_dump_on_a_full_disk_keeps_the_previous_one(small_disk):
    path = small_disk / "dump"
    small = ReplayBuffer(TensorStorage(100))
    small.extend(_items(100, 10))  # 4 kB: fits
    small.dumps(path)
    big = ReplayBuffer(TensorStorage(1000))
    big.extend(_items(1000, 1000))  # 4 MB: does not
    with pytest.raises(DiskFullError, match="no space left"):
        big.dumps(path)
    assert sorted(p.name for p in path.iterdir()) == ["CURRENT.json", "dump_1"]  # the partial dump is gone
    back = ReplayBuffer(TensorStorage(100))
    back.loads(path)
    assert torch.equal(back.storage.get(torch.arange(100))["obs"], _items(100, 10)["obs"])


def test_a_checkpoint_on_a_full_disk_keeps_the_previous_one(small_disk):
    ckpt = Checkpointer(small_disk / "ckpt")
    ckpt.save(1, extra={"w": torch.ones(10)})
    with pytest.raises(DiskFullError, match=r"step_2\.pt.*needs") as info:
        ckpt.save(2, extra={"w": torch.ones(1_000_000)})  # 4 MB
    assert "unexpected pos" not in str(info.value)
    assert [p.name for p in ckpt.checkpoints()] == ["step_1.pt"]
    assert not [p for p in (small_disk / "ckpt").iterdir() if p.name.endswith(".tmp")]
    assert torch.equal(ckpt.load()["extra"]["w"], torch.ones(10))


def test_a_flipped_bit_in_a_checkpoint_is_refused(tmp_path):
    path = save_checkpoint(tmp_path / "step_1.pt", {"w": torch.arange(1000, dtype=torch.float32)})
    raw = bytearray(path.read_bytes())
    # flip one bit inside the tensor's bytes (a float in the middle of the data record)
    at = raw.find(torch.tensor([500.0]).numpy().tobytes())
    assert at > 0
    raw[at] ^= 0x01
    path.write_bytes(bytes(raw))
    with pytest.raises(ChecksumError, match="step_1.pt does not match its checksum"):
        load_checkpoint(path)
    os.unlink(str(path) + ".sha256")  # a checkpoint without its checksum still loads (older tdrl)
    assert load_checkpoint(path)["w"][500].item() != 500.0


def test_a_symlinked_leaf_is_not_written_through(tmp_path):
    scratch = tmp_path / "rb"
    storage = MemmapStorage(8, scratch_dir=scratch)
    storage.set(torch.arange(2), _items(2, 3))
    del storage
    victim = tmp_path / "victim.bin"
    victim.write_bytes(b"\0" * (8 * 3 * 4))
    leaf = next(p for p in scratch.rglob("leaf_*.bin"))
    leaf.unlink()
    leaf.symlink_to(victim)
    with pytest.raises(ReplayFormatError, match="is a symlink"):
        MemmapStorage(8, scratch_dir=scratch)
    assert victim.read_bytes() == b"\0" * (8 * 3 * 4)


@pytest.mark.parametrize("async_writes", [False, True])
def test_a_flipped_bit_in_a_dumped_leaf_is_refused(tmp_path, async_writes):
    """``dumps(checksum=True)`` records every file's SHA-256; ``loads`` verifies them and
    names the damaged leaf (without a checksum the flip loads silently)."""
    from tdrl.core.replay import AsyncPrioritizedReplayBuffer, ChecksumError as ReplayChecksumError

    assert ReplayChecksumError is ChecksumError  # one class, one home (tdrl.core.diskio)

    def make():
        if async_writes:
            return AsyncPrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=TensorStorage(100))
        return ReplayBuffer(TensorStorage(100))

    rb = make()
    rb.extend(_items(100, 10))
    rb.dumps(tmp_path / "plain")
    rb.dumps(tmp_path / "summed", checksum=True)
    rb.dumps(tmp_path / "ok", checksum=True)
    for name in ("plain", "summed"):
        leaf = next((tmp_path / name).rglob("leaf_0.bin"))
        raw = bytearray(leaf.read_bytes())
        raw[123] ^= 0x04
        leaf.write_bytes(bytes(raw))
    back = make()
    back.loads(tmp_path / "plain")  # no checksum: the flip goes unseen
    assert not torch.equal(back.storage.get(torch.arange(100))["obs"], _items(100, 10)["obs"])
    with pytest.raises(ChecksumError, match=r"storage/leaf_0\.bin does not match its checksum in "
                                            r".*checksums\.json"):
        make().loads(tmp_path / "summed")
    back = make()  # a dump whose files all match loads as written
    back.loads(tmp_path / "ok")
    assert torch.equal(back.storage.get(torch.arange(100))["obs"], _items(100, 10)["obs"])


def test_a_dump_whose_files_differ_from_its_checksum_list_is_refused(tmp_path):
    rb = ReplayBuffer(TensorStorage(10))
    rb.extend(_items(10, 3))
    rb.dumps(tmp_path, checksum=True)
    state = next(tmp_path.rglob("state.pt"))
    state.write_bytes(state.read_bytes()[:-1] + bytes([state.read_bytes()[-1] ^ 1]))
    with pytest.raises(ChecksumError, match=r"state\.pt does not match its checksum"):
        ReplayBuffer(TensorStorage(10)).loads(tmp_path)
    next(tmp_path.rglob("leaf_0.bin")).unlink()
    with pytest.raises(ChecksumError, match=r"lists .*leaf_0\.bin.* but the dump holds"):
        ReplayBuffer(TensorStorage(10)).loads(tmp_path)
