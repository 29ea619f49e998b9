"""SerialEnv / ParallelEnv: identical rollouts under seeds, worker errors with tracebacks,
dead workers detected, no orphaned processes (counted with psutil)."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import time

import gymnasium as gym
import psutil
import pytest
import torch

from tdrl.core.envs import GymEnv, GymWrapper, ParallelEnv, PendulumEnv, SerialEnv, WorkerError


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True) if p.is_running()
            and p.status() != psutil.STATUS_ZOMBIE}


def _wait_gone(pids, timeout=5.0) -> bool:
    end = time.time() + timeout
    while time.time() < end:
        if not (set(pids) & _children()):
            return True
        time.sleep(0.05)
    return False


def _cartpole():
    return GymEnv("CartPole-v1", categorical_action_encoding=True, max_episode_steps=20)


def _rollout(env, seed, steps=40):
    env.set_seed(seed)
    torch.manual_seed(seed)
    return env.rollout(steps, break_when_any_done=False)


def test_serial_and_parallel_give_identical_rollouts():
    serial = SerialEnv(3, _cartpole)
    par = ParallelEnv(3, _cartpole)
    try:
        assert par.batch_size == serial.batch_size == (3,)
        assert par.action_spec == serial.action_spec
        rs, rp = _rollout(serial, 5), _rollout(par, 5)
        assert rp["next", "done"].sum() >= 3  # partial resets happened
        assert (rs == rp).all()
        # and both equal Gymnasium's own vector env with the same seeds
        venv = GymEnv("CartPole-v1", num_envs=3, categorical_action_encoding=True,
                      max_episode_steps=20)
        assert (_rollout(venv, 5) == rp).all()
        venv.close()
    finally:
        par.close()
        serial.close()


def test_parallel_of_batched_torch_envs():
    serial = SerialEnv(2, lambda: PendulumEnv((3,), max_episode_steps=7))
    par = ParallelEnv(2, lambda: PendulumEnv((3,), max_episode_steps=7))
    try:
        assert par.batch_size == (2, 3)
        rs, rp = _rollout(serial, 1, 10), _rollout(par, 1, 10)
        assert rp.batch_size == (2, 3, 10)
        assert (rs == rp).all()
        assert rp["next", "truncated"][..., 6, 0].all()
    finally:
        par.close()


class _Boom(gym.Wrapper):
    def step(self, action):
        raise ValueError("the env exploded on purpose")


def _boom_env():
    return GymWrapper(_Boom(gym.make("CartPole-v1")))


def test_worker_exception_surfaces_with_traceback_and_no_orphans():
    before = _children()
    env = ParallelEnv(2, _boom_env)
    pids = env.worker_pids
    assert set(pids) <= _children() - before
    td = env.reset()
    t0 = time.time()
    with pytest.raises(WorkerError) as info:
        env.rand_step(td)
    assert time.time() - t0 < 5
    msg = str(info.value)
    assert "the env exploded on purpose" in msg and "Traceback" in msg and "worker 0" in msg
    env.close()
    assert _wait_gone(pids)


def _fails_to_build():
    raise RuntimeError("cannot build this env")


def test_constructor_error_is_raised_and_cleaned_up():
    before = _children()
    with pytest.raises(WorkerError, match="cannot build this env"):
        ParallelEnv(2, _fails_to_build)
    assert _wait_gone(_children() - before)


def test_killed_worker_is_detected_not_a_hang():
    env = ParallelEnv(2, _cartpole)
    pids = env.worker_pids
    td = env.reset()
    os.kill(pids[1], signal.SIGKILL)
    t0 = time.time()
    with pytest.raises(RuntimeError, match="worker 1"):
        for _ in range(3):  # the kill may land between two commands
            td = env.rand_step(td)
            td = td["next"].exclude("reward")
    assert time.time() - t0 < 5
    assert _wait_gone(pids)
    assert env.is_closed


def test_close_and_garbage_collection_terminate_workers():
    env = ParallelEnv(2, _cartpole)
    pids = env.worker_pids
    env.close()
    env.close()  # idempotent
    assert _wait_gone(pids)
    env = ParallelEnv(2, _cartpole)
    pids = env.worker_pids
    env.rollout(3)
    del env
    gc.collect()
    assert _wait_gone(pids)


def test_interpreter_exit_terminates_workers():
    """A script that never closes its ParallelEnv leaves no process behind when it exits."""
    script = textwrap.dedent(
        """
        from tdrl.core.envs import ParallelEnv, PendulumEnv
        env = ParallelEnv(2, lambda: PendulumEnv(max_episode_steps=3))
        r = env.rollout(4, break_when_any_done=False)
        assert r.batch_size == (2, 4) and bool(r["next", "truncated"][:, 2].all())
        print(" ".join(map(str, env.worker_pids)), flush=True)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    pids = [int(p) for p in out.stdout.split()]
    assert len(pids) == 2

    def alive():
        return [p for p in pids if psutil.pid_exists(p)
                and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]

    end = time.time() + 5
    while time.time() < end and alive():
        time.sleep(0.05)
    assert not alive()


def test_serial_env_per_worker_constructors_and_kwargs():
    env = SerialEnv(2, PendulumEnv, [{"max_episode_steps": 2}, {"max_episode_steps": 3}])
    r = env.rollout(3, break_when_any_done=False)
    assert r["next", "truncated"][:, :, 0].tolist() == [[False, True, False], [False, False, True]]
    with pytest.raises(ValueError, match="Expected 3 env constructors"):
        SerialEnv(3, [PendulumEnv, PendulumEnv])
