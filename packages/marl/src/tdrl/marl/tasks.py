"""BenchMARL's VMAS task configurations, as data.

Each entry is BenchMARL's ``benchmarl/conf/task/vmas/<task>.yaml`` (facebookresearch/BenchMARL
at commit :data:`BENCHMARL_COMMIT`, 2025-07-21), value for value: ``max_steps`` is the episode
length, every other entry is a keyword argument of the VMAS scenario. Results of the runner
are comparable with BenchMARL's only while these agree; ``tests/marl/test_tasks.py`` builds
every task and reads the values back from the VMAS scenario.

One difference in semantics stays: BenchMARL hands ``max_steps`` to VMAS, whose time limit
TorchRL reports as ``terminated`` (no bootstrapping at the limit); :class:`~tdrl.marl.envs.VmasEnv`
reports it as ``truncated`` and the value estimators bootstrap there.
"""

from __future__ import annotations

__all__ = ["BENCHMARL_COMMIT", "BENCHMARL_VMAS_TASKS", "benchmarl_source", "vmas_task"]

BENCHMARL_COMMIT = "179a95687c89e581eb14e471b4bb5b8a410c9324"
"""The BenchMARL commit the task values were copied from."""

BENCHMARL_VMAS_TASKS: dict[str, dict[str, object]] = {
    "balance": {
        "max_steps": 100, "n_agents": 4, "random_package_pos_on_line": True, "package_mass": 5,
    },
    "navigation": {
        "max_steps": 100, "n_agents": 3, "collisions": True, "agents_with_same_goal": 1,
        "split_goals": False, "observe_all_goals": False, "shared_rew": False, "lidar_range": 0.35,
        "agent_radius": 0.1,
    },
    "transport": {
        "max_steps": 100, "n_agents": 4, "n_packages": 1, "package_width": 0.15, "package_length": 0.15,
        "package_mass": 50,
    },
    "wheel": {
        "max_steps": 100, "n_agents": 4, "line_length": 1, "line_mass": 30, "desired_velocity": 0.05,
    },
    "sampling": {
        "max_steps": 100, "n_agents": 3, "shared_rew": False, "n_gaussians": 3, "lidar_range": 0.2,
        "cov": 0.05, "collisions": True, "spawn_same_pos": False,
    },
}
"""``task -> BenchMARL's YAML values`` (``max_steps`` and the scenario kwargs)."""


def benchmarl_source(task: str) -> str:
    """The URL of BenchMARL's YAML for ``task`` at :data:`BENCHMARL_COMMIT`."""
    return (f"https://github.com/facebookresearch/BenchMARL/blob/{BENCHMARL_COMMIT}/"
            f"benchmarl/conf/task/vmas/{task}.yaml")


def vmas_task(task: str) -> dict:
    """``{"scenario", "max_steps", "kwargs", "source"}`` of a BenchMARL VMAS task.

    Args:
        task: a key of :data:`BENCHMARL_VMAS_TASKS` (the VMAS scenario of the same name).

    Returns:
        The scenario name, BenchMARL's episode length, the scenario kwargs (a fresh dict)
        and the YAML's URL.
    """
    if task not in BENCHMARL_VMAS_TASKS:
        raise KeyError(f"No BenchMARL VMAS task {task!r}; known: {', '.join(sorted(BENCHMARL_VMAS_TASKS))}.")
    values = dict(BENCHMARL_VMAS_TASKS[task])
    max_steps = values.pop("max_steps")
    return {"scenario": task, "max_steps": max_steps, "kwargs": values, "source": benchmarl_source(task)}
