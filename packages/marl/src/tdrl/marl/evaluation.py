"""Evaluate-only and rendering from a benchmark checkpoint (``BenchConfig.checkpoint_iters``).

:func:`evaluate_checkpoint` rebuilds the networks of one (algorithm, task) run with the
benchmark's settings, loads a checkpoint written by the runner
(``<out_dir>/checkpoints/<algo>_<task>_seed<k>/step_<frames>.pt``), runs ``eval_envs``
deterministic episodes and, with ``video``, writes one more to a video file (VMAS renders on
the CPU). Nothing is trained and the run folder is not touched.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from .algorithms import ALGORITHMS, make_groups
from .loops import evaluate_groups, load_parts, render_episode
from .loops.common import joint_policy
from .runner import TASKS, BenchConfig, algorithm_config, task_env

__all__ = ["evaluate_checkpoint"]


def evaluate_checkpoint(cfg: BenchConfig, algorithm: str, task: str, path: str | os.PathLike, seed: int = 0,
                        video: str | os.PathLike | None = None) -> dict:
    """The deterministic evaluation of a checkpointed policy.

    Args:
        cfg: the benchmark's settings (networks, episode length, ``eval_envs``, device); its
            ``tasks`` spelling rules apply to ``task``.
        algorithm: a name from :data:`~tdrl.marl.algorithms.ALGORITHMS`.
        task: the task (any spelling the runner accepts).
        path: a checkpoint of one seed's run (vectorised seeds' checkpoints hold stacked
            networks: evaluate those with ``vectorise_seeds=false`` runs).
        seed: seeds the evaluation envs (``10_000 + seed``, as the runner's evaluations).
        video: also render one evaluation episode of sub-env 0 to this file (``.gif``;
            ``.mp4`` needs ``imageio-ffmpeg``).

    Returns:
        ``{"algorithm", "task", "checkpoint", "frames", "eval_return", "eval_episode_returns",
        "eval_return/<group>"..., "video"}``.
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"Unknown algorithm {algorithm!r}; valid: {', '.join(sorted(ALGORITHMS))}.")
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"No checkpoint {path}; the runner writes them with checkpoint_iters=N under "
                                "<out_dir>/checkpoints/<algo>_<task>_seed<k>/step_<frames>.pt.")
    task = BenchConfig(algorithms=(algorithm,), tasks=(task,), seeds=(seed,), out_dir=cfg.out_dir).tasks[0]
    max_steps = cfg.max_steps or TASKS[task]["max_steps"]
    continuous = ALGORITHMS[algorithm].continuous
    torch.manual_seed(seed)
    env = task_env(task, 1, continuous, seed, max_steps, cfg.device, cfg.recurrent)
    parts = make_groups(algorithm, env, algorithm_config(cfg, algorithm), num_cells=cfg.num_cells)
    try:
        extra = load_parts(path, parts)
    except (KeyError, RuntimeError) as err:
        raise ValueError(f"{path} does not fit {algorithm} on {task} with these settings (num_cells, recurrent, "
                         f"seeds stacked?): {str(err).splitlines()[0]}") from err
    policy = joint_policy(parts)
    eval_env = task_env(task, cfg.eval_envs, continuous, 10_000 + seed, max_steps, cfg.device, cfg.recurrent)
    per_group = evaluate_groups(eval_env, policy, max_steps, list(parts))
    per_env = torch.stack(list(per_group.values())).mean(0)
    out = {"algorithm": algorithm, "task": task, "checkpoint": str(path), "frames": extra.get("frames"),
           "eval_return": float(per_env.mean()), "eval_episode_returns": per_env.flatten().tolist(),
           **{f"eval_return/{g}": float(v.mean()) for g, v in per_group.items()}, "video": None}
    if video is not None:
        render_env = task_env(task, 1, continuous, 20_000 + seed, max_steps, cfg.device, cfg.recurrent)
        if not hasattr(render_env, "render"):
            raise ValueError(f"{task}: rendering is supported for VMAS tasks (their env renders on the CPU).")
        out["video"] = str(render_episode(render_env, policy, video, max_steps))
    return out
