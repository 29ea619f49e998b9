"""Threads that tdrl starts keep the caller's torch intra-op thread count.

``torch.set_num_threads`` sets OpenMP's count for the calling thread only; a fresh thread
gets OpenMP's default (one per core), whose team start-up made small ops 10-500x slower
(tdrl.core.threads). The count a thread really runs with is OpenMP's own
``omp_get_max_threads()`` in that thread (torch's ``get_num_threads`` reports the caller's).
"""

from __future__ import annotations

import ctypes
import glob
import os
import threading

import pytest
import torch
from tensordict.nn import TensorDictModule

from tdrl.core.collectors import InferenceCollector
from tdrl.core.threads import carry_num_threads, thread_initializer

_LIBS = glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "libgomp*"))
pytestmark = pytest.mark.skipif(not _LIBS, reason="torch is not built with the GNU OpenMP runtime")


def _omp_threads() -> int:
    """OpenMP's thread count for the calling thread (torch's own libgomp)."""
    return ctypes.CDLL(_LIBS[0]).omp_get_max_threads()


def _in_thread(target) -> list[int]:
    seen: list[int] = []
    t = threading.Thread(target=target, args=(seen,))
    t.start()
    t.join()
    return seen


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one core: the default team is one thread too")
@pytest.mark.skipif(os.environ.get("OMP_NUM_THREADS", "") not in ("", "0"),
                    reason="OMP_NUM_THREADS is set: a plain thread's default team already has that size")
def test_a_plain_thread_does_not_inherit_the_count(one_thread):
    assert _omp_threads() == 1
    seen = _in_thread(lambda out: out.append(_omp_threads()))
    assert seen[0] > 1  # the pitfall carry_num_threads exists for


def test_carry_num_threads_sets_the_count_in_the_thread(one_thread):
    seen = _in_thread(carry_num_threads(lambda out: out.append(_omp_threads())))
    assert seen == [1]
    torch.set_num_threads(2)
    wrapped = carry_num_threads(lambda out: out.append(_omp_threads()))  # reads the count now
    torch.set_num_threads(1)
    assert _in_thread(wrapped) == [2]


def test_thread_pool_initializer(one_thread):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2, initializer=thread_initializer()) as pool:
        assert [f.result() for f in [pool.submit(_omp_threads) for _ in range(4)]] == [1] * 4


class _Probe(torch.nn.Module):
    """Records the OpenMP count of the thread that runs its forward."""

    seen: list[int] = []

    def forward(self, obs):
        _Probe.seen.append(_omp_threads())
        return torch.zeros(obs.shape[:-1] + (1,))


def test_inference_server_and_thread_workers_run_with_the_count(one_thread):
    from tdrl.core.envs import GymEnv

    pytest.importorskip("gymnasium")
    _Probe.seen = []
    policy = TensorDictModule(_Probe(), ["observation"], ["action"])
    col = InferenceCollector(lambda: GymEnv("Pendulum-v1"), policy, num_workers=2,
                             frames_per_batch=8, transport="thread")
    try:
        batch = col.next_batch()
    finally:
        col.shutdown()
    assert batch.batch_size == (2, 4)
    assert _Probe.seen and set(_Probe.seen) == {1}


def test_reward_threads_run_with_the_count(one_thread):
    pytest.importorskip("tdrl.llm")
    from tdrl.llm.rewards.compute import call_with_timeout, map_bounded

    assert call_with_timeout(lambda: [_omp_threads()], timeout=5.0) == [1]
    assert map_bounded(lambda _: _omp_threads(), range(4), workers=2) == [1] * 4
