"""Worker processes: no orphans after a ``kill -9`` of the trainer, no silent hangs,
no work started on invalid sizes."""

from __future__ import annotations

import multiprocessing as mp
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
import torch
from tensordict.nn import TensorDictModule

from tdrl.core.collectors import InferenceCollector, MultiAsyncCollector, MultiSyncCollector, WorkerError
from tdrl.core.envs import ParallelEnv, PendulumEnv, SerialEnv

SCRIPT = textwrap.dedent(
    """
    import sys, time, torch
    from tensordict.nn import TensorDictModule
    from tdrl.core.collectors import MultiAsyncCollector, MultiSyncCollector
    from tdrl.core.envs import ParallelEnv, PendulumEnv

    def make():
        return PendulumEnv(batch_size=(2,), max_episode_steps=7)

    if __name__ == "__main__":
        kind = sys.argv[1]
        if kind == "parallel":
            obj = ParallelEnv(3, make)
            obj.rollout(3)
            pids = obj.worker_pids
        else:
            cls = MultiSyncCollector if kind == "sync" else MultiAsyncCollector
            policy = TensorDictModule(torch.nn.Linear(3, 1), ["observation"], ["action"])
            obj = cls(make, policy, num_workers=3, frames_per_batch=12, timeout=120)
            obj.next_batch()
            pids = [p.pid for p in obj.workers]
        print(" ".join(map(str, pids)), flush=True)
        time.sleep(600)
    """
)


def _alive(pids):
    out = []
    for p in pids:
        try:
            if psutil.Process(p).status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.mark.parametrize("kind", ["sync", "async", "parallel"])
def test_workers_exit_when_the_trainer_is_killed(tmp_path, kind):
    script = tmp_path / "trainer.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, str(script), kind], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        pids = [int(p) for p in line.split()]
        assert len(pids) == 3 and len(_alive(pids)) == 3
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        end = time.monotonic() + 10
        while _alive(pids) and time.monotonic() < end:
            time.sleep(0.05)
        left = _alive(pids)
    finally:
        if proc.poll() is None:
            proc.kill()
    for p in _alive(pids):  # do not leave them behind if the test fails
        os.kill(p, signal.SIGKILL)
    assert not left, f"workers {left} survived their trainer by 10 s"


_HANG = mp.get_context("fork").Event()  # never set: the env waits for the whole timeout


class HangingPendulum(PendulumEnv):
    """Steps normally 4 times, then its step blocks (at most 60 s) on an Event."""

    def _step(self, td):
        self.n = getattr(self, "n", 0) + 1
        if self.n > 4:
            _HANG.wait(60)
        return super()._step(td)


def _policy():
    return TensorDictModule(torch.nn.Linear(3, 1), ["observation"], ["action"])


@pytest.mark.parametrize("cls", [MultiAsyncCollector, MultiSyncCollector])
def test_hung_env_raises_naming_the_worker(cls):
    col = cls([HangingPendulum, PendulumEnv], _policy(), frames_per_batch=8, timeout=1.5)
    pids = [p.pid for p in col.workers]
    t0 = time.monotonic()
    with pytest.raises(WorkerError) as info:
        while time.monotonic() - t0 < 20:  # async: worker 1 keeps delivering meanwhile
            col.next_batch()
    assert time.monotonic() - t0 < 20
    msg = str(info.value)
    assert "timeout=1.5 s" in msg and "worker 0" in msg and "'collect' asked" in msg, msg
    assert f"pid {pids[0]}" in msg
    end = time.monotonic() + 10  # the collector stopped its workers, the hung one too
    while _alive(pids) and time.monotonic() < end:
        time.sleep(0.05)
    assert not _alive(pids)


def test_default_timeouts_are_finite():
    col = MultiAsyncCollector(PendulumEnv, _policy(), num_workers=1, frames_per_batch=4)
    try:
        assert col.timeout == 300.0
    finally:
        col.shutdown()
    env = ParallelEnv(1, PendulumEnv)
    try:
        assert env.timeout == 300.0
    finally:
        env.close()


def test_parallel_env_hang_raises_naming_the_worker():
    env = ParallelEnv(2, [PendulumEnv, HangingPendulum], timeout=1.0)
    pids = env.worker_pids
    with pytest.raises(TimeoutError, match=r"worker 1 \(pid \d+\) did not answer within timeout=1.0 s"):
        env.rollout(10, break_when_any_done=False)
    end = time.monotonic() + 10
    while _alive(pids) and time.monotonic() < end:
        time.sleep(0.05)
    assert not _alive(pids)


@pytest.mark.parametrize("n", [0, -1])
def test_zero_workers_are_refused_before_any_process_starts(n):
    before = {p.pid for p in psutil.Process().children()}
    with pytest.raises(ValueError, match="num_workers must be an int >= 1"):
        MultiSyncCollector(PendulumEnv, _policy(), num_workers=n, frames_per_batch=4)
    with pytest.raises(ValueError, match="num_workers must be an int >= 1"):
        MultiAsyncCollector(PendulumEnv, _policy(), num_workers=n, frames_per_batch=4)
    with pytest.raises(ValueError, match="needs num_workers >= 1"):
        SerialEnv(n, PendulumEnv)
    with pytest.raises(ValueError, match="needs num_workers >= 1"):
        ParallelEnv(n, PendulumEnv)
    assert {p.pid for p in psutil.Process().children()} <= before


# ----------------------------------------------------------------- hang detection timing
_MARGIN_S = 0.5  # the error comes at the timeout, not after a shutdown wait (it was ~5 s late)


def _raise_time(call) -> tuple[float, Exception]:
    t0 = time.monotonic()
    with pytest.raises((WorkerError, TimeoutError)) as info:
        call()
    return time.monotonic() - t0, info.value


@pytest.mark.parametrize("kind", ["sync", "parallel", "thread", "process"])
def test_hang_is_reported_at_the_timeout_not_later(kind):
    """The call that waits on a hung env raises ``timeout`` seconds after it asked, within
    0.5 s, and leaves no worker process behind."""
    timeout, pids = 1.0, []
    if kind == "sync":
        col = MultiSyncCollector([HangingPendulum, PendulumEnv], _policy(), frames_per_batch=8,
                                 timeout=timeout)
        pids = [p.pid for p in col.workers]
        col.next_batch()  # 4 steps each: the next batch hangs in worker 0
        took, err = _raise_time(col.next_batch)
    elif kind == "parallel":
        env = ParallelEnv(2, [PendulumEnv, HangingPendulum], timeout=timeout)
        pids = env.worker_pids
        td = env.reset()
        for _ in range(4):
            td = env.step(td.set("action", torch.zeros(2, 1)))["next"].clone()
        took, err = _raise_time(lambda: env.step(td.set("action", torch.zeros(2, 1))))
    else:
        col = InferenceCollector(HangingPendulum, _policy(), num_workers=2, frames_per_batch=8,
                                 timeout=timeout, transport=kind)
        pids = [p.pid for p in col.workers] if kind == "process" else []
        col.next_batch()
        took, err = _raise_time(col.next_batch)
    assert f"timeout={timeout} s" in str(err)
    assert timeout <= took < timeout + _MARGIN_S, f"{kind}: raised after {took:.2f} s"
    assert not _alive(pids)


def test_async_hang_counts_from_the_request_and_a_slow_trainer_is_no_hang():
    """Async: the hung worker's clock starts when it was asked (the other keeps delivering);
    a trainer slower than ``timeout`` between batches is not taken for a hang (it was)."""
    col = MultiAsyncCollector([PendulumEnv, PendulumEnv], _policy(), frames_per_batch=8,
                              timeout=1.0)
    try:
        for _ in range(3):
            col.next_batch()
            time.sleep(1.5)  # both answers wait in their pipes longer than the timeout
    finally:
        col.shutdown()
    col = MultiAsyncCollector([HangingPendulum, PendulumEnv], _policy(), frames_per_batch=8,
                              timeout=1.0)
    pids = [p.pid for p in col.workers]
    with pytest.raises(WorkerError) as info:
        for _ in range(10_000):
            col.next_batch()
    late = re.search(r"worker 0 \(pid \d+, 'collect' asked ([\d.]+) s ago\)", str(info.value))
    assert late, str(info.value)
    assert 1.0 <= float(late.group(1)) < 1.0 + _MARGIN_S
    assert not _alive(pids)
