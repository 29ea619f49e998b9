"""apps/her: HER wired end to end on a real goal task (PointMaze from gymnasium-robotics):
collector -> buffer -> HERTransform -> batch, checked against the stored episodes; config
checks; the tiny run CI does."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("gymnasium_robotics")

from _load import load_app, read_rows  # noqa: E402


@pytest.fixture(scope="module")
def her():
    return load_app("her")


def test_config_refuses_bad_settings(her):
    with pytest.raises(ValueError, match="num_envs"):
        her.Config(num_envs=2)
    with pytest.raises(ValueError, match="strategy"):
        her.Config(strategy="past")
    with pytest.raises(ValueError, match="k="):
        her.Config(k=0)


def test_refuses_a_task_without_goals(her):
    cfg = her.Config(env_id="Pendulum-v1")
    from tdrl.core.envs import make_env

    with pytest.raises(ValueError, match="achieved_goal"):
        her.make_actor_critic(make_env("Pendulum-v1", 1), cfg)


def test_her_batches_relabel_from_the_same_episode(her):
    """Random-action episodes of PointMaze collected the app's way; every relabelled row's goal is
    the achieved goal of a step at or after it in its own episode (root and next), its reward is
    the sparse reward of that goal recomputed by hand (distance <= 0.45), and the other rows are
    returned as stored."""
    from tdrl.core.collectors import Collector
    from tdrl.core.replay import HERTransform, LazyTensorStorage, ReplayBuffer

    torch.manual_seed(0)
    cfg = her.Config(max_episode_steps=100, hidden=(16,), out="unused")
    env = her.env_for(cfg, 1)
    actor, _ = her.make_actor_critic(env, cfg)
    storage = LazyTensorStorage(1000)
    transform = HERTransform(storage, her.env_compute_reward(cfg), strategy="future", k=4,
                             episode_key=her.EPISODE, generator=torch.Generator().manual_seed(0))
    buffer = ReplayBuffer(storage=storage, batch_size=200, transform=transform)
    collector = Collector(env, actor, frames_per_batch=1, total_frames=300, init_random_frames=300, seed=0)
    for batch in collector:
        buffer.extend(batch.reshape(-1))
    collector.shutdown()
    env.close()
    stored = storage.get(slice(0, 300))
    ep = stored[her.EPISODE].reshape(-1)
    assert ep.unique().numel() == 3 and bool((ep.diff() >= 0).all())  # 3 episodes of 100 in order

    sample = buffer.sample()
    t = sample["index"]
    desired = sample["desired_goal"]
    changed = (desired != stored["desired_goal"][t]).any(-1)
    assert int(changed.sum()) == 160  # round(0.8 * 200) relabelled
    assert torch.equal(sample["next", "desired_goal"], desired)
    achieved_next = stored["next", "achieved_goal"]
    for i in range(200):
        slot = int(t[i])
        if changed[i]:
            later = (ep == ep[slot]) & (torch.arange(300) >= slot)
            assert bool((achieved_next[later] == desired[i]).all(-1).any()), i
        else:
            assert bool((sample[i].exclude("index") == stored[slot]).all())
    dist = (sample["next", "achieved_goal"] - desired).norm(dim=-1)
    expected = (dist <= 0.45).float()
    assert torch.equal(sample["next", "reward"].reshape(-1), expected)
    # both outcomes occur among the relabelled rows (a far future goal is a failure), and
    # hindsight turns failures into successes: far more rewarded rows than the stored ones
    assert 0.0 < float(expected[changed].mean()) < 1.0
    assert float(expected.mean()) > 3 * float(stored["next", "reward"].mean()) + 0.1


def test_tiny_run_writes_outputs(her, tmp_path):
    cfg = her.main.load([f"out={tmp_path}"], recipe="tiny")
    summary = her.train(cfg)
    rows = [r for r in read_rows(tmp_path / "metrics.csv") if r.get("loss_qvalue")]
    assert rows and all(math.isfinite(float(r["loss_qvalue"])) for r in rows)
    assert summary["frames"] == 300 and summary["updates"] == 201 and summary["her"] is True
    assert 0.0 <= summary["eval_success"] <= 1.0
    state = torch.load(tmp_path / "model.pt", weights_only=True)
    assert state["config"]["env_id"] == "PointMaze_Open-v3"


def test_open_recipe_has_the_measured_settings(her, tmp_path):
    cfg = her.main.load([f"out={tmp_path}"], recipe="open")
    assert (cfg.env_id, cfg.gamma, cfg.tau, cfg.k, cfg.her) == ("PointMaze_Open-v3", 0.98, 0.05, 4, True)
    assert cfg.eval_episodes == 100 and cfg.total_frames == 12_000 and cfg.batch_size == 512
