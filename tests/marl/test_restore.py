"""Checkpoints of the MARL loops: every network, optimiser and buffer saved; a run resumes inside
itself; a checkpoint evaluates and renders a VMAS episode to a video file."""

from __future__ import annotations

import pytest
import torch

from tdrl.core.train import Checkpointer, load_checkpoint
from tdrl.marl.algorithms import ALGORITHMS, make_groups
from tdrl.marl.envs import VmasEnv
from tdrl.marl.loops import TrainConfig, evaluate_groups, load_parts, render_episode, train_off_policy, train_on_policy

CFG = dict(frames_per_batch=24, minibatch_size=12, n_optimizer_steps=2, num_epochs=1, eval_interval=0, max_steps=6)


class Crash(Exception):
    pass


def _run(algo, n_iters, ckpt_dir, resume=False, seed=0, crash_at=None):
    torch.manual_seed(seed)
    env = VmasEnv("navigation", num_envs=4, max_steps=6, seed=seed, n_agents=2,
                  continuous_actions=ALGORITHMS[algo].continuous)
    parts = make_groups(algo, env, num_cells=(8,))
    train = train_on_policy if ALGORITHMS[algo].on_policy else train_off_policy

    def log(rec):
        if rec["iter"] == crash_at:  # the process dies during this iteration, before its checkpoint
            raise Crash

    hist = train(env, parts, TrainConfig(n_iters=n_iters, **CFG), checkpoint=Checkpointer(ckpt_dir),
                 resume=resume, log=log)
    return parts, hist


def _evaluate(policy):
    """Deterministic returns on the same evaluation episodes every call (VMAS draws its resets
    from torch's generator)."""
    torch.manual_seed(7)
    env = VmasEnv("navigation", num_envs=3, max_steps=6, seed=7, n_agents=2)
    return evaluate_groups(env, policy, 6, ["agents"])["agents"]


@pytest.mark.parametrize("algo", ["maddpg", "masac", "qmix", "iql", "mappo"])
def test_a_checkpoint_holds_every_network_optimiser_and_buffer(algo, tmp_path):
    parts, hist = _run(algo, 2, tmp_path)
    state = load_checkpoint(tmp_path / "step_48.pt")
    objects = state["objects"]
    p = parts["agents"]
    for name, module in (("agents/loss", p.loss), ("agents/policy", p.policy)):
        saved = objects[name]
        assert set(saved) == set(module.state_dict())
        for k, v in module.state_dict().items():
            assert torch.equal(saved[k], v), (name, k)
    assert objects["optimizer"]["state"]  # Adam's moments
    if not ALGORITHMS[algo].on_policy:
        assert int(objects["buffer"]["storage"]["len"]) == 48  # every transition collected
    assert state["extra"]["iter"] == 1 and state["extra"]["frames"] == 48
    assert len(state["extra"]["history"]) == 2


@pytest.mark.parametrize("algo", ["maddpg", "qmix"])
def test_resume_inside_a_run_restores_the_learner_and_continues(algo, tmp_path):
    with pytest.raises(Crash):  # a 4-iteration run dies in its third iteration
        _run(algo, 4, tmp_path, crash_at=2)
    saved = load_checkpoint(tmp_path / "step_48.pt")["objects"]
    parts, hist = _run(algo, 4, tmp_path, resume=True, seed=5)  # other seed: resumed state must win
    assert [r["iter"] for r in hist] == [0, 1, 2, 3] and hist[-1]["frames"] == 96
    p = parts["agents"]
    explore = p.explore
    assert int(explore.frames) == 96  # the exploration schedule continued from 48 frames
    # the buffer was refilled from the checkpoint, then 48 more transitions were added
    final = load_checkpoint(tmp_path / "step_96.pt")["objects"]
    assert int(final["buffer"]["storage"]["len"]) == 96
    steps = {int(v["step"]) for v in final["optimizer"]["state"].values()}
    assert steps == {8}  # Adam's step count continued: 4 iterations x 2 updates
    data = final["buffer"]["storage"]["data"]
    torch.testing.assert_close(data[:48].to_dict(), saved["buffer"]["storage"]["data"].to_dict())


def test_evaluate_only_from_a_checkpoint_reproduces_the_trained_policy(tmp_path):
    parts, _ = _run("iddpg", 2, tmp_path)
    want = _evaluate(parts["agents"].policy)
    torch.manual_seed(123)  # fresh, differently initialised networks
    env = VmasEnv("navigation", num_envs=4, max_steps=6, seed=0, n_agents=2)
    fresh = make_groups("iddpg", env, num_cells=(8,))
    before = _evaluate(fresh["agents"].policy)
    extra = load_parts(tmp_path / "step_48.pt", fresh)
    after = _evaluate(fresh["agents"].policy)
    assert extra["frames"] == 48
    assert not torch.allclose(before, want)
    torch.testing.assert_close(after, want)


def test_render_an_evaluation_episode_to_a_video_file(tmp_path):
    imageio = pytest.importorskip("imageio.v2")
    parts, _ = _run("iddpg", 1, tmp_path)
    env = VmasEnv("navigation", num_envs=2, max_steps=5, seed=3, n_agents=2)
    path = render_episode(env, parts["agents"].policy, tmp_path / "episode.gif", max_steps=5)
    frames = imageio.mimread(path)
    assert len(frames) == 6  # the reset frame and one per step of the 5-step episode
    assert frames[0].shape[-1] in (3, 4) and frames[0].shape[0] > 100
    assert any((f[..., :3] != frames[0][..., :3]).any() for f in frames[1:])  # the agents move


def test_the_runner_resumes_a_killed_pair_from_its_checkpoint(tmp_path):
    """SIGKILL inside a pair after its second checkpoint; resume=True continues from it: the
    iterations before it are read back (same evaluations), the rest trained once."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import textwrap
    import time

    from tdrl.marl.runner import BenchConfig, run_benchmark

    tiny = dict(num_envs=2, n_iters=5, off_policy_frames_per_batch=8, off_policy_batch_size=8, n_optimizer_steps=1,
                eval_envs=1, eval_interval=1, max_steps=4, num_cells=(8,), seeds=(0,), checkpoint_iters=1)
    script = textwrap.dedent(f"""
        import time, torch
        import tdrl.marl.runner as runner
        from tdrl.marl.runner import BenchConfig, run_benchmark
        torch.set_num_threads(1)
        real = runner._rows
        def slow(*args, **kwargs):  # one second per iteration: time to kill it inside the pair
            time.sleep(1.0)
            return real(*args, **kwargs)
        runner._rows = slow
        run_benchmark(BenchConfig(algorithms=("iql",), tasks=("balance",), out_dir={str(tmp_path)!r}, **{tiny!r}))
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    folder = tmp_path / "checkpoints" / "iql_balance_seed0"
    deadline = time.monotonic() + 120
    try:
        while not (folder / "step_16.pt").exists():
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "no second checkpoint in time"
            time.sleep(0.05)
        time.sleep(0.2)
        assert proc.poll() is None, "the pair finished before it could be killed"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    before = [json.loads(x) for x in (tmp_path / "evaluations.jsonl").read_text().splitlines()]
    assert not (tmp_path / "checkpoints" / "iql_balance_seed0" / "step_40.pt").exists()
    newest = max(int(p.stem.split("_")[1]) for p in folder.glob("step_*.pt"))
    done = newest // 8  # iterations in the newest checkpoint
    result = run_benchmark(BenchConfig(algorithms=("iql",), tasks=("balance",), out_dir=str(tmp_path), resume=True,
                                       **tiny))
    rows = sorted(result["evaluations"], key=lambda r: r["iter"])
    assert [r["iter"] for r in rows] == [0, 1, 2, 3, 4] and rows[-1]["frames"] == 40
    old = {r["iter"]: (r["eval_return"], r["time_s"]) for r in before}
    assert done >= 2
    # read back, not retrained: the same returns and the killed run's clock (its 1 s sleeps)
    assert all((rows[i]["eval_return"], rows[i]["time_s"]) == old[i] for i in range(done))
    assert rows[1]["time_s"] > 1.0
    assert (folder / "step_40.pt").exists()
