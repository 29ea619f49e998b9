"""Training loops for the multi-agent algorithms: collect -> advantage -> epochs x minibatches.

``train_on_policy`` runs MAPPO/IPPO, ``train_off_policy`` (:mod:`tdrl.marl.trainer_off`, also
importable from here) runs QMIX/VDN; both collect with
core's :class:`~tdrl.core.collectors.Collector` (the env behind core's ``RewardSum`` on each
group's rewards, :func:`with_episode_returns`) and log one record per iteration (frames, mean
training episode return, evaluation return, wall time).
Episode returns are the sum over the episode of the agents' mean reward (BenchMARL's
``episode_reward`` mean over agents). Both loops take one group's parts or a mapping
``{group: parts}`` (:func:`~tdrl.marl.algorithms.make_groups`) for envs with several groups.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from tensordict import TensorDictBase
from tensordict.nn import InteractionType, set_interaction_type
from torch import nn

from tdrl.core import RewardSum, TransformedEnv
from tdrl.core.collectors import Collector
from tdrl.core.keys import EPISODE_REWARD
from tdrl.core.objectives import total_loss
from tdrl.core.train.seeds import clip_grad_norm_per_seed, per_seed, seed_of_env, stacked_seed_counts

from .algorithms import OnPolicyParts
from .keys import DONE, GROUP, IS_INIT, NEXT, REWARD, VALUE_TARGET

__all__ = ["TrainConfig", "collect", "with_episode_returns", "EpisodeReturns", "evaluate", "evaluate_per_env",
           "evaluate_groups", "GroupPolicies", "on_policy_optimizer", "on_policy_update", "train_on_policy"]
# train_off_policy is tdrl.marl.trainer_off's (``from tdrl.marl.trainer import train_off_policy`` still works)


@dataclass
class TrainConfig:
    """Budget and optimiser settings shared by the loops (BenchMARL's experiment config).

    Args:
        frames_per_batch: env frames (``num_envs x steps``) collected per iteration.
        n_iters: number of iterations.
        num_epochs: on-policy passes over each batch.
        minibatch_size: frames per gradient step (on-policy) / sampled transitions (off-policy).
        lr, adam_eps: Adam settings (BenchMARL's defaults).
        max_grad_norm: gradient-norm clipping, applied to the actor and the critic
            separately (as BenchMARL, which steps one optimiser per loss term); None: off.
        buffer_size: off-policy replay capacity (frames). n_optimizer_steps: off-policy
            gradient steps per iteration.
        eval_interval: evaluate every this many iterations (and after the last); 0: never.
        eval_episodes: deterministic evaluation episodes (one batch of ``eval_env``).
        check_team_reward: off-policy (QMIX/VDN) only: raise
            :class:`~tdrl.marl.checks.ZeroTeamRewardError` when, over the first batches, the
            team reward is exactly 0 wherever an agent is rewarded (a zero-sum game inside
            one group); False trains anyway.
    """

    frames_per_batch: int = 6000
    n_iters: int = 10
    num_epochs: int = 4
    minibatch_size: int = 400
    lr: float = 5e-5
    adam_eps: float = 1e-6
    max_grad_norm: float | None = 5.0
    buffer_size: int = 1_000_000
    n_optimizer_steps: int = 100
    eval_interval: int = 5
    max_steps: int = 100
    check_team_reward: bool = True

    def __post_init__(self) -> None:
        for name in ("frames_per_batch", "n_iters", "num_epochs", "minibatch_size", "n_optimizer_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"TrainConfig.{name} must be >= 1, got {getattr(self, name)}.")


def collect(env, policy: Callable, td: TensorDictBase, n_steps: int) -> tuple[TensorDictBase, TensorDictBase]:
    """Run ``policy`` for ``n_steps`` steps from the root ``td`` (sampling, no grad).

    A one-off rollout from a given root (tests, notebooks); the training loops collect with
    core's :class:`~tdrl.core.collectors.Collector`, whose batches hold the same steps.

    Returns:
        ``(batch, next_td)``: the transitions ``[*env_batch, n_steps]`` and the root to
        continue from (done sub-envs already reset).
    """
    steps = []
    with torch.no_grad(), set_interaction_type(InteractionType.RANDOM):
        for _ in range(n_steps):
            td = policy(td)
            stepped, td = env.step_and_maybe_reset(td)
            steps.append(stepped)
    return torch.stack(steps, dim=len(env.batch_size)), td


def with_episode_returns(env, groups: Sequence[str]):
    """``env`` behind core's :class:`~tdrl.core.RewardSum` on every group's per-agent reward:
    ``("next", group, "episode_reward")`` ``[*B, n_agents, 1]``, the running return of the
    episode, zeroed by the env's (partial) resets. An env that already writes it is returned
    as is.
    """
    spec = env.observation_spec
    keys = [(g, REWARD) for g in groups if (g, EPISODE_REWARD) not in spec.keys(True)]
    keys = [k for k in keys if k in env.full_reward_spec.keys(True)]
    return TransformedEnv(env, RewardSum(in_keys=keys)) if keys else env


class EpisodeReturns:
    """The returns of the episodes that ended in a batch, read from the ``RewardSum`` entry
    ``("next", group, "episode_reward")`` (:func:`with_episode_returns`) at the done steps.

    A group's return is the mean over its agents of their episode sums (BenchMARL's
    ``episode_reward`` mean over agents). After each ``update``, ``last_returns`` holds the
    returns (ordered by step, then sub-env) and ``last_envs`` the flat sub-env index of each.
    """

    def __init__(self, group: str = GROUP) -> None:
        self.group = group
        self.last_returns: list[float] = []
        self.last_envs: list[int] = []

    def update(self, batch: TensorDictBase) -> list[float]:
        ep = batch.get((NEXT, self.group, EPISODE_REWARD), None)  # [*B, T, n, 1]
        if ep is None:
            raise KeyError(f"The batch has no ('next', {self.group!r}, 'episode_reward'); collect from "
                           "with_episode_returns(env, groups) (core's RewardSum on the group rewards).")
        ep = ep.reshape(-1, batch.shape[-1], ep[(0,) * batch.ndim].numel()).mean(-1)  # [E, T]
        done = batch.get((NEXT, DONE)).reshape(ep.shape)
        t_idx, env_idx = done.T.nonzero(as_tuple=True)  # ordered by step, then sub-env
        self.last_returns = ep[env_idx, t_idx].tolist()
        self.last_envs = env_idx.tolist()
        return self.last_returns


def evaluate(env, policy: Callable, max_steps: int, group: str | Sequence[str] = GROUP) -> float:
    """Mean return of one deterministic episode per sub-env of ``env`` (at most ``max_steps``)."""
    return float(evaluate_per_env(env, policy, max_steps, group).mean())


def evaluate_per_env(env, policy: Callable, max_steps: int, group: str | Sequence[str] = GROUP) -> torch.Tensor:
    """Return ``[*env.batch_size]`` of one deterministic episode in every sub-env.

    With several groups, the return is the mean over groups of each group's return (the
    sum over the episode of the mean reward of its agents); :func:`evaluate_groups` gives
    them one by one.
    """
    per_group = evaluate_groups(env, policy, max_steps, [group] if isinstance(group, str) else group)
    return torch.stack(list(per_group.values())).mean(0)


@torch.no_grad()
def evaluate_groups(env, policy: Callable, max_steps: int, groups: Sequence[str]) -> dict[str, torch.Tensor]:
    """``{group: [*env.batch_size] returns}`` of one deterministic episode in every sub-env."""
    with set_interaction_type(InteractionType.DETERMINISTIC):
        td = env.reset()
        totals = {g: torch.zeros(env.batch_size, device=env.device) for g in groups}
        alive = torch.ones(env.batch_size, dtype=torch.bool, device=env.device)
        for _ in range(max_steps):
            td = env.step(policy(td))
            for g in groups:
                r = td.get((NEXT, g, REWARD)).reshape(*env.batch_size, -1).mean(-1)
                totals[g] += r * alive
            alive &= ~td.get((NEXT, DONE)).reshape(env.batch_size)
            if not bool(alive.any()):
                break
            td = td.get(NEXT).exclude(*[(g, REWARD) for g in groups])
    return totals


class GroupPolicies(nn.Module):
    """The policies of several agent groups applied in turn: one collection policy.

    Args:
        policies: ``{group: policy}``; each reads and writes its own group's keys.
    """

    def __init__(self, policies: Mapping[str, nn.Module]) -> None:
        super().__init__()
        self.policies = nn.ModuleDict(dict(policies))

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        for policy in self.policies.values():
            td = policy(td)
        return td


def _as_groups(parts, group: str) -> dict:
    """``{group: parts}`` from one bundle or a mapping of bundles (``make_groups``)."""
    if isinstance(parts, Mapping):
        if not parts:
            raise ValueError("parts is an empty mapping; pass one bundle or {group: bundle}.")
        return dict(parts)
    return {group: parts}


def _joint_policy(groups: dict) -> Callable:
    if len(groups) == 1:
        return next(iter(groups.values())).policy
    return GroupPolicies({g: p.policy for g, p in groups.items()})


def _returns(trackers: dict, batch: TensorDictBase) -> tuple[list[float], dict]:
    """Episode returns of the batch: the mean over groups, and ``train_return/<group>`` entries."""
    per_group = {g: t.update(batch) for g, t in trackers.items()}
    if len(per_group) == 1:
        return next(iter(per_group.values())), {}
    extra = {f"train_return/{g}": float(sum(r) / len(r)) if r else float("nan") for g, r in per_group.items()}
    counts = {len(r) for r in per_group.values()}
    mean = [sum(x) / len(x) for x in zip(*per_group.values())] if len(counts) == 1 else []
    return mean, extra


def _seed_returns(trackers: dict, n_seeds: int, n_envs: int) -> list[float]:
    """Mean return per seed of the episodes of the latest update (mean over groups; NaN: none
    ended). Sub-env ``i`` belongs to seed ``i // n_envs`` (seed-major blocks)."""
    per_group = []
    for t in trackers.values():
        sums, counts = [0.0] * n_seeds, [0] * n_seeds
        for ret, env_i in zip(t.last_returns, t.last_envs):
            sums[seed_of_env(env_i, n_envs)] += ret
            counts[seed_of_env(env_i, n_envs)] += 1
        per_group.append([s / c if c else float("nan") for s, c in zip(sums, counts)])
    return [sum(v) / len(v) for v in zip(*per_group)]


def _record(it, frames, t0, returns, eval_env, policy, cfg, groups, extra, n_seeds=1) -> dict:
    rec = {"iter": it, "frames": frames, "time_s": time.perf_counter() - t0,
           "train_return": float(sum(returns) / len(returns)) if returns else float("nan"),
           "eval_return": float("nan")}
    last = it == cfg.n_iters - 1
    if eval_env is not None and cfg.eval_interval and ((it + 1) % cfg.eval_interval == 0 or last):
        per_group = evaluate_groups(eval_env, policy, cfg.max_steps, list(groups))
        per_env = torch.stack(list(per_group.values())).mean(0)
        rec["eval_return"] = float(per_env.mean())
        rec["eval_episode_returns"] = per_env.flatten().tolist()  # seed-major with n_seeds > 1
        if len(per_group) > 1:
            rec.update({f"eval_return/{g}": float(v.mean()) for g, v in per_group.items()})
        if n_seeds > 1:  # eval_env holds n_seeds blocks of sub-envs, seed-major
            rec["eval_return_seeds"] = per_seed(per_env.flatten(), n_seeds).mean(-1).tolist()
    rec.update(extra)
    return rec


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


def _check_seeds(groups: Mapping[str, OnPolicyParts], n_seeds: int) -> None:
    """Every seed-stacked network of ``groups`` must hold ``n_seeds`` seeds (none when 1)."""
    for g, p in groups.items():
        found = stacked_seed_counts(p.loss)
        if n_seeds > 1 and found != {n_seeds}:
            raise ValueError(
                f"n_seeds={n_seeds}, but group {g!r} has networks stacked over {sorted(found) or 'no'} seeds; "
                "build the parts with make_vectorised_groups(..., seeds) with len(seeds) == n_seeds."
            )
        if n_seeds == 1 and found:
            raise ValueError(f"group {g!r} has networks stacked over {sorted(found)} seeds; pass n_seeds to "
                             "train_on_policy / train_off_policy.")
        if n_seeds > 1 and getattr(p.loss, "value_norm", None) is not None:
            raise ValueError("value normalisation is not supported with n_seeds > 1 (its statistics "
                             f"would be shared by the seeds; group {g!r}).")
        if n_seeds > 1 and getattr(p.loss.config, "normalize_advantage", False):
            raise ValueError("normalize_advantage=True is not supported with n_seeds > 1 (the minibatch "
                             f"statistics would mix the seeds; group {g!r}).")


def _check_masks(batch: TensorDictBase, groups: Mapping[str, OnPolicyParts], n_seeds: int) -> None:
    """With ``n_seeds > 1`` every agent must act at every step (the loss means mix seeds otherwise)."""
    for g, p in groups.items():
        mask = batch.get(p.loss.tensor_keys.mask, None)
        if n_seeds > 1 and mask is not None and not bool(mask.all()):
            raise ValueError(
                f"n_seeds > 1 needs every agent of every seed acting at every step, but group {g!r}'s "
                f"mask {p.loss.tensor_keys.mask} has False entries (agents that left or wait their "
                "turn): each seed's loss would be weighted by its share of acting agents. Train "
                "these seeds one after another."
            )


def _recurrent(groups: Mapping[str, OnPolicyParts]) -> bool:
    return any(getattr(p, "recurrent", False) for p in groups.values())


def _check_recurrent(env, groups: Mapping[str, OnPolicyParts], n_seeds: int) -> None:
    """Recurrent parts need ``is_init`` from the env and one seed per run."""
    if not _recurrent(groups):
        return
    if n_seeds > 1:
        raise ValueError(f"Recurrent (GRU) MAPPO/IPPO does not support n_seeds={n_seeds} (vectorised seeds); "
                         "train the seeds one after another.")
    if IS_INIT not in env.observation_spec.keys():
        raise ValueError("Recurrent (GRU) parts reset their hidden state where 'is_init' is True, but the env "
                         "does not write it; wrap it: TransformedEnv(env, InitTracker()) (tdrl.core).")


def on_policy_update(batch: TensorDictBase, groups: Mapping[str, OnPolicyParts], optimizer: torch.optim.Optimizer,
                     clip_groups: Sequence[Sequence[torch.Tensor]], cfg: TrainConfig, n_seeds: int = 1) -> float:
    """One iteration's learning on a collected ``batch``: advantages, then epochs x minibatches.

    Args:
        batch: transitions ``[*env_batch, T]`` from :func:`collect`; with ``n_seeds > 1``
            the env's sub-envs are ``n_seeds`` seed-major blocks.
        groups: ``{group: parts}``; each group's estimator writes its advantage into
            ``batch``, and one optimiser step takes the sum of the groups' losses.
        optimizer, clip_groups: from :func:`on_policy_optimizer`.
        cfg: ``num_epochs``, ``minibatch_size`` (frames per seed) and ``max_grad_norm``.
            With recurrent parts a minibatch is ``minibatch_size // T`` whole sub-env
            trajectories ``[mb, T]`` (at least one), so that the GRUs replay the rollout
            with its resets.
        n_seeds: seeds stacked in the networks: each minibatch takes the same
            ``minibatch_size`` positions from every seed's block, the loss is scaled so each
            seed gets its own mean-loss gradient, and gradients are clipped per seed.

    Returns:
        The mean loss over the minibatches. The epoch permutations come from torch's global
        generator, so a seeded call is reproducible.
    """
    for g, p in groups.items():
        p.estimator(batch)
        if p.loss.value_norm is not None:
            p.loss.value_norm.update(batch.get((g, VALUE_TARGET)))
    # the losses read the root only: drop "next" so each minibatch gathers half the data
    if _recurrent(groups):  # GRUs replay whole trajectories: minibatches of sub-envs [mb, T]
        flat, frames_per_row = batch.exclude(NEXT).reshape(1, -1, batch.shape[-1]), batch.shape[-1]
    else:  # seed-major blocks [n_seeds, N]
        flat, frames_per_row = per_seed(batch.exclude(NEXT).reshape(-1), n_seeds), 1
    _check_masks(flat, groups, n_seeds)
    n = flat.shape[1]
    mb = min(max(1, cfg.minibatch_size // frames_per_row), n)
    losses = []
    for _ in range(cfg.num_epochs):
        perm = torch.randperm(n)
        for start in range(0, n - mb + 1, mb):
            sub = flat[:, perm[start:start + mb]].flatten(0, 1)
            loss = sum(total_loss(p.loss(sub)) for p in groups.values())
            optimizer.zero_grad(set_to_none=True)
            (loss * n_seeds).backward()
            if cfg.max_grad_norm is not None:
                for params in clip_groups:
                    if n_seeds > 1:
                        clip_grad_norm_per_seed(params, cfg.max_grad_norm, n_seeds)
                    elif params:
                        torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
            optimizer.step()
            losses.append(loss.detach())
    return float(torch.stack(losses).mean())


def train_on_policy(env, parts: OnPolicyParts | Mapping[str, OnPolicyParts], cfg: TrainConfig, eval_env=None,
                    group: str = GROUP, log: Callable[[dict], None] | None = None, n_seeds: int = 1) -> list[dict]:
    """MAPPO / IPPO: collect ``frames_per_batch``, GAE, ``num_epochs`` x minibatches of PPO.

    ``parts`` is one group's bundle (trained on ``group``) or ``{group: bundle}`` from
    :func:`~tdrl.marl.algorithms.make_groups`: the groups' policies act together, each group
    gets its own advantage and loss, one optimiser steps the sum of the losses on the same
    minibatch, and gradients are clipped per group and per actor / critic (as BenchMARL,
    which has one optimiser per group and loss term).

    With ``n_seeds > 1`` the parts come from
    :func:`~tdrl.marl.vectorised.make_vectorised_groups` (or ``make_vectorised_on_policy``),
    the env's sub-envs are ``n_seeds`` seed-major blocks and every parameter is stacked over
    seeds (see :mod:`tdrl.marl.vectorised`; any number of groups): each minibatch takes
    ``minibatch_size`` frames from every seed, the loss is scaled so each seed gets its own
    mean-loss gradient, and gradients are clipped per seed. ``frames_per_batch`` is per seed.
    Value normalisation, ``normalize_advantage`` and agent masks with False entries are
    refused there (their statistics would mix the seeds).

    Returns:
        One record per iteration: ``iter``, ``frames``, ``time_s``, ``train_return``,
        ``eval_return`` (NaN when not evaluated) and, when evaluated, ``eval_episode_returns``
        (one return per evaluation sub-env, seed-major), ``loss``; with several groups also
        ``train_return/<group>`` and ``eval_return/<group>`` (the plain entries are the mean
        over groups); with ``n_seeds > 1``, ``train_return_seeds`` and (when evaluated)
        ``eval_return_seeds``: one entry per seed.
    """
    groups = _as_groups(parts, group)
    if n_seeds < 1:
        raise ValueError(f"n_seeds must be >= 1, got {n_seeds}.")
    if env.batch_size.numel() % n_seeds:
        raise ValueError(f"The env's {env.batch_size.numel()} sub-envs do not split into n_seeds={n_seeds} blocks.")
    _check_seeds(groups, n_seeds)
    _check_recurrent(env, groups, n_seeds)
    n_envs = env.batch_size.numel() // n_seeds
    n_steps = max(1, cfg.frames_per_batch // n_envs)
    policy = _joint_policy(groups)
    opt, clip_groups = on_policy_optimizer(groups, cfg)
    collector = Collector(with_episode_returns(env, list(groups)), policy,
                          frames_per_batch=n_steps * env.batch_size.numel())
    history, frames = [], 0
    trackers = {g: EpisodeReturns(g) for g in groups}
    t0 = time.perf_counter()
    for it in range(cfg.n_iters):
        batch = collector.rollout()
        frames += batch.numel() // n_seeds
        returns, extra = _returns(trackers, batch)
        if n_seeds > 1:
            extra["train_return_seeds"] = _seed_returns(trackers, n_seeds, n_envs)
        extra["loss"] = on_policy_update(batch, groups, opt, clip_groups, cfg, n_seeds)
        rec = _record(it, frames, t0, returns, eval_env, policy, cfg, groups, extra, n_seeds)
        history.append(rec)
        if log is not None:
            log(rec)
    return history


def __getattr__(name: str):
    """``train_off_policy`` lives in :mod:`tdrl.marl.trainer_off`; imported from here on first use."""
    if name == "train_off_policy":
        from .trainer_off import train_off_policy

        return train_off_policy
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
