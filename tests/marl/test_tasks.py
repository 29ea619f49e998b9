"""The runner's tasks are BenchMARL's task configs (28 VMAS, 10 PettingZoo at the cited commit)
and keep the data contract.

The expected values below are BenchMARL's YAMLs (``benchmarl/conf/task/{vmas,pettingzoo}/<task>.yaml``
at commit 179a956, read from that commit's tree), kept apart from ``tdrl.marl.tasks`` and
compared with it; where a BenchMARL install sits in a peer venv (``.venv-benchmarl`` at the
repository root or beside it), its YAMLs are compared too. The VMAS scenarios are built with
every value (``VmasEnv`` refuses a kwarg the scenario ignores) and some are read back.
"""

from __future__ import annotations

import glob
import warnings
from pathlib import Path

import pytest
import torch

from tdrl.core.envs import check_env_specs
from tdrl.marl.envs import VmasEnv
from tdrl.marl.objectives import multi_agent_gae
from tdrl.marl.runner import TASKS, BenchConfig
from tdrl.marl.tasks import TASK_NAMES, make_task_env, resolve_task, task_spec

BENCHMARL_YAML = {
    "balance": {"max_steps": 100, "n_agents": 4, "random_package_pos_on_line": True, "package_mass": 5},
    "ball_passage": {"max_steps": 500, "n_passages": 1, "fixed_passage": False, "random_start_angle": True},
    "ball_trajectory": {"max_steps": 100, "joints": True},
    "buzz_wire": {"max_steps": 100, "random_start_angle": True, "collision_reward": -10},
    "discovery": {"max_steps": 100, "n_agents": 5, "n_targets": 7, "lidar_range": 0.35,
        "covering_range": 0.25, "agents_per_target": 2, "targets_respawn": True, "shared_reward": True},
    "dispersion": {"max_steps": 100, "n_agents": 4, "n_food": 4, "share_reward": True, "food_radius": 0.02,
        "penalise_by_time": False},
    "dropout": {"max_steps": 100, "n_agents": 4, "energy_coeff": 0.02, "start_same_point": False},
    "flocking": {"max_steps": 100, "n_agents": 4, "n_obstacles": 5, "collision_reward": -0.1},
    "football": {"max_steps": 500, "n_blue_agents": 3, "n_red_agents": 3, "ai_red_agents": True,
        "physically_different": False, "spawn_in_formation": False, "only_blue_formation": True,
        "formation_agents_per_column": 2, "randomise_formation_indices": False, "formation_noise": 0.2,
        "n_traj_points": 0, "ai_strength": 1.0, "ai_decision_strength": 1.0, "ai_precision_strength": 1.0,
        "agent_size": 0.025, "goal_size": 0.35, "goal_depth": 0.1, "pitch_length": 3.0, "pitch_width": 1.5,
        "ball_mass": 0.25, "ball_size": 0.02, "u_multiplier": 0.1, "enable_shooting": False,
        "u_rot_multiplier": 0.0003, "u_shoot_multiplier": 0.6, "shooting_radius": 0.08,
        "shooting_angle": 1.5708, "max_speed": 0.15, "ball_max_speed": 0.3, "dense_reward": True,
        "pos_shaping_factor_ball_goal": 10.0, "pos_shaping_factor_agent_ball": 0.1,
        "distance_to_ball_trigger": 0.4, "scoring_reward": 100.0, "observe_teammates": True,
        "observe_adversaries": True, "dict_obs": False},
    "give_way": {"max_steps": 100, "mirror_passage": False, "observe_rel_pos": False,
        "done_on_completion": False, "final_reward": 0.01},
    "joint_passage": {"max_steps": 500, "n_passages": 1, "fixed_passage": True, "joint_length": 0.5,
        "random_start_angle": True, "random_goal_angle": True, "observe_joint_angle": False,
        "asym_package": True, "mass_ratio": 5, "mass_position": 0.75},
    "joint_passage_size": {"max_steps": 500, "n_passages": 3, "fixed_passage": False,
        "random_start_angle": False, "random_goal_angle": False, "observe_joint_angle": False},
    "multi_give_way": {"max_steps": 200, "agent_collision_penalty": -0.1},
    "navigation": {"max_steps": 100, "n_agents": 3, "collisions": True, "agents_with_same_goal": 1,
        "split_goals": False, "observe_all_goals": False, "shared_rew": False, "lidar_range": 0.35,
        "agent_radius": 0.1},
    "passage": {"max_steps": 500, "n_passages": 1, "shared_reward": True},
    "reverse_transport": {"max_steps": 100, "n_agents": 4, "package_width": 0.6, "package_length": 0.6,
        "package_mass": 50},
    "sampling": {"max_steps": 100, "n_agents": 3, "shared_rew": False, "n_gaussians": 3, "lidar_range": 0.2,
        "cov": 0.05, "collisions": True, "spawn_same_pos": False},
    "simple_adversary": {"max_steps": 100, "n_agents": 3, "n_adversaries": 1},
    "simple_crypto": {"max_steps": 100, "dim_c": 4},
    "simple_push": {"max_steps": 100},
    "simple_reference": {"max_steps": 100},
    "simple_speaker_listener": {"max_steps": 100},
    "simple_spread": {"max_steps": 100, "n_agents": 3, "obs_agents": True},
    "simple_tag": {"max_steps": 100, "num_good_agents": 1, "num_adversaries": 3, "num_landmarks": 2,
        "shape_agent_rew": False, "shape_adversary_rew": False, "agents_share_rew": False,
        "adversaries_share_rew": True, "observe_same_team": True, "observe_pos": True, "observe_vel": True,
        "bound": 1.0, "respawn_at_catch": False},
    "simple_world_comm": {"max_steps": 100, "num_good_agents": 2, "num_adversaries": 4, "num_landmarks": 1,
        "num_food": 2, "num_forests": 2},
    "transport": {"max_steps": 100, "n_agents": 4, "n_packages": 1, "package_width": 0.15,
        "package_length": 0.15, "package_mass": 50},
    "wheel": {"max_steps": 100, "n_agents": 4, "line_length": 1, "line_mass": 30, "desired_velocity": 0.05},
    "wind_flocking": {"max_steps": 100, "horizon": 100, "dist_shaping_factor": 1, "vel_shaping_factor": 1,
        "wind_shaping_factor": 1, "rot_shaping_factor": 0, "pos_shaping_factor": 0,
        "energy_shaping_factor": 0, "wind": 0, "cover_angle_tolerance": 1, "observe_rel_pos": True,
        "observe_rel_vel": True, "observe_pos": False, "desired_vel": 0.4},
}

BENCHMARL_PETTINGZOO_YAML = {
    "multiwalker": {"task": "multiwalker_v9", "n_walkers": 3, "shared_reward": False, "max_cycles": 500,
        "position_noise": 0.001, "angle_noise": 0.001, "forward_reward": 1.0, "fall_reward": -10,
        "terminate_reward": -100, "terminate_on_fall": True, "remove_on_fall": True, "terrain_length": 200},
    "simple_adversary": {"task": "simple_adversary_v3", "N": 2, "max_cycles": 100},
    "simple_crypto": {"task": "simple_crypto_v3", "max_cycles": 100},
    "simple_push": {"task": "simple_push_v3", "max_cycles": 100},
    "simple_reference": {"task": "simple_reference_v3", "max_cycles": 100, "local_ratio": 0.5},
    "simple_speaker_listener": {"task": "simple_speaker_listener_v4", "max_cycles": 100},
    "simple_spread": {"task": "simple_spread_v3", "max_cycles": 100, "N": 3, "local_ratio": 0.5},
    "simple_tag": {"task": "simple_tag_v3", "num_good": 2, "num_adversaries": 3, "num_obstacles": 2,
        "max_cycles": 100},
    "simple_world_comm": {"task": "simple_world_comm_v3", "num_good": 2, "num_adversaries": 4,
        "num_obstacles": 1, "num_food": 2, "num_forests": 2, "max_cycles": 100},
    "waterworld": {"task": "waterworld_v4", "max_cycles": 500, "n_pursuers": 2, "n_evaders": 5,
        "n_poisons": 10, "n_obstacles": 1, "n_coop": 1, "n_sensors": 30, "sensor_range": 0.2,
        "radius": 0.015, "obstacle_radius": 0.1, "pursuer_max_accel": 0.5, "pursuer_speed": 0.2,
        "evader_speed": 0.1, "poison_speed": 0.1, "poison_reward": -1.0, "food_reward": 10.0,
        "encounter_reward": 0.01, "thrust_penalty": -0.5, "local_ratio": 1.0, "speed_features": True},
}


FIRST_FIVE = ("balance", "navigation", "sampling", "transport", "wheel")  # read back attribute by attribute


def _runner_env(task: str, num_envs: int = 2, max_steps: int | None = None) -> VmasEnv:
    t = TASKS[task]
    return VmasEnv(t["scenario"], num_envs=num_envs, max_steps=max_steps or t["max_steps"], seed=0,
                   group_map=t["group_map"], **t["kwargs"])


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
    assert len(BENCHMARL_YAML) == 28 and len(BENCHMARL_PETTINGZOO_YAML) == 10
    assert set(TASKS) == set(TASK_NAMES) == set(BENCHMARL_YAML) | {f"pettingzoo/{t}" for t in BENCHMARL_PETTINGZOO_YAML}


@pytest.mark.parametrize("task", sorted(BENCHMARL_YAML))
def test_vmas_task_values_are_benchmarls(task):
    t = TASKS[task]
    assert t["env"] == "vmas" and t["scenario"] == task
    assert {"max_steps": t["max_steps"], **t["kwargs"]} == BENCHMARL_YAML[task]
    assert t["source"].endswith(f"179a95687c89e581eb14e471b4bb5b8a410c9324/benchmarl/conf/task/vmas/{task}.yaml")


@pytest.mark.parametrize("task", sorted(BENCHMARL_PETTINGZOO_YAML))
def test_pettingzoo_task_values_are_benchmarls(task):
    t = TASKS[f"pettingzoo/{task}"]
    expected = BENCHMARL_PETTINGZOO_YAML[task]
    assert t["env"] == "pettingzoo" and t["scenario"] == expected["task"]
    assert {"task": t["scenario"], **t["kwargs"]} == expected
    assert t["max_steps"] == expected["max_cycles"]  # BenchMARL's PettingZooClass.max_steps
    assert t["source"].endswith(f"benchmarl/conf/task/pettingzoo/{task}.yaml")


def _peer_task_folder() -> Path | None:
    repo = Path(__file__).resolve().parents[2]
    for venv in (repo / ".venv-benchmarl", repo.parent / ".venv-benchmarl"):
        found = glob.glob(str(venv / "lib" / "python*" / "site-packages" / "benchmarl" / "conf" / "task"))
        if found:
            return Path(found[0])
    return None


def test_values_equal_an_installed_benchmarls_yaml():
    folder = _peer_task_folder()
    if folder is None:
        pytest.skip("no BenchMARL in a peer venv (.venv-benchmarl); the cited values are checked above")
    import yaml

    for env, tasks in (("vmas", BENCHMARL_YAML), ("pettingzoo", BENCHMARL_PETTINGZOO_YAML)):
        for task in tasks:
            values = yaml.safe_load((folder / env / f"{task}.yaml").read_text())
            values.pop("defaults", None)
            t = TASKS[task if env == "vmas" else f"pettingzoo/{task}"]
            ours = {"max_steps": t["max_steps"], **t["kwargs"]} if env == "vmas" else {"task": t["scenario"], **t["kwargs"]}
            assert ours == values, f"{env}/{task}"


def test_every_spelling_resolves_and_a_wrong_one_lists_the_tasks():
    assert resolve_task("vmas/balance") == resolve_task("balance") == "balance"
    assert resolve_task("pettingzoo/simple_spread") == "pettingzoo/simple_spread"
    assert resolve_task("simple_spread") == "simple_spread"  # in both: VMAS, as documented
    assert resolve_task("waterworld") == "pettingzoo/waterworld"  # PettingZoo only
    assert BenchConfig(tasks=("vmas/dispersion", "pettingzoo/simple_tag"), seeds=(0,)).tasks == (
        "dispersion", "pettingzoo/simple_tag")
    with pytest.raises(ValueError, match=r"No BenchMARL task 'vmas/waterworld'.*pettingzoo/: .*waterworld"):
        resolve_task("vmas/waterworld")
    with pytest.raises(ValueError, match=r"No BenchMARL task 'dispresion'"):
        BenchConfig(tasks=("dispresion",))


def test_vmas_env_without_max_steps_warns_that_episodes_never_end():
    with pytest.warns(UserWarning, match=r"without max_steps.*never end"):
        VmasEnv("balance", num_envs=1, n_agents=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        VmasEnv("balance", num_envs=1, n_agents=2, max_steps=5)


@pytest.mark.parametrize("task", sorted(BENCHMARL_YAML))
def test_every_vmas_task_builds_with_every_value(task):
    """``VmasEnv`` refuses a kwarg the scenario does not use, so a build proves each is consumed;
    the first five tasks also read each value back from the world."""
    env = _runner_env(task)
    assert env.max_steps == BENCHMARL_YAML[task]["max_steps"]
    # TorchRL (BenchMARL) groups by name prefix: several prefixes -> several groups
    prefixes = {n.rpartition("_")[0] for n in env.agent_names}
    assert len(env.group_map) == (len(prefixes) if TASKS[task]["group_map"] == "prefix" else 1)
    if TASKS[task]["group_map"] is None:
        assert len(prefixes) == 1
    if task in FIRST_FIVE:
        expected = BENCHMARL_YAML[task]
        assert {name: _read_back(env, name) for name in expected} == expected


@pytest.mark.parametrize("task", sorted(BENCHMARL_PETTINGZOO_YAML))
def test_every_pettingzoo_task_builds_grouped_as_torchrl(task):
    spec = task_spec(f"pettingzoo/{task}")
    try:
        env = make_task_env(spec, 2, continuous=True, seed=0, max_steps=3)
    except ModuleNotFoundError as err:  # multiwalker / waterworld need pettingzoo[sisl] (Box2D, pymunk)
        pytest.skip(f"pettingzoo/{task}: {err}")
    names = env.envs[0].agent_names
    prefixes = {n.rpartition("_")[0] for n in names}
    assert len(env.envs[0].group_map) == len(prefixes)  # one group is "agents" here, "agent" in TorchRL
    if len(prefixes) > 1:
        assert sorted(env.envs[0].group_map) == sorted(prefixes)
    td = env.rollout(4, break_when_any_done=False)
    assert td["next", "done"][:, :, 0].tolist() == [[False, False, True, False]] * 2  # max_cycles=3


@pytest.mark.parametrize("task", FIRST_FIVE)
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
