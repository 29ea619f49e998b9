"""DMControlEnv: specs on several suite tasks, the data contract of a rollout, seeding, partial
reset, action repeat, per-key and pixel observations, make_env ids."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("dm_control")

from tdrl.core.envs import DMControlEnv, check_env_specs, make_env, parse_dmc_id  # noqa: E402


@pytest.mark.parametrize("env_id, obs_dim, act_dim", [
    ("dmc/cartpole-balance", 5, 1), ("dmc/reacher-easy", 6, 2), ("dmc/walker-walk", 24, 6)])
def test_check_env_specs_and_contract(env_id, obs_dim, act_dim):
    env = make_env(env_id, num_envs=2)
    check_env_specs(env, max_steps=4, seed=0)
    td = env.rollout(6)
    assert td.batch_size == (2, 6)
    assert td["observation"].shape == (2, 6, obs_dim) and td["observation"].dtype == torch.float32
    assert td["action"].shape == (2, 6, act_dim)
    assert td["next", "reward"].shape == (2, 6, 1)
    for key in ("done", "terminated", "truncated"):
        assert td["next", key].shape == (2, 6, 1) and td["next", key].dtype == torch.bool
    # step t's next observation is step t+1's observation
    assert torch.equal(td["next", "observation"][:, :-1], td["observation"][:, 1:])
    env.close()


def test_matches_the_suite_and_seeds():
    """Same seed -> the same episode as dm_control itself with task_kwargs={"random": seed}."""
    from dm_control import suite

    env = DMControlEnv("cartpole", "balance")
    env.set_seed(3)
    td = env.reset()
    ref = suite.load("cartpole", "balance", task_kwargs={"random": 3})
    ts = ref.reset()
    flat = np.concatenate([np.asarray(v).reshape(-1) for v in ts.observation.values()])
    assert torch.allclose(td["observation"][0], torch.as_tensor(flat, dtype=torch.float32))
    action = torch.tensor([[0.5]])
    out = env.step(td.set("action", action))
    ts = ref.step(np.array([0.5]))
    assert float(out["next", "reward"]) == pytest.approx(ts.reward, rel=1e-6)
    env.set_seed(3)
    assert torch.equal(env.reset()["observation"], td["observation"])
    env.set_seed(4)
    assert not torch.equal(env.reset()["observation"], td["observation"])


def test_action_repeat_sums_rewards_and_time_limit_truncates():
    env1 = DMControlEnv("cartpole", "balance")
    env4 = DMControlEnv("cartpole", "balance", action_repeat=4)
    env1.set_seed(0), env4.set_seed(0)
    a = torch.full((1, 1), 0.3)
    td1, td4 = env1.reset().set("action", a), env4.reset().set("action", a)
    total = 0.0
    for _ in range(4):
        td1 = env1.step(td1)
        total += float(td1["next", "reward"])
        td1 = td1["next"].exclude("reward").set("action", a)
    out4 = env4.step(td4)
    assert float(out4["next", "reward"]) == pytest.approx(total, rel=1e-5)
    assert torch.equal(out4["next", "observation"], td1["observation"])
    # the suite's 1000-step limit: 250 steps of 4 end in a truncation, not a termination
    roll = env4.rollout(300, break_when_any_done=True)
    assert roll.batch_size == (1, 250)
    assert bool(roll["next", "truncated"][0, -1]) and not bool(roll["next", "terminated"].any())


def test_partial_reset_keeps_the_other_rows():
    env = DMControlEnv("reacher", "easy", num_envs=2)
    env.set_seed(1)
    td = env.step(env.rand_action(env.reset()))["next"]
    before = td["observation"].clone()
    td.set("_reset", torch.tensor([[True], [False]]))
    out = env.reset(td)
    assert torch.equal(out["observation"][1], before[1])
    assert not torch.equal(out["observation"][0], before[0])


def test_per_key_observations_and_pixels():
    env = DMControlEnv("cartpole", "swingup", flatten=False, pixels=True, pixels_size=32)
    check_env_specs(env, max_steps=2, seed=0)
    td = env.reset()
    assert td["position"].shape == (1, 3) and td["velocity"].shape == (1, 2)
    assert "observation" not in td.keys()
    px = td["pixels"]
    assert px.shape == (1, 32, 32, 3) and px.dtype == torch.uint8 and int(px.max()) > int(px.min())


def test_bad_ids_and_arguments():
    assert parse_dmc_id("dmc/ball_in_cup-catch") == ("ball_in_cup", "catch")
    with pytest.raises(ValueError, match="dmc/<domain>-<task>"):
        parse_dmc_id("dmc/cartpole")
    with pytest.raises(ValueError, match="not a suite task"):
        DMControlEnv("cartpole", "fly")
    with pytest.raises(ValueError, match="action_repeat"):
        DMControlEnv("cartpole", "balance", action_repeat=0)
    env = DMControlEnv("cartpole", "balance")
    with pytest.raises(ValueError, match="expects an action of shape"):
        env.step(env.reset().set("action", torch.zeros(1, 2)))
