"""Checkpoints of the multi-agent loops: resume a run inside a pair, evaluate or render from one.

A checkpoint (core's :class:`~tdrl.core.train.Checkpointer`: atomic, checksummed, loads with
``weights_only=True``) holds every group's loss (actor, critics, Q networks, mixers, their
targets, SAC temperatures, value norms) and policy (its exploration schedule: epsilon or
sigma and the frames it has counted), the optimiser, the replay buffer (off-policy: its
transitions, cursor and sampler), the RNG states (Python, numpy, torch), the iteration, the
frame count and the history so far.

The simulator state is not saved (VMAS worlds and PettingZoo games cannot be serialised):
a resumed run resets its envs, so the episodes that were running when the checkpoint was
written start again; everything the learner holds continues exactly.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from tensordict.nn import InteractionType, set_interaction_type

from tdrl.core.train import Checkpointer

__all__ = ["training_objects", "save_training", "keep_record", "resume_training", "load_parts", "render_episode"]


def training_objects(groups: Mapping[str, Any], optimizer: torch.optim.Optimizer, buffer=None) -> dict[str, Any]:
    """What an exact resume needs, by checkpoint name: ``<group>/loss``, ``<group>/policy``,
    ``optimizer`` and (off-policy) ``buffer``."""
    objects: dict[str, Any] = {}
    for g, p in groups.items():
        objects[f"{g}/loss"], objects[f"{g}/policy"] = p.loss, p.policy
    objects["optimizer"] = optimizer
    if buffer is not None:
        objects["buffer"] = buffer
    return objects


def save_training(checkpoint: Checkpointer, it: int, frames: int, history: list[dict],
                  objects: Mapping[str, Any]) -> Path:
    """Write ``step_<frames>.pt`` after iteration ``it`` (RNG states included)."""
    return checkpoint.save(frames, extra={"iter": it, "frames": frames, "history": history}, **objects)


def keep_record(rec: dict, history: list[dict], it: int, frames: int, n_iters: int, log, checkpoint: Checkpointer | None,
                checkpoint_every: int, objects: Mapping[str, Any]) -> None:
    """The end of an iteration of both loops: append ``rec`` to ``history``, hand it to ``log``
    (when given) and, with a ``checkpoint``, save every ``checkpoint_every`` iterations and after
    the last of ``n_iters``."""
    history.append(rec)
    if log is not None:
        log(rec)
    if checkpoint is not None and ((it + 1) % checkpoint_every == 0 or it == n_iters - 1):
        save_training(checkpoint, it, frames, history, objects)


def resume_training(checkpoint: Checkpointer | None, resume: bool,
                    objects: Mapping[str, Any]) -> tuple[int, int, list[dict]]:
    """``(first iteration, frames, history)``: from the newest checkpoint with ``resume`` and one
    exists (its objects and RNG states restored in place), else ``(0, 0, [])``."""
    if checkpoint is None or not resume or checkpoint.latest() is None:
        return 0, 0, []
    extra = checkpoint.load(**objects)["extra"]
    return int(extra["iter"]) + 1, int(extra["frames"]), list(extra["history"])


def load_parts(path: str | os.PathLike, parts: Mapping[str, Any]) -> dict:
    """Load the networks (losses and policies) of a checkpoint into freshly built ``parts``
    (``{group: parts}`` from :func:`~tdrl.marl.algorithms.make_groups` with the run's settings)
    for evaluation or rendering; the optimiser, buffer and RNG states are left alone.

    Returns:
        The checkpoint's ``extra`` (``iter``, ``frames``, ``history``).
    """
    path = Path(path)
    objects = {}
    for g, p in parts.items():
        objects[f"{g}/loss"], objects[f"{g}/policy"] = p.loss, p.policy
    return Checkpointer(path.parent).load(path, restore_rng=False, **objects)["extra"]


def render_episode(env, policy, path: str | os.PathLike, max_steps: int, env_index: int = 0, fps: int = 20) -> Path:
    """Run one deterministic episode of ``policy`` and write sub-env ``env_index``'s frames to a
    video file (``.gif``; ``.mp4`` with ``imageio-ffmpeg`` installed).

    Args:
        env: an env with ``render(env_index) -> [H, W, 3]`` uint8 (:class:`~tdrl.marl.envs.VmasEnv`,
            which renders on the CPU).
        policy: the joint policy (evaluated with deterministic actions).
        path: the file to write; max_steps: at most this many steps (the episode may end first).

    Returns:
        The path written.
    """
    from .._optional import require
    from ..keys import DONE, NEXT

    imageio = require("imageio.v2", extra="apps", what="render_episode (writing a video file)", pip_name="imageio")

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    frames = []
    with torch.no_grad(), set_interaction_type(InteractionType.DETERMINISTIC):
        td = env.reset()
        frames.append(env.render(env_index))
        for _ in range(max_steps):
            td = env.step(policy(td))
            frames.append(env.render(env_index))
            if bool(td.get((NEXT, DONE)).reshape(-1)[env_index]):
                break
            td = td.get(NEXT)
    if path.suffix == ".gif":
        imageio.mimsave(path, frames, duration=1000 / fps, loop=0)
    else:
        imageio.mimsave(path, frames, fps=fps)
    return path
