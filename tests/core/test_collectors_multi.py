"""Multi-process collectors with real worker processes: results, weight updates, faults,
and no orphan processes."""

from __future__ import annotations

import functools
import gc
import os
import signal
import time

import psutil
import pytest
import torch
from tensordict.nn import TensorDictModule

from tdrl.core.collectors import MultiAsyncCollector, MultiSyncCollector, WorkerError
from tdrl.core.envs import PendulumEnv
from tdrl.core.keys import TRAJ_ID


def _policy(bias=0.25):
    net = torch.nn.Linear(3, 1)
    with torch.no_grad():
        net.weight.fill_(0.0)
        net.bias.fill_(bias)
    return TensorDictModule(net, ["observation"], ["action"])


def _make_env():
    return PendulumEnv(batch_size=(2,), max_episode_steps=7)


class FailingPendulum(PendulumEnv):
    """Raises on its 5th step."""

    def _step(self, td):
        self.n = getattr(self, "n", 0) + 1
        if self.n == 5:
            raise ValueError("boom from the env at step 5")
        return super()._step(td)


def _children_alive(pids):
    return [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]


def _worker_pids(col):
    return [p.pid for p in col.workers]


def test_sync_collects_from_all_workers_and_updates_weights():
    pol = _policy(0.25)
    col = MultiSyncCollector(_make_env, pol, num_workers=2, frames_per_batch=40,
                             total_frames=80, timeout=120)
    pids = _worker_pids(col)
    try:
        batches = list(col)
        assert len(batches) == 2
        b = batches[0]
        assert b.batch_size == (2, 2, 10)  # (workers, env batch, T)
        assert (b["action"] == 0.25).all()
        ids = torch.cat([x[TRAJ_ID] for x in batches], -1)
        # 2 workers x 2 envs, episodes of 7 steps: every (worker, env, episode) id is unique
        firsts = ids[..., ::7].reshape(-1)
        assert firsts.unique().numel() == firsts.numel()
        assert (ids[..., :7] == ids[..., :1]).all()
        with torch.no_grad():
            pol.module.bias.fill_(-1.0)
        col.update_policy_weights_()  # sync: returns once every worker has the weights
        assert (col.next_batch()["action"] == -1.0).all()
        other = _policy(1.5)
        col.update_policy_weights_(other)
        assert (col.next_batch()["action"] == 1.5).all()
    finally:
        col.shutdown()
    assert _children_alive(pids) == []


def test_async_yields_first_ready_batches():
    pol = _policy(0.5)
    col = MultiAsyncCollector(_make_env, pol, num_workers=2, frames_per_batch=20,
                              total_frames=100, timeout=120)
    pids = _worker_pids(col)
    try:
        seen = list(col)
        assert len(seen) == 5 and all(b.batch_size == (2, 10) for b in seen)
        assert all((b["action"] == 0.5).all() for b in seen)
        # both workers deliver (ids: local*2 + worker); under load one worker can fill the
        # first batches alone while the other starts, so read on (bounded) until both did
        workers = {int(i) % 2 for b in seen for i in b[TRAJ_ID][:, 0]}
        for _ in range(40):
            if workers == {0, 1}:
                break
            workers |= {int(i) % 2 for i in col.next_batch()[TRAJ_ID][:, 0]}
        assert workers == {0, 1}
        col.update_policy_weights_(_policy(-0.5))
        # batches in flight may still use the old weights; new ones use the new weights
        late = [col.next_batch() for _ in range(6)]
        assert (late[-1]["action"] == -0.5).all()
    finally:
        col.shutdown()
    assert _children_alive(pids) == []


def test_env_exception_surfaces_with_worker_traceback():
    make = functools.partial(FailingPendulum, batch_size=(2,))
    col = MultiSyncCollector([make, _make_env], _policy(), frames_per_batch=40, timeout=120)
    pids = _worker_pids(col)
    t0 = time.monotonic()
    with pytest.raises(WorkerError) as err:
        col.next_batch()
    assert time.monotonic() - t0 < 60
    msg = str(err.value)
    assert "worker 0 raised" in msg and "boom from the env at step 5" in msg
    assert "Traceback" in msg and "_step" in msg
    time.sleep(0.2)
    assert _children_alive(pids) == []  # the collector stopped every worker before raising


def _broken_env():
    raise RuntimeError("cannot build this env")


def test_env_constructor_error_keeps_the_traceback():
    col = MultiSyncCollector(_broken_env, _policy(), num_workers=1, frames_per_batch=4,
                             timeout=120)
    pids = _worker_pids(col)
    col._procs[0].join(30)  # the worker reports, then exits
    with pytest.raises(WorkerError, match="cannot build this env"):
        col.next_batch()
    assert _children_alive(pids) == []


@pytest.mark.parametrize("cls", [MultiSyncCollector, MultiAsyncCollector])
def test_killed_worker_is_reported_and_weight_update_raises(cls):
    col = cls(_make_env, _policy(), num_workers=2, frames_per_batch=20, timeout=120)
    pids = _worker_pids(col)
    col.next_batch()
    os.kill(pids[1], signal.SIGKILL)
    col._procs[1].join(10)
    t0 = time.monotonic()
    with pytest.raises(WorkerError, match="worker 1 is dead"):
        for _ in range(10):  # the async collector may first hand out worker 0's batch
            col.next_batch()
    assert time.monotonic() - t0 < 30
    assert _children_alive(pids) == []
    with pytest.raises(RuntimeError, match="shut down"):
        col.update_policy_weights_()


def test_weight_update_to_dead_worker_fails_loudly():
    col = MultiSyncCollector(_make_env, _policy(), num_workers=2, frames_per_batch=20,
                             timeout=120)
    pids = _worker_pids(col)
    col.next_batch()
    os.kill(pids[0], signal.SIGKILL)
    col._procs[0].join(10)
    t0 = time.monotonic()
    with pytest.raises(WorkerError, match="worker 0 is dead"):
        col.update_policy_weights_()
    assert time.monotonic() - t0 < 30
    assert _children_alive(pids) == []


def test_garbage_collection_leaves_no_child_process():
    col = MultiAsyncCollector(_make_env, _policy(), num_workers=2, frames_per_batch=20,
                              timeout=120)
    col.next_batch()  # workers are busy collecting the next batch now
    pids = _worker_pids(col)
    assert len(_children_alive(pids)) == 2
    del col
    gc.collect()
    deadline = time.monotonic() + 20
    while _children_alive(pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _children_alive(pids) == []
    mine = psutil.Process().children(recursive=True)
    assert not [p for p in mine if p.pid in pids]


@pytest.mark.slow
def test_spawn_start_method():
    # a spawned worker re-imports torch and tdrl: seconds on an idle machine, more under load
    make = functools.partial(PendulumEnv, batch_size=(2,), max_episode_steps=7)
    col = MultiSyncCollector(make, _policy(0.75), num_workers=1, frames_per_batch=4,
                             start_method="spawn", timeout=300)
    pids = _worker_pids(col)
    try:
        b = col.next_batch()
        assert b.batch_size == (1, 2, 2) and (b["action"] == 0.75).all()
    finally:
        col.shutdown()
    assert _children_alive(pids) == []
