"""BenchMARL's VMAS and PettingZoo task configurations, as data.

Each entry is BenchMARL's ``benchmarl/conf/task/<env>/<task>.yaml`` (facebookresearch/BenchMARL
at commit :data:`BENCHMARL_COMMIT`, 2025-07-21; the commit has 28 VMAS and 10
PettingZoo tasks), value for value:

* VMAS: ``max_steps`` is the episode length, every other entry is a keyword argument of the
  VMAS scenario of the same name;
* PettingZoo: ``task`` is the PettingZoo module (``simple_spread_v3``), every other entry is a
  keyword argument of its ``parallel_env``; ``max_cycles`` is also the episode length
  (BenchMARL's ``PettingZooClass.max_steps``).

Results of the runner are comparable with BenchMARL's only while these agree;
``tests/marl/test_tasks.py`` compares them with values typed in again from the YAMLs (and with
the YAMLs of an installed BenchMARL) and reads them back from the built scenarios.

Names: ``vmas/<task>`` and ``pettingzoo/<task>`` as BenchMARL's ``task=`` spells them, or the
bare name; a bare name that both have (``simple_spread``) means the VMAS task, as in the runner
before PettingZoo was added. :func:`resolve_task` turns any spelling into the runner's key.

Grouping: BenchMARL builds TorchRL's env wrappers, which group agents by name prefix
(``adversary_0`` -> ``adversary``); :func:`task_spec` says ``group_map="prefix"`` where that
gives several groups, and one group ``"agents"`` otherwise (same split, tdrl's group name).

One difference in semantics stays: BenchMARL hands ``max_steps`` to VMAS, whose time limit
TorchRL reports as ``terminated`` (no bootstrapping at the limit); :class:`~tdrl.marl.envs.VmasEnv`
reports it as ``truncated`` and the value estimators bootstrap there.
"""

from __future__ import annotations

__all__ = ["BENCHMARL_COMMIT", "BENCHMARL_VMAS_TASKS", "BENCHMARL_PETTINGZOO_TASKS", "TASK_NAMES",
           "benchmarl_source", "make_task_env", "resolve_task", "task_spec", "vmas_task"]

BENCHMARL_COMMIT = "179a95687c89e581eb14e471b4bb5b8a410c9324"
"""The BenchMARL commit the task values were copied from."""

BENCHMARL_VMAS_TASKS: dict[str, dict[str, object]] = {
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
"""``task -> BenchMARL's YAML values`` (``max_steps`` and the scenario kwargs); source:
``benchmarl/conf/task/vmas/<task>.yaml`` (:func:`benchmarl_source`)."""

BENCHMARL_PETTINGZOO_TASKS: dict[str, dict[str, object]] = {
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
"""``task -> BenchMARL's YAML values`` (``task``: the PettingZoo module; the rest: its kwargs);
source: ``benchmarl/conf/task/pettingzoo/<task>.yaml`` (:func:`benchmarl_source`)."""

_PREFIX_GROUPED = {
    "vmas": {"simple_adversary", "simple_crypto", "simple_push", "simple_speaker_listener",
             "simple_tag", "simple_world_comm"},
    "pettingzoo": {"simple_adversary", "simple_crypto", "simple_push", "simple_speaker_listener",
                   "simple_tag", "simple_world_comm"},
}
"""Tasks whose agent names carry several prefixes: TorchRL (hence BenchMARL) gives each prefix
its own group; the others have one group. Checked by ``tests/marl/test_tasks.py``."""

_ENVS = {"vmas": BENCHMARL_VMAS_TASKS, "pettingzoo": BENCHMARL_PETTINGZOO_TASKS}


def _key(env: str, name: str) -> str:
    """The runner's key: the bare name for VMAS (its tasks came first), ``pettingzoo/<name>``."""
    return name if env == "vmas" else f"{env}/{name}"


TASK_NAMES: tuple[str, ...] = tuple(_key(env, n) for env, tasks in _ENVS.items() for n in tasks)
"""Every task the runner accepts, by its key (``balance``, ..., ``pettingzoo/simple_spread``)."""


def benchmarl_source(task: str, env: str = "vmas") -> str:
    """The URL of BenchMARL's YAML for ``task`` of ``env`` at :data:`BENCHMARL_COMMIT`."""
    return (f"https://github.com/facebookresearch/BenchMARL/blob/{BENCHMARL_COMMIT}/"
            f"benchmarl/conf/task/{env}/{task}.yaml")


def resolve_task(name: str) -> str:
    """The runner's key for any spelling of a BenchMARL task.

    ``vmas/balance`` and ``balance`` -> ``balance``; ``pettingzoo/simple_spread`` ->
    ``pettingzoo/simple_spread``; a bare name only PettingZoo has (``waterworld``) ->
    ``pettingzoo/waterworld``.

    Raises:
        ValueError: no BenchMARL task of that name (the message lists them).
    """
    env, sep, bare = name.partition("/")
    if sep:
        if env in _ENVS and bare in _ENVS[env]:
            return _key(env, bare)
    else:
        for env, tasks in _ENVS.items():
            if name in tasks:
                return _key(env, name)
    listing = "; ".join(f"{env}/: {', '.join(sorted(tasks))}" for env, tasks in _ENVS.items())
    raise ValueError(f"No BenchMARL task {name!r}. Tasks (BenchMARL's spelling env/name, or the bare name; "
                     f"a bare name in both means VMAS): {listing}.")


def task_spec(name: str) -> dict:
    """``{"env", "name", "scenario", "max_steps", "kwargs", "group_map", "source"}`` of a task.

    Args:
        name: any spelling :func:`resolve_task` accepts.

    Returns:
        ``env`` (``"vmas"`` / ``"pettingzoo"``), the bare ``name``, the VMAS scenario or
        PettingZoo module, BenchMARL's episode length, the constructor kwargs (a fresh dict;
        PettingZoo's include ``max_cycles``), the grouping (``"prefix"`` or ``None``: one group)
        and the YAML's URL.
    """
    key = resolve_task(name)
    env, _, bare = key.rpartition("/")
    env = env or "vmas"
    values = dict(_ENVS[env][bare])
    if env == "vmas":
        scenario, max_steps = bare, values.pop("max_steps")
    else:
        scenario, max_steps = values.pop("task"), values["max_cycles"]
    return {"env": env, "name": bare, "scenario": scenario, "max_steps": max_steps, "kwargs": values,
            "group_map": "prefix" if bare in _PREFIX_GROUPED[env] else None,
            "source": benchmarl_source(bare, env)}


def vmas_task(task: str) -> dict:
    """:func:`task_spec` of a BenchMARL VMAS task (``{"scenario", "max_steps", "kwargs", "source", ...}``).

    Raises:
        KeyError: ``task`` is not one of :data:`BENCHMARL_VMAS_TASKS`.
    """
    if task.removeprefix("vmas/") not in BENCHMARL_VMAS_TASKS:
        raise KeyError(f"No BenchMARL VMAS task {task!r}; known: {', '.join(sorted(BENCHMARL_VMAS_TASKS))}.")
    return task_spec(f"vmas/{task.removeprefix('vmas/')}")


def make_task_env(name: str | dict, num_envs: int, continuous: bool, seed: int, max_steps: int | None = None,
                  device: str = "cpu"):
    """The task's env with ``num_envs`` sub-envs (batch size ``(num_envs,)``), as BenchMARL builds it.

    Args:
        name: any spelling :func:`resolve_task` accepts, or a :func:`task_spec` dict.
        num_envs: sub-envs: VMAS's vectorised worlds, or a :class:`~tdrl.core.envs.SerialEnv`
            of PettingZoo envs (sub-env ``i`` seeded ``seed + i``).
        continuous: continuous actions (MAPPO / IPPO) or discrete (QMIX / VDN), where the task
            offers both (BenchMARL's ``continuous_actions``); PettingZoo's multiwalker and
            waterworld are continuous only.
        seed: the first seed.
        max_steps: the episode length (``None``: BenchMARL's; PettingZoo's ``max_cycles``).
        device: where the VMAS worlds run and the TensorDicts live.

    Returns:
        A ``VmasEnv`` or a ``SerialEnv`` of ``PettingZooEnv`` (grouped as :func:`task_spec` says).
    """
    from .envs import PettingZooEnv, VmasEnv

    t = task_spec(name) if isinstance(name, str) else name
    max_steps = max_steps or t["max_steps"]
    if t["env"] == "vmas":
        return VmasEnv(t["scenario"], num_envs=num_envs, continuous_actions=continuous, max_steps=max_steps,
                       seed=seed, device=device, group_map=t["group_map"], **t["kwargs"])
    from tdrl.core.envs import SerialEnv

    kwargs = {**t["kwargs"], "max_cycles": max_steps}
    check_task_actions(t, continuous)
    if t["name"] in _CONTINUOUS_ONLY:
        _require_sisl(t["name"], t["scenario"])
    else:
        kwargs["continuous_actions"] = continuous
    return SerialEnv(num_envs, PettingZooEnv, [
        {"task": t["scenario"], "seed": seed + i, "group_map": t["group_map"], "device": device, **kwargs}
        for i in range(num_envs)], device=device)


_CONTINUOUS_ONLY = {"multiwalker", "waterworld"}
"""PettingZoo tasks without discrete actions (BenchMARL's ``PettingZooClass.supports_discrete_actions``)."""


def check_task_actions(name: str | dict, continuous: bool, algorithm: str | None = None) -> None:
    """Refuse a task that has no actions of the kind asked for (the one home of this check:
    :func:`make_task_env` calls it, and the runner calls it for every pair before any training).

    Every VMAS task and every PettingZoo MPE task offers both kinds; multiwalker and waterworld
    are continuous only (as in BenchMARL).

    Raises:
        ValueError: ``continuous=False`` on a continuous-only task; names the algorithm.
    """
    t = task_spec(name) if isinstance(name, str) else name
    if not continuous and t["env"] == "pettingzoo" and t["name"] in _CONTINUOUS_ONLY:
        who = f"{algorithm} needs discrete actions, but " if algorithm else ""
        raise ValueError(f"{who}pettingzoo/{t['name']} has continuous actions only (as in BenchMARL); use an "
                         "algorithm for continuous actions (mappo, ippo, maddpg, iddpg, masac, isac), not a "
                         "discrete one (qmix, vdn, iql).")


def _require_sisl(name: str, module: str) -> None:
    """Refuse a SISL task whose module does not import (Box2D / pymunk missing, or a PettingZoo
    without it: 1.27 ships multiwalker but no waterworld), naming the cause."""
    import importlib

    try:
        importlib.import_module(f"pettingzoo.sisl.{module}")
    except ImportError as err:
        raise ModuleNotFoundError(
            f"pettingzoo/{name} needs pettingzoo.sisl.{module}, which does not import here ({err}): "
            "pip install 'pettingzoo[sisl]' (a PettingZoo release that ships it).") from err
