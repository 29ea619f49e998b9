"""The on-policy loop for MAPPO / IPPO: collect -> advantage -> epochs x minibatches, one
record per iteration (frames, mean training episode return, evaluation return, wall time)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

import torch
from tensordict import TensorDictBase

from tdrl.core.train import Checkpointer
from tdrl.core.objectives import total_loss
from tdrl.core.train.seeds import SeedAxis

from ..algorithms import OnPolicyParts
from ..keys import GROUP, NEXT, VALUE_TARGET
from .restore import keep_record, resume_training, training_objects
from .common import (TrainConfig, as_groups, group_returns, is_recurrent, seed_axis,
                     joint_policy, record, seed_returns, start_collection)

__all__ = ["on_policy_optimizer", "on_policy_update", "train_on_policy"]


def on_policy_optimizer(groups: Mapping[str, OnPolicyParts], cfg: TrainConfig
                        ) -> tuple[torch.optim.Adam, list[list[torch.Tensor]]]:
    """Adam over every group's loss parameters, and the parameter lists clipped separately.

    Args:
        groups: ``{group: parts}`` (one bundle: ``{"agents": parts}``).
        cfg: learning rate and Adam epsilon.

    Returns:
        ``(optimizer, clip_groups)``: ``clip_groups`` holds, per group, its actor parameters
        and its critic parameters (BenchMARL steps one optimiser per group and loss term).
    """
    params, clip_groups = [], []
    for p in groups.values():
        own = [q for q in p.loss.parameters() if q.requires_grad and all(q is not r for r in params)]
        critic_ids = {id(q) for q in p.critic.parameters()}
        params += own
        clip_groups += [[q for q in own if id(q) not in critic_ids], [q for q in own if id(q) in critic_ids]]
    return torch.optim.Adam(params, lr=cfg.lr, eps=cfg.adam_eps), clip_groups


def _check_masks(batch: TensorDictBase, groups: Mapping[str, OnPolicyParts], axis: SeedAxis) -> None:
    """With several seeds every agent must act at every step (the loss means mix seeds otherwise)."""
    for g, p in groups.items():
        mask = batch.get(p.loss.tensor_keys.mask, None)
        if axis.stacked and mask is not None and not bool(mask.all()):
            raise ValueError(
                f"n_seeds={axis.n} needs every agent of every seed acting at every step, but group {g!r}'s "
                f"mask {p.loss.tensor_keys.mask} has False entries (agents that left or wait their "
                "turn): each seed's loss would be weighted by its share of acting agents. Train "
                "these seeds one after another."
            )


def on_policy_update(batch: TensorDictBase, groups: Mapping[str, OnPolicyParts], optimizer: torch.optim.Optimizer,
                     clip_groups: Sequence[Sequence[torch.Tensor]], cfg: TrainConfig, n_seeds: int | SeedAxis = 1) -> float:
    """One iteration's learning on a collected ``batch``: advantages, then epochs x minibatches.

    Args:
        batch: transitions ``[*env_batch, T]`` from :func:`collect`; the env's sub-envs are
            ``n_seeds`` seed-major blocks.
        groups: ``{group: parts}``; each group's estimator writes its advantage into
            ``batch``, and one optimiser step takes the sum of the groups' losses.
        optimizer, clip_groups: from :func:`on_policy_optimizer`.
        cfg: ``num_epochs``, ``minibatch_size`` (frames per seed) and ``max_grad_norm``.
            With recurrent parts a minibatch is ``minibatch_size // T`` whole sub-env
            trajectories ``[mb, T]`` per seed (at least one), so that the GRUs replay the
            rollout with its resets.
        n_seeds: the seeds stacked in the networks (a count or a
            :class:`~tdrl.core.train.SeedAxis`): each minibatch takes the same
            ``minibatch_size`` positions from every seed's block, the loss is scaled so each
            seed gets its own mean-loss gradient, and gradients are clipped per seed.

    Returns:
        The mean loss over the minibatches. The epoch permutations come from torch's global
        generator, so a seeded call is reproducible.
    """
    axis = SeedAxis.of(n_seeds)
    for g, p in groups.items():
        p.estimator(batch)
        if p.loss.value_norm is not None:
            p.loss.value_norm.update(batch.get((g, VALUE_TARGET)))
    # the losses read the root only: drop "next" so each minibatch gathers half the data; rows in
    # seed-major blocks [n, N] (recurrent: GRUs replay whole trajectories, a row is a sub-env's [T])
    root, frames_per_row = batch.exclude(NEXT), batch.shape[-1] if is_recurrent(groups) else 1
    flat = axis.split(root.reshape(-1, batch.shape[-1]) if frames_per_row > 1 else root.reshape(-1))
    _check_masks(flat, groups, axis)
    n = flat.shape[1]
    mb = min(max(1, cfg.minibatch_size // frames_per_row), n)
    losses = []
    for _ in range(cfg.num_epochs):
        perm = torch.randperm(n)
        for start in range(0, n - mb + 1, mb):
            sub = flat[:, perm[start:start + mb]].flatten(0, 1)
            loss = sum(total_loss(p.loss(sub)) for p in groups.values())
            optimizer.zero_grad(set_to_none=True)
            axis.backward(loss)
            if cfg.max_grad_norm is not None:
                for params in clip_groups:
                    if params:
                        axis.clip_grad_norm_(params, cfg.max_grad_norm)
            optimizer.step()
            losses.append(loss.detach())
    return float(torch.stack(losses).mean())


def train_on_policy(env, parts: OnPolicyParts | Mapping[str, OnPolicyParts], cfg: TrainConfig, eval_env=None,
                    group: str = GROUP, log: Callable[[dict], None] | None = None, n_seeds: int | SeedAxis = 1,
                    checkpoint: Checkpointer | None = None, checkpoint_every: int = 1,
                    resume: bool = False) -> list[dict]:
    """MAPPO / IPPO: collect ``frames_per_batch``, GAE, ``num_epochs`` x minibatches of PPO.

    ``parts`` is one group's bundle (trained on ``group``) or ``{group: bundle}`` from
    :func:`~tdrl.marl.algorithms.make_groups`: the groups' policies act together, each group
    gets its own advantage and loss, one optimiser steps the sum of the losses on the same
    minibatch, and gradients are clipped per group and per actor / critic (as BenchMARL,
    which has one optimiser per group and loss term).

    ``n_seeds`` (a count or a :class:`~tdrl.core.train.SeedAxis`): with several seeds the parts come from
    :func:`~tdrl.marl.vectorised.make_vectorised_groups` (or ``make_vectorised_on_policy``),
    the env's sub-envs are ``n_seeds`` seed-major blocks and every parameter is stacked over
    seeds (see :mod:`tdrl.marl.vectorised`; any number of groups; recurrent parts too): each
    minibatch takes ``minibatch_size`` frames from every seed (recurrent: the same number of whole
    sub-env trajectories from every seed's block), the loss is scaled so each seed gets its own
    mean-loss gradient, and gradients are clipped per seed. ``frames_per_batch`` is per seed.
    Value normalisation, ``normalize_advantage`` and agent masks with False entries are
    refused there (their statistics would mix the seeds).

    ``checkpoint`` / ``checkpoint_every`` / ``resume``: as :func:`~tdrl.marl.loops.train_off_policy`
    (losses with actors, critics and value norms, policies, the optimiser, RNG states).

    Returns:
        One record per iteration: ``iter``, ``frames``, ``time_s``, ``train_return``,
        ``eval_return`` (NaN when not evaluated) and, when evaluated, ``eval_episode_returns``
        (one return per evaluation sub-env, seed-major) and ``eval_episode_returns/<group>``
        (each group's), ``loss``; with several groups also
        ``train_return/<group>`` and ``eval_return/<group>`` (the plain entries are the mean
        over groups); with several seeds, ``train_return_seeds`` and (when evaluated)
        ``eval_return_seeds``: one entry per seed.
    """
    groups = as_groups(parts, group)
    axis, n_envs = seed_axis(env, eval_env, groups, n_seeds)
    n_steps = max(1, cfg.frames_per_batch // n_envs)
    policy = joint_policy(groups)
    opt, clip_groups = on_policy_optimizer(groups, cfg)
    objects = training_objects(groups, opt)
    start, frames, history = resume_training(checkpoint, resume, objects)
    collector, trackers = start_collection(env, groups, policy, n_steps)
    t0 = time.perf_counter()
    for it in range(start, cfg.n_iters):
        batch = collector.rollout()
        frames += batch.numel() // axis.n
        returns, extra = group_returns(trackers, batch)
        extra.update(axis.seed_values("train_return", seed_returns(trackers, axis, n_envs)))
        extra["loss"] = on_policy_update(batch, groups, opt, clip_groups, cfg, axis)
        rec = record(it, frames, t0, returns, eval_env, policy, cfg, groups, extra, axis)
        keep_record(rec, history, it, frames, cfg.n_iters, log, checkpoint, checkpoint_every, objects)
    return history
