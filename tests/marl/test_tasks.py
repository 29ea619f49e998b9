"""The runner's VMAS tasks are BenchMARL's task configs and keep the data contract.

The expected values below are typed in again from BenchMARL's YAMLs
(``benchmarl/conf/task/vmas/<task>.yaml`` at commit 179a956), independently of
``tdrl.marl.tasks``, and compared with what the built VMAS scenario holds.
"""

from __future__ import annotations

import pytest
import torch

from tdrl.core.envs import check_env_specs
from tdrl.marl.envs import VmasEnv
from tdrl.marl.objectives import multi_agent_gae
from tdrl.marl.runner import TASKS

BENCHMARL_YAML = {
    "balance": {"max_steps": 100, "n_agents": 4, "random_package_pos_on_line": True, "package_mass": 5},
    "navigation": {"max_steps": 100, "n_agents": 3, "collisions": True, "agents_with_same_goal": 1,
                   "split_goals": False, "observe_all_goals": False, "shared_rew": False,
                   "lidar_range": 0.35, "agent_radius": 0.1},
    "transport": {"max_steps": 100, "n_agents": 4, "n_packages": 1, "package_width": 0.15,
                  "package_length": 0.15, "package_mass": 50},
    "wheel": {"max_steps": 100, "n_agents": 4, "line_length": 1, "line_mass": 30, "desired_velocity": 0.05},
    "sampling": {"max_steps": 100, "n_agents": 3, "shared_rew": False, "n_gaussians": 3, "lidar_range": 0.2,
                 "cov": 0.05, "collisions": True, "spawn_same_pos": False},
}


def _runner_env(task: str, num_envs: int = 2, max_steps: int | None = None) -> VmasEnv:
    t = TASKS[task]
    return VmasEnv(t["scenario"], num_envs=num_envs, max_steps=max_steps or t["max_steps"], seed=0,
                   **t["kwargs"])


def _read_back(env: VmasEnv, name: str):
    """A scenario parameter as the built VMAS world holds it."""
    if name == "max_steps":
        return env.max_steps
    if name == "n_agents":
        return env.n_agents
    if name == "line_mass":  # wheel keeps it on the line entity only
        return env.scenario.line.mass
    return getattr(env.scenario, name)


def test_the_runner_offers_exactly_the_checked_tasks():
    assert set(TASKS) == set(BENCHMARL_YAML)


@pytest.mark.parametrize("task", sorted(BENCHMARL_YAML))
def test_task_builds_the_benchmarl_scenario(task):
    env = _runner_env(task)
    expected = BENCHMARL_YAML[task]
    got = {name: _read_back(env, name) for name in expected}
    assert got == expected
    # nothing beyond the YAML is set (the rest stays VMAS's default, as in BenchMARL)
    assert set(TASKS[task]["kwargs"]) | {"max_steps"} == set(expected)
    assert TASKS[task]["source"].endswith(f"benchmarl/conf/task/vmas/{task}.yaml")


@pytest.mark.parametrize("task", sorted(BENCHMARL_YAML))
def test_task_rollout_keeps_the_data_contract(task):
    """Rewards are ``[B, T, n_agents, 1]`` for every scenario (``wheel`` returns ``[B, 1]`` per
    agent from VMAS, which used to leak through as ``[B, T, n, 1, 1]``)."""
    env = _runner_env(task, max_steps=4)
    check_env_specs(env, max_steps=3)
    td = env.rollout(3, break_when_any_done=False)
    n = BENCHMARL_YAML[task]["n_agents"]
    assert td["next", "agents", "reward"].shape == (2, 3, n, 1)
    assert td["next", "done"].shape == (2, 3, 1)


def test_navigation_rewards_are_per_agent_as_in_benchmarl():
    """``shared_rew=False``: the agents' rewards differ (VMAS's default gives one shared reward)."""
    env = _runner_env("navigation", num_envs=8)
    td = env.rollout(5, break_when_any_done=False)
    r = td["next", "agents", "reward"]
    assert not torch.equal(r, r[..., :1, :].expand_as(r))


def test_a_misspelt_scenario_kwarg_is_refused():
    with pytest.raises(ValueError, match=r"'navigation' does not take.*lidar_rnage"):
        VmasEnv("navigation", num_envs=1, n_agents=2, lidar_rnage=0.3)


def test_gae_names_an_input_of_the_wrong_rank():
    t, n = (2, 3), 4
    per_agent = torch.zeros(*t, n, 1)
    done = torch.zeros(*t, 1, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"reward has shape \(2, 3, 4, 1, 1\)"):
        multi_agent_gae(per_agent.unsqueeze(-1), per_agent, per_agent, done, done, 0.9, 0.9,
                        n_agents=n, time_shape=t)
    adv, target = multi_agent_gae(torch.ones(*t, 1), per_agent, per_agent, done, done, 0.5, 1.0,
                                  n_agents=n, time_shape=t)
    # shared reward 1, zero values, gamma 0.5: the targets are 1 + 0.5 + 0.25, 1 + 0.5, 1
    assert torch.allclose(target[0, :, 0, 0], torch.tensor([1.75, 1.5, 1.0]))
    assert adv.shape == (*t, n, 1)
