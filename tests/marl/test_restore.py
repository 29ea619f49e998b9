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
