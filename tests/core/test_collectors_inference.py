"""Inference server and InferenceCollector: one batched forward equals per-request calls,
the same data under a fixed seed over the thread, process and Ray transports and a plain
Collector loop, live weights with a version, and faults (a raising env, a killed worker)
that raise WorkerError without leaving processes behind."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule

from tdrl.core.collectors import InferenceCollector, InferenceServer
from tdrl.core.envs import GymEnv, WorkerError

pytest.importorskip("gymnasium")


class _Argmax(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.net(x).argmax(-1)


def _make_env():
    return GymEnv("CartPole-v1", categorical_action_encoding=True)


def _make_bad_env():
    """CartPole whose simulator raises on its first step (a real Gymnasium wrapper)."""
    import gymnasium as gym

    from tdrl.core.envs import GymWrapper

    class Boom(gym.Wrapper):
        def step(self, action):
            raise ValueError("env exploded")

    return GymWrapper(Boom(gym.make("CartPole-v1")), categorical_action_encoding=True)


def _policy(seed=0):
    torch.manual_seed(seed)
    return TensorDictModule(_Argmax(), ["observation"], ["action"])


def test_one_batched_forward_equals_the_per_request_calls():
    torch.manual_seed(0)
    mlp = TensorDictModule(torch.nn.Linear(3, 2), ["observation"], ["out"])
    server = InferenceServer(mlp, max_batch=16)
    reqs = [TensorDict({"observation": torch.randn(*b, 3)}, b) for b in [(4,), (), (2, 3)]]
    outs, version = server.forward(reqs)
    assert version == 0 and server.forwards == 1 and server.rows == 11
    for req, out in zip(reqs, outs, strict=True):
        assert out.batch_size == req.batch_size and list(out.keys()) == ["out"]
        torch.testing.assert_close(out["out"], mlp.module(req["observation"]))
    with torch.no_grad():
        mlp.module.weight.add_(1.0)  # the server serves its own copy until told
    assert torch.equal(server.forward(reqs[:1])[0][0]["out"], outs[0]["out"])
    assert server.update_weights(mlp) == 1
    torch.testing.assert_close(server.forward(reqs[:1])[0][0]["out"], mlp.module(reqs[0]["observation"]))
    with pytest.raises(TypeError, match="in_keys"):
        InferenceServer(torch.nn.Linear(3, 2))
    with pytest.raises(ValueError, match="max_batch"):
        InferenceServer(mlp, max_batch=0)


def _assert_same_data(got, want) -> None:
    """Equal entries: exactly for discrete ones (actions, flags, ids) and the env's floats,
    to rounding for the policy's floats (a forward of 4 rows and one of 2 may round the last
    bit differently, depending on the CPU's matmul kernels)."""
    assert set(got.keys(True, True)) == set(want.keys(True, True))
    for key in want.keys(True, True):
        if want[key].is_floating_point():
            torch.testing.assert_close(got[key], want[key], rtol=1e-6, atol=1e-6, msg=str(key))
        else:
            assert torch.equal(got[key], want[key]), key


def _reference(policy, seed: int, steps: int, workers: int) -> list:
    """Worker i's data by hand: its own env seeded seed + 1000 i, the policy per step."""
    out = []
    for i in range(workers):
        env = _make_env()
        env.set_seed(seed + 1000 * i)
        out.append(env.rollout(steps, policy, break_when_any_done=False))
    return out


def test_thread_and_process_transports_give_the_same_data_and_live_weights():
    pol = _policy()
    got = {}
    for transport in ("thread", "process"):
        with InferenceCollector(_make_env, pol, num_workers=2, frames_per_batch=60,
                                transport=transport, seed=3, timeout=60) as col:
            a, b = col.next_batch(), col.next_batch()
            got[transport] = torch.cat([a, b], -1)
            assert col.server.forwards < col.server.rows  # requests were batched
            assert (got[transport]["collector", "policy_version"] == 0).all()
            assert col.update_policy_weights_() == 1
            assert (col.next_batch()["collector", "policy_version"] == 1).all()
            if transport == "process":
                procs = col.workers
                os.kill(procs[1].pid, signal.SIGKILL)
                with pytest.raises(WorkerError, match=r"worker 1 \(pid \d+\) died"):
                    col.next_batch()
                assert not any(p.is_alive() for p in procs)
    ref = _reference(pol, 3, 60, 2)
    assert got["thread"].batch_size == (2, 60) and got["thread"]["next", "done"].any()
    for i in range(2):
        assert (got["thread"][i].exclude("collector") == ref[i]).all()
    assert (got["thread"] == got["process"]).all()


def test_a_raising_env_and_bad_arguments_are_reported():
    col = InferenceCollector(_make_bad_env, _policy(), num_workers=2, frames_per_batch=8, timeout=20)
    start = time.monotonic()
    with pytest.raises(WorkerError, match=r"worker \d raised:(.|\n)*env exploded"):
        col.next_batch()
    assert time.monotonic() - start < 10
    assert not any(t.is_alive() for t in col.workers)
    with pytest.raises(RuntimeError, match="shut down"):
        col.next_batch()
    with pytest.raises(ValueError, match="transport must be one of"):
        InferenceCollector(_make_env, _policy(), frames_per_batch=8, transport="carrier-pigeon")
    with pytest.raises(TypeError, match="not an env instance"):
        InferenceCollector(_make_env(), _policy(), frames_per_batch=8)

def _make_vec_env():
    return GymEnv("CartPole-v1", num_envs=2, categorical_action_encoding=True)


def _categorical_actor(seed=0):
    from tdrl.core.modules import MLP, MaskedCategorical, ProbabilisticActor

    torch.manual_seed(seed)
    params = TensorDictModule(MLP(4, 2, (16,), torch.nn.Tanh), ["observation"], ["logits"])
    return ProbabilisticActor(params, MaskedCategorical, in_keys=["logits"])


class _Exploding(torch.nn.Module):
    """Answers three forwards, then raises: a policy bug the trainer must see by name."""

    def __init__(self) -> None:
        super().__init__()
        self.net, self.calls = torch.nn.Linear(4, 2), 0

    def forward(self, x):
        self.calls += 1
        if self.calls > 3:
            raise ValueError(f"policy exploded on call {self.calls}")
        return self.net(x).argmax(-1)


@pytest.mark.parametrize("transport", ["thread", "process", pytest.param("ray", marks=pytest.mark.slow)])
def test_a_raising_policy_is_reported_with_its_message_and_traceback(transport, request):
    if transport == "ray":
        request.getfixturevalue("local_ray")
    pol = TensorDictModule(_Exploding(), ["observation"], ["action"])
    col = InferenceCollector(_make_env, pol, num_workers=2, frames_per_batch=20, transport=transport,
                             timeout=120)
    with pytest.raises(WorkerError, match=r"(?s)inference server raised.*Traceback.*"
                                          r"ValueError: policy exploded on call 4"):
        for _ in range(3):
            col.next_batch()
    if transport != "ray":  # Ray actors are killed by Ray; the threads and processes are ours
        assert not any(w.is_alive() for w in col.workers)


def test_partial_forwards_no_spin_and_spawned_own_copies_give_the_same_data():
    pol = _policy()
    # max_batch=1: each forward serves one worker's rows (gathered by index), never spinning
    with InferenceCollector(_make_env, pol, num_workers=3, frames_per_batch=60, transport="process",
                            max_batch=1, spin_s=0, seed=3, timeout=60) as col:
        one = col.next_batch()
        assert col.server.forwards == col.server.rows == 60
    with InferenceCollector(_make_env, pol, num_workers=3, frames_per_batch=60, transport="local",
                            seed=3, timeout=60, start_method="spawn") as col:  # forked by default
        local = col.next_batch()
    ref = _reference(pol, 3, 20, 3)
    for i in range(3):
        assert (one[i].exclude("collector") == ref[i]).all()
    assert (one == local).all()  # trajectory ids and versions (0) too
    ids = one["collector", "traj_ids"]
    assert len(set(ids[0].tolist()) & set(ids[1].tolist())) == 0  # disjoint across workers


def test_batched_env_workers_and_a_probabilistic_actor_match_a_plain_collector():
    from tdrl.core.collectors import Collector

    from tensordict.nn import interaction_type

    actor = _categorical_actor()
    got = {}
    before = interaction_type()  # one process-wide global: thread workers must not race on it
    for transport in ("thread", "process"):
        # a long max_wait_s: the server waits for both workers (it stops waiting as soon as
        # both asked), so every forward serves both, however late a worker is scheduled
        with InferenceCollector(_make_vec_env, actor, num_workers=2, frames_per_batch=40,
                                transport=transport, exploration_type="mode", seed=7,
                                max_wait_s=30.0, timeout=60) as col:
            got[transport] = col.next_batch()
            assert got[transport].batch_size == (2, 2, 10)
            assert col.server.rows == 4 * col.server.forwards  # both workers' 2 rows, every forward
        assert interaction_type() == before
    for i in range(2):
        with Collector(_make_vec_env(), actor, frames_per_batch=20, exploration_type="mode",
                       seed=7 + 1000 * i) as ref:
            want = ref.rollout().exclude("collector")
        _assert_same_data(got["thread"][i].exclude("collector"), want)
    _assert_same_data(got["thread"], got["process"])


def test_bad_settings_fail_before_collecting_and_leave_no_process():
    import psutil

    from tdrl.core.collectors.inference_slab import SlabLayout

    with pytest.raises(ValueError, match="spin_s must be"):
        InferenceCollector(_make_env, _policy(), frames_per_batch=8, spin_s=-1)
    with pytest.raises(ValueError, match="start_method must be one of"):
        InferenceCollector(_make_env, _policy(), frames_per_batch=8, transport="process",
                           start_method="forkk")
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    reads_pixels = TensorDictModule(_Argmax(), ["pixels"], ["action"])
    with pytest.raises(WorkerError, match=r"worker \d raised:(.|\n)*policy reads \['pixels'\]"):
        InferenceCollector(_make_env, reads_pixels, num_workers=2, frames_per_batch=8,
                           transport="process", timeout=60)
    left = [p for p in psutil.Process().children(recursive=True)
            if p.pid not in before and p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not left
    server = InferenceServer(TensorDictModule(torch.nn.Linear(3, 2), ["observation"], ["out"]))
    three, four = (TensorDict({"observation": torch.zeros(2, d)}, [2]) for d in (3, 4))
    with pytest.raises(ValueError, match="one server needs one input layout"):
        SlabLayout([three, four], server, share=False)
    pooled = InferenceServer(TensorDictModule(lambda x: x.sum(), ["observation"], ["out"]))
    with pytest.raises(ValueError, match="one output row per input row"):
        SlabLayout([three, three], pooled, share=False)
    layout = SlabLayout([three, TensorDict({"observation": torch.ones(3)}, [])], server, share=False)
    assert layout.rows == [2, 1] and layout.offsets == [0, 2] and layout.outputs["out"].shape == (3, 2)
    assert server.forwards == 0  # the dry run is not counted


# ---------------------------------------------------------------------- the Ray transport
@pytest.fixture(scope="module")
def local_ray(tmp_path_factory):
    """A local Ray (2 CPUs) for the Ray-transport tests of this module."""
    ray = pytest.importorskip("ray")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the actors build _make_env
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             _temp_dir=str(tmp_path_factory.mktemp("ray")))
    yield ray
    ray.shutdown()


@pytest.mark.slow
def test_ray_actors_give_the_thread_transports_data_and_live_weights(local_ray):
    pol = _policy()
    with InferenceCollector(_make_env, pol, num_workers=2, frames_per_batch=60, transport="ray",
                            seed=3, timeout=120) as col:
        got = torch.cat([col.next_batch(), col.next_batch()], -1)
        assert col.server.forwards < col.server.rows  # requests of both actors were batched
        assert (got["collector", "policy_version"] == 0).all()
        assert col.update_policy_weights_() == 1
        assert (col.next_batch()["collector", "policy_version"] == 1).all()
        actors = col.workers
        local_ray.kill(actors[1])
        with pytest.raises(WorkerError, match="worker 1 .*died"):
            col.next_batch()
    ref = _reference(pol, 3, 60, 2)
    assert got.batch_size == (2, 60) and got["next", "done"].any()
    for i in range(2):
        assert (got[i].exclude("collector") == ref[i]).all()
    with InferenceCollector(_make_env, pol, num_workers=2, frames_per_batch=60, transport="thread",
                            seed=3, timeout=60) as col:
        threads = torch.cat([col.next_batch(), col.next_batch()], -1)
    ids = got["collector", "traj_ids"]
    assert set(ids[0].tolist()).isdisjoint(ids[1].tolist()) and ids.unique().numel() > 2
    assert (got == threads).all()  # trajectory ids and versions too


def test_more_ray_actors_than_cpus_warn_before_collecting(local_ray, caplog):
    with caplog.at_level("WARNING", logger="tdrl.core.collectors.inference_collector"):
        col = InferenceCollector(_make_env, _policy(), num_workers=3, frames_per_batch=6,
                                 transport="ray", timeout=120)
    col.shutdown()
    assert "3 Ray actors ask for 3 CPUs in all, the Ray cluster has 2" in caplog.text
    assert "ray_options" in caplog.text


@pytest.mark.slow
def test_a_raising_env_in_a_ray_actor_is_reported_with_its_traceback(local_ray):
    col = InferenceCollector(_make_bad_env, _policy(), num_workers=1, frames_per_batch=8,
                             transport="ray", timeout=120)
    with pytest.raises(WorkerError, match=r"worker \d raised:(.|\n)*env exploded"):
        col.next_batch()
    with pytest.raises(RuntimeError, match="shut down"):
        col.next_batch()


def _make_sleepy_env(flag: str):
    """CartPole whose step sleeps 60 s once the file ``flag`` exists (a hang a Ray actor
    can carry; the test creates the file)."""
    import gymnasium as gym

    from tdrl.core.envs import GymWrapper

    class Sleepy(gym.Wrapper):
        def step(self, action):
            if os.path.exists(flag):
                time.sleep(60)
            return self.env.step(action)

    return GymWrapper(Sleepy(gym.make("CartPole-v1")), categorical_action_encoding=True)


@pytest.mark.slow
def test_a_hung_ray_actor_is_reported_at_the_timeout(local_ray, tmp_path):
    """The hung actors are killed at once, not waited on for ``shutdown_timeout`` (5 s)."""
    import functools

    flag = tmp_path / "hang"
    col = InferenceCollector(functools.partial(_make_sleepy_env, str(flag)), _policy(),
                             num_workers=2, frames_per_batch=40, transport="ray", timeout=60)
    col.next_batch()  # the actors start (Ray takes seconds); then the short timeout applies
    col.timeout = 2.0
    flag.touch()
    t0 = time.monotonic()
    with pytest.raises(WorkerError, match=r"no batch within timeout=2.0 s from worker\(s\) \[0, 1\]"):
        col.next_batch()
    took = time.monotonic() - t0
    assert 2.0 <= took < 2.5, took
