"""Where an env's seed comes from when the user gives none (tdrl.core.envs.seeding): an env
never seeded draws its seed from torch's default generator at its first reset, so that
``torch.manual_seed`` repeats a run, evaluation envs included (issue 40: the TorchRL SAC port's
unseeded evaluation env gave -1366 and -1266 on the same commit and seed); an env seeded before
it is wrapped keeps its seed; multi-process collectors draw one base seed in the trainer."""

from __future__ import annotations

import functools

import torch

from tdrl.core.collectors import MultiSyncCollector
from tdrl.core.envs import EnvCreator, GymEnv, ParallelEnv, SerialEnv
from tdrl.core.transforms import Compose, DoubleToFloat, InitTracker, RewardSum, StepCounter, TransformedEnv


def _pendulum():
    return GymEnv("Pendulum-v1")


def _sac_eval_env(num_workers):
    """The SOTA SAC port's evaluation env: a ParallelEnv (serial for one) that nobody seeds."""
    base = ParallelEnv(num_workers, EnvCreator(functools.partial(_pendulum)), serial_for_single=True)
    return TransformedEnv(base, Compose(InitTracker(), StepCounter(200), DoubleToFloat(), RewardSum()))


def _rollout_under(seed, make, steps=5):
    torch.manual_seed(seed)
    env = make()
    try:
        return env.rollout(steps)  # random actions from the action spec (torch's generator)
    finally:
        env.close()


def test_an_unseeded_gym_env_repeats_under_torch_manual_seed_and_differs_across_seeds():
    a, b, c = (_rollout_under(s, _pendulum) for s in (0, 0, 1))
    assert torch.equal(a["observation"], b["observation"]) and torch.equal(a["next", "reward"], b["next", "reward"])
    assert not torch.allclose(a["observation"][0], c["observation"][0])  # the initial state differs


def test_the_sac_ports_unseeded_evaluation_env_repeats_one_and_two_workers():
    for workers in (1, 2):
        make = functools.partial(_sac_eval_env, workers)
        a, b, c = (_rollout_under(s, make, steps=4) for s in (42, 42, 7))
        assert torch.equal(a["next", "observation"], b["next", "observation"]), workers
        assert torch.equal(a["next", "episode_reward"], b["next", "episode_reward"]), workers
        assert not torch.allclose(a["observation"][:, 0], c["observation"][:, 0]), workers
        if workers == 2:  # the draw seeds worker i with seed + i: the two workers start apart
            assert not torch.allclose(a["observation"][0, 0], a["observation"][1, 0])


def test_an_env_seeded_before_it_is_wrapped_keeps_its_seed_and_draws_nothing():
    ref = _pendulum()
    ref.set_seed(3)
    expected = ref.reset()["observation"]
    inner = _pendulum()
    inner.set_seed(3)
    env = TransformedEnv(inner, Compose(StepCounter(10), DoubleToFloat()))
    torch.manual_seed(0)
    got = env.reset()["observation"]
    after = torch.rand(())
    torch.manual_seed(0)
    assert torch.equal(got, expected) and torch.equal(after, torch.rand(()))  # no draw consumed
    assert env.seeded and inner.seeded


def _seeded_pendulum(seed):
    env = _pendulum()
    env.set_seed(seed)
    return env


def test_a_batched_env_of_sub_envs_seeded_by_their_maker_keeps_their_seeds():
    env = SerialEnv(2, [functools.partial(_seeded_pendulum, 5), functools.partial(_seeded_pendulum, 9)])
    assert env.seeded
    got = env.reset()["observation"]
    assert torch.equal(got[0], _seeded_pendulum(5).reset()["observation"])
    assert torch.equal(got[1], _seeded_pendulum(9).reset()["observation"])


def test_reset_with_a_seed_counts_as_seeded():
    env = _pendulum()
    first = env.reset(seed=11)["observation"]
    assert env.seeded
    assert torch.equal(first, _seeded_pendulum(11).reset()["observation"])


def _multi_batch(seed):
    torch.manual_seed(seed)
    col = MultiSyncCollector([_pendulum] * 2, None, frames_per_batch=8, total_frames=8)
    try:
        return next(iter(col))
    finally:
        col.shutdown()


def test_a_multi_process_collector_without_a_seed_repeats_and_its_workers_differ():
    a, b, c = _multi_batch(0), _multi_batch(0), _multi_batch(1)
    obs = a["observation"].reshape(2, -1, 3)
    assert torch.equal(a["observation"], b["observation"])
    assert not torch.allclose(obs[0, 0], obs[1, 0])  # worker 0 and worker 1 start apart
    assert not torch.equal(a["observation"], c["observation"])


def test_a_multi_process_collector_without_a_seed_keeps_the_seeds_the_env_makers_set():
    torch.manual_seed(0)
    makers = [functools.partial(_seeded_pendulum, 5), functools.partial(_seeded_pendulum, 9)]
    col = MultiSyncCollector(makers, None, frames_per_batch=8, total_frames=8)
    try:
        obs = next(iter(col))["observation"].reshape(2, -1, 3)
    finally:
        col.shutdown()
    assert torch.equal(obs[0, 0], _seeded_pendulum(5).reset()["observation"])
    assert torch.equal(obs[1, 0], _seeded_pendulum(9).reset()["observation"])
