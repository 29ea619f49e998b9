"""Environments and transforms on a CUDA device (skipped without one)."""

from __future__ import annotations

import pytest
import torch

from tdrl.core.envs import GymEnv, ParallelEnv, PendulumEnv, SerialEnv, check_env_specs
from tdrl.core.specs import Bounded, Composite, OneHot
from tdrl.core.transforms import Compose, RewardSum, StepCounter, TransformedEnv, VecNorm

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")


def test_specs_on_cuda():
    c = Composite({"a": Bounded(-1.0, 1.0, (4, 3)), "b": OneHot(5, (4, 5))}, shape=(4,))
    g = c.to("cuda")
    td = g.rand()
    assert td.device.type == "cuda" and td["a"].device.type == "cuda" and g.is_in(td)
    assert g["a"].project(td["a"] * 3).abs().max() <= 1


def test_pendulum_on_cuda_matches_cpu():
    cpu, gpu = PendulumEnv((256,)), PendulumEnv((256,), device="cuda")
    r = gpu.rollout(20, break_when_any_done=False)
    assert r.device.type == "cuda" and r["next", "reward"].is_cuda
    check_env_specs(gpu)
    start = cpu.reset()
    a = torch.rand(256, 1) * 4 - 2
    c = cpu.step(start.clone().set("action", a))
    g = gpu.step(start.to(CUDA).set("action", a.to(CUDA)))
    torch.testing.assert_close(c["next", "observation"], g["next", "observation"].cpu())


def test_gym_and_transforms_on_cuda():
    env = TransformedEnv(GymEnv("Pendulum-v1", device="cuda"),
                         Compose(StepCounter(10), RewardSum(), VecNorm()))
    r = env.rollout(15, break_when_any_done=False)
    assert r["next", "observation"].is_cuda and r["next", "episode_reward"].is_cuda
    assert r["next", "truncated"][9].item()
    check_env_specs(env)


@pytest.mark.parametrize("cls", [SerialEnv, ParallelEnv])
def test_batched_env_outputs_on_cuda(cls):
    env = cls(2, lambda: GymEnv("CartPole-v1"), device="cuda")
    try:
        r = env.rollout(10, break_when_any_done=False)
        assert r.device.type == "cuda" and r["next", "observation"].is_cuda
    finally:
        env.close()
