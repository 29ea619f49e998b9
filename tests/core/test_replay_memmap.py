"""Memory-mapped storage: reopen after a real ``kill -9`` with every completed write intact."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import torch
from tensordict import TensorDict

from tdrl.core.replay import MemmapStorage, PrioritizedReplayBuffer, ReplayBuffer

WIDTH = 4096  # large rows so that the kill often lands in the middle of a write

CHILD = textwrap.dedent(
    """
    import sys, torch
    from tensordict import TensorDict
    from tdrl.core.replay import MemmapStorage, ReplayBuffer
    rb = ReplayBuffer(MemmapStorage(64, scratch_dir=sys.argv[1]))
    k = 0
    while True:
        i = torch.arange(8 * k, 8 * k + 8, dtype=torch.float32)
        rb.extend(TensorDict({"obs": i[:, None].expand(8, %d).clone(),
                              "next": {"n": i + 1}}, [8]))
        print(k, flush=True)
        k += 1
    """
    % WIDTH
)


def _items(start, n):
    i = torch.arange(start, start + n, dtype=torch.float32)
    return TensorDict({"obs": i[:, None].expand(n, WIDTH).clone(), "next": {"n": i + 1}}, [n])


def _assert_consistent(storage):
    data = storage.get(torch.arange(len(storage)))
    item = data["obs"][:, 0]
    assert (data["obs"] == item[:, None]).all(), "a stored row is torn"
    assert (data["next", "n"] == item + 1).all(), "keys of one item disagree"
    return set(item.long().tolist())


def test_kill9_mid_run_reopens_with_completed_writes(tmp_path):
    scratch = tmp_path / "rb"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(scratch)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        last = -1
        deadline = time.monotonic() + 60
        while last < 30 and time.monotonic() < deadline:  # 31 batches: the ring wrapped 3x
            line = proc.stdout.readline()
            assert line, proc.stderr.read()
            last = int(line)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    assert last >= 30
    storage = MemmapStorage(64, scratch_dir=scratch)
    assert len(storage) > 0
    present = _assert_consistent(storage)
    # the last batch reported complete is there, unless later batches (written after the
    # report, before the kill) already pushed it out of the ring: 64 slots = 8 batches
    newest = max(present) // 8
    assert newest >= last
    if newest - last < 7:
        assert set(range(8 * last, 8 * last + 8)) <= present
    # the reopened buffer keeps working where the writer stopped
    rb = ReplayBuffer(storage, batch_size=16)
    before = len(rb)
    rb.extend(_items(10_000, 8))
    assert len(rb) == min(64, before + 8)
    assert {10_000 + j for j in range(8)} <= _assert_consistent(rb.storage)


def test_reopen_after_clean_exit_restores_cursor(tmp_path):
    rb = ReplayBuffer(MemmapStorage(10, scratch_dir=tmp_path))
    rb.extend(_items(0, 7))
    rb.extend(_items(7, 5))  # wraps: cursor 2
    del rb
    st = MemmapStorage(10, scratch_dir=tmp_path)
    assert len(st) == 10 and st.cursor == 2
    assert _assert_consistent(st) == set(range(2, 12))
    # a prioritized buffer over the reopened storage gives its items the max priority
    prb = PrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=st, batch_size=4)
    assert torch.allclose(prb.sampler.priority(torch.arange(10)), torch.ones(10, dtype=torch.float64))
    assert prb.sample()["obs"].shape == (4, WIDTH)


def test_reopen_drops_slots_that_were_mid_overwrite(tmp_path):
    st = MemmapStorage(8, scratch_dir=tmp_path)
    st.set(slice(0, 8), _items(0, 8))
    st.cursor = 0
    # simulate a crash while overwriting slots 2 and 3: metadata marks them dirty and the
    # rows are torn
    st._write_meta(dirty=[2, 3])
    st._leaves[("obs",)][2, :10] = -1.0
    st._leaves[("obs",)][3, :] = -1.0
    del st
    st = MemmapStorage(8, scratch_dir=tmp_path)
    assert len(st) == 6
    assert _assert_consistent(st) == {0, 1, 4, 5, 6, 7}


def test_memmap_rejects_other_size(tmp_path):
    MemmapStorage(4, scratch_dir=tmp_path).set(slice(0, 1), _items(0, 1))
    try:
        MemmapStorage(5, scratch_dir=tmp_path)
    except ValueError as err:
        assert "max_size 4" in str(err)
    else:
        raise AssertionError("expected a ValueError")
