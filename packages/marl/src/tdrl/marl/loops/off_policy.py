"""The off-policy loop (QMIX / VDN, MADDPG / IDDPG, MASAC / ISAC, IQL): collect with the
exploring policy -> store -> sampled TD updates, each followed by the soft target updates.

With several seeds (``n_seeds=``) they train as one vectorised model (:mod:`tdrl.core.train.seeds`,
parts from :func:`~tdrl.marl.vectorised.make_vectorised_groups`): the env holds ``n_seeds``
seed-major blocks of sub-envs, every network (Q networks, mixers, actors, critics) and its target
carries a leading seed dim (SAC's temperature: one per seed),
the replay storage holds seed-major items (:func:`~tdrl.core.train.seeds.to_seed_items`: item
``i`` is every seed's ``i``-th transition, or with recurrent Q networks every seed's ``i``-th
sub-env trajectory, so a seed samples only its own data, the same slots for all), gradients are clipped per seed and the exploration schedule (epsilon, Gaussian sigma) advances
by the frames of one seed. One random generator draws for every seed (exploration coins and random actions,
replay slots), so a seed equals its single-seed run given the same data, not sample for sample.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

import torch
from tensordict import TensorDictBase

from tdrl.core.objectives import SoftUpdate, total_loss
from tdrl.core.replay import LazyTensorStorage, TensorDictReplayBuffer
from tdrl.core.train import Checkpointer
from tdrl.core.train.seeds import SeedAxis

from ..algorithms import OffPolicyParts
from ..checks import TeamRewardCheck
from ..keys import GROUP, NEXT, REWARD
from .restore import keep_record, resume_training, training_objects
from .common import (TrainConfig, as_groups, group_returns, is_recurrent, seed_axis,
                     joint_policy, record, seed_returns, start_collection)

__all__ = ["off_policy_optimizer", "off_policy_update", "train_off_policy"]


def _as_items(batch: TensorDictBase, steps: int) -> TensorDictBase:
    """A rollout ``[*envs, T]`` as replay items: one sub-env's ``T`` steps each (batch ``[envs]``,
    the time dim kept inside the entries, so that the replay does not flatten it)."""
    rows = batch.reshape(-1, steps)
    rows.batch_size = rows.batch_size[:1]
    return rows


def _as_sequences(sample: TensorDictBase, steps: int) -> TensorDictBase:
    """Sampled items of :func:`_as_items` -> trajectories ``[B, T]``."""
    short = [k for k, v in sample.items(True, True) if v.dim() < 2 or v.shape[1] != steps]  # e.g. the sampled "index"
    sample = sample.exclude(*short)
    sample.batch_size = (sample.batch_size[0], steps)
    return sample


def off_policy_optimizer(groups: Mapping[str, OffPolicyParts], cfg: TrainConfig
                         ) -> tuple[torch.optim.Adam, list[list[torch.Tensor]]]:
    """Adam over every group's trainable loss parameters (Q networks and mixer, actors, critics,
    temperatures; the targets are frozen), and the parameter lists whose gradient norms are
    clipped separately: per group, and per part of a loss that has ``clip_groups()`` (actor,
    critics, temperature: BenchMARL steps one optimiser per loss term, each clipped)."""
    clip_groups = []
    for p in groups.values():
        parts = getattr(p.loss, "clip_groups", None)
        clip_groups += parts() if parts is not None else [[q for q in p.loss.parameters() if q.requires_grad]]
    return torch.optim.Adam([q for ps in clip_groups for q in ps], lr=cfg.lr, eps=cfg.adam_eps), clip_groups


def off_policy_update(sample: TensorDictBase, groups: Mapping[str, OffPolicyParts], optimizer: torch.optim.Optimizer,
                      clip_groups: Sequence[Sequence[torch.Tensor]], targets: Sequence[SoftUpdate],
                      max_grad_norm: float | None, n_seeds: int | SeedAxis = 1) -> torch.Tensor:
    """One gradient step on sampled transitions, then every soft target update.

    Args:
        sample: transitions ``[n_seeds * B]``, seed-major (``from_seed_items`` of a replay
            sample; ``[B]`` with one seed).
        groups: ``{group: parts}``; one step takes the sum of the groups' losses.
        optimizer, clip_groups: from :func:`off_policy_optimizer`.
        targets: one :class:`~tdrl.core.objectives.SoftUpdate` per group.
        max_grad_norm: per group and per seed; None: off.
        n_seeds: the seeds stacked in the networks (a count or a
            :class:`~tdrl.core.train.SeedAxis`): the loss (a mean over every row) is scaled by
            ``n_seeds`` so that each seed's slice gets the gradient of its own mean loss.

    Returns:
        The (unscaled) loss, detached.
    """
    axis = SeedAxis.of(n_seeds)
    loss = sum(total_loss(p.loss(sample)) for p in groups.values())
    optimizer.zero_grad(set_to_none=True)
    axis.backward(loss)
    if max_grad_norm is not None:
        for params in clip_groups:
            if params:
                axis.clip_grad_norm_(params, max_grad_norm)
    optimizer.step()
    for target in targets:
        target.step()
    return loss.detach()


def train_off_policy(env, parts: OffPolicyParts | Mapping[str, OffPolicyParts], cfg: TrainConfig, eval_env=None,
                     group: str = GROUP, log: Callable[[dict], None] | None = None, n_seeds: int | SeedAxis = 1,
                     checkpoint: Checkpointer | None = None, checkpoint_every: int = 1,
                     resume: bool = False) -> list[dict]:
    """Off-policy training: collect with the exploring policy (epsilon-greedy, Gaussian noise, or
    SAC's sampling), store, ``n_optimizer_steps`` sampled TD updates with a soft target update
    after each (QMIX / VDN, MADDPG / IDDPG, MASAC / ISAC, IQL).

    ``parts`` is one group's bundle or ``{group: bundle}`` (one mixer per group, the sum of
    the groups' losses on the same sampled transitions, gradients clipped per group).

    ``n_seeds`` (a count or a :class:`~tdrl.core.train.SeedAxis`): with several seeds the parts come from
    :func:`~tdrl.marl.vectorised.make_vectorised_groups` (any off-policy algorithm), the env's
    sub-envs (and ``eval_env``'s) are ``n_seeds`` seed-major blocks and every network is
    stacked over the seeds: ``frames_per_batch``, ``buffer_size`` and ``minibatch_size`` are
    per seed, the replay storage keeps each seed's transitions apart (seed-major items), the
    exploration schedule advances by one seed's frames, gradients are clipped per seed and each
    seed's target networks follow its own online networks.

    Returns:
        One record per iteration: ``iter``, ``frames`` (per seed), ``time_s``,
        ``train_return``, ``eval_return`` (NaN when not evaluated), ``loss``, ``eps`` and, when
        evaluated, ``eval_episode_returns``; with several groups also ``train_return/<group>``
        and ``eval_return/<group>``; with several seeds, ``train_return_seeds`` and (when
        evaluated) ``eval_return_seeds``: one entry per seed.

    With ``checkpoint`` (core's ``Checkpointer``), every ``checkpoint_every`` iterations (and
    after the last) the losses, policies, optimiser, replay buffer and RNG states are saved
    (:mod:`tdrl.marl.loops.restore`); ``resume=True`` continues from the newest one, with the
    envs reset (the simulator state is not saved) and everything the learner holds restored.

    Raises:
        ZeroTeamRewardError: with ``cfg.check_team_reward``, when a group's team reward
            cancels out over the first batches (see :class:`~tdrl.marl.checks.TeamRewardCheck`).
        ValueError: ``n_seeds`` < 1, sub-envs (of ``env`` or ``eval_env``) that do not split
            into ``n_seeds`` blocks, or parts stacked over another number of seeds.
    """
    groups = as_groups(parts, group)
    axis, n_envs = seed_axis(env, eval_env, groups, n_seeds)
    n_steps = max(1, cfg.frames_per_batch // n_envs)
    policy = joint_policy(groups)
    opt, clip_groups = off_policy_optimizer(groups, cfg)
    targets = [SoftUpdate(p.loss, tau=p.config.tau) for p in groups.values()]
    # never more room than the run will fill (the storage allocates its capacity at the first write);
    # with several seeds an item holds every seed's transition, so the capacity is per seed
    capacity = min(cfg.buffer_size, cfg.n_iters * n_steps * n_envs)
    # recurrent Q networks train on whole trajectories: an item is one sub-env's batch of
    # n_steps steps (of every seed), and a sample holds minibatch_size frames' worth of them per
    # seed (BenchMARL's layout)
    seq = n_steps if is_recurrent(groups) else 0
    buffer = TensorDictReplayBuffer(storage=LazyTensorStorage(-(-capacity // seq) if seq else capacity))
    sample_size = -(-cfg.minibatch_size // seq) if seq else cfg.minibatch_size
    checks = {g: TeamRewardCheck(type(p.loss).__name__.removesuffix("Loss"), g, env)  # the mixers' team reward
              for g, p in groups.items() if cfg.check_team_reward and hasattr(p.loss, "team_reward")}
    explorers = list({id(p.explore): p.explore for p in groups.values() if p.explore is not None}.values())
    objects = training_objects(groups, opt, buffer)
    start, frames, history = resume_training(checkpoint, resume, objects)
    collector, trackers = start_collection(env, groups, policy, n_steps)
    t0 = time.perf_counter()
    for it in range(start, cfg.n_iters):
        batch = collector.rollout()
        new = batch.numel() // axis.n  # frames of one seed
        frames += new
        for g, check in checks.items():
            agent_reward = batch.get((NEXT, g, REWARD), None)
            if agent_reward is not None and check.active:
                check.update(agent_reward, groups[g].loss.team_reward(batch))
        for p in explorers:
            p.step(new)  # the same schedule for every seed: epsilon after this many frames of one run
        returns, extra = group_returns(trackers, batch)
        extra.update(axis.seed_values("train_return", seed_returns(trackers, axis, n_envs)))
        buffer.extend(axis.to_replay(_as_items(batch, n_steps) if seq else batch.reshape(-1)))  # seed-major
        losses = []
        for _ in range(cfg.n_optimizer_steps):
            sample = axis.from_replay(buffer.sample(sample_size))
            sample = _as_sequences(sample, seq) if seq else sample
            losses.append(off_policy_update(sample, groups, opt, clip_groups, targets, cfg.max_grad_norm, axis))
        extra.update({"loss": float(torch.stack(losses).mean()),
                      "eps": explorers[0].level if explorers else float("nan")})  # epsilon or sigma
        rec = record(it, frames, t0, returns, eval_env, policy, cfg, groups, extra, axis)
        keep_record(rec, history, it, frames, cfg.n_iters, log, checkpoint, checkpoint_every, objects)
    return history
