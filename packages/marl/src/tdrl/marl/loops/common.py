"""What both multi-agent training loops share: the budget (:class:`TrainConfig`), collection
through core's :class:`~tdrl.core.collectors.Collector` with per-group episode returns,
evaluation, the joint policy of several groups, and one metrics record per iteration.

Episode returns are the sum over the episode of the agents' mean reward (BenchMARL's
``episode_reward`` mean over agents). The loops take one group's parts or a mapping
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
from tdrl.core.keys import EPISODE_REWARD, IS_INIT
from tdrl.core.train.seeds import SeedAxis, seed_of_env

from ..algorithms import OnPolicyParts
from ..keys import DONE, GROUP, NEXT, REWARD

__all__ = ["TrainConfig", "collect", "with_episode_returns", "EpisodeReturns", "evaluate", "evaluate_per_env",
           "evaluate_groups", "GroupPolicies", "as_groups", "joint_policy", "group_returns", "seed_returns",
           "record", "check_seeds", "start_collection"]


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


def start_collection(env, groups: Mapping, policy: Callable, n_steps: int) -> tuple[Collector, dict]:
    """What both loops collect with: core's ``Collector`` on the env behind ``RewardSum`` on every
    group's reward (``n_steps`` steps of every sub-env per batch), and a per-group
    :class:`EpisodeReturns` tracker."""
    collector = Collector(with_episode_returns(env, list(groups)), policy,
                          frames_per_batch=n_steps * env.batch_size.numel())
    return collector, {g: EpisodeReturns(g) for g in groups}


def as_groups(parts, group: str) -> dict:
    """``{group: parts}`` from one bundle or a mapping of bundles (``make_groups``)."""
    if isinstance(parts, Mapping):
        if not parts:
            raise ValueError("parts is an empty mapping; pass one bundle or {group: bundle}.")
        return dict(parts)
    return {group: parts}


def joint_policy(groups: dict) -> Callable:
    if len(groups) == 1:
        return next(iter(groups.values())).policy
    return GroupPolicies({g: p.policy for g, p in groups.items()})


def group_returns(trackers: dict, batch: TensorDictBase) -> tuple[list[float], dict]:
    """Episode returns of the batch: the mean over groups, and ``train_return/<group>`` entries."""
    per_group = {g: t.update(batch) for g, t in trackers.items()}
    if len(per_group) == 1:
        return next(iter(per_group.values())), {}
    extra = {f"train_return/{g}": float(sum(r) / len(r)) if r else float("nan") for g, r in per_group.items()}
    counts = {len(r) for r in per_group.values()}
    mean = [sum(x) / len(x) for x in zip(*per_group.values())] if len(counts) == 1 else []
    return mean, extra


def seed_returns(trackers: dict, axis: SeedAxis, n_envs: int) -> list[float]:
    """Mean return per seed of the episodes of the latest update (mean over groups; NaN: none
    ended). Sub-env ``i`` belongs to seed ``i // n_envs`` (seed-major blocks)."""
    per_group = []
    for t in trackers.values():
        sums, counts = [0.0] * axis.n, [0] * axis.n
        for ret, env_i in zip(t.last_returns, t.last_envs):
            sums[seed_of_env(env_i, n_envs)] += ret
            counts[seed_of_env(env_i, n_envs)] += 1
        per_group.append([s / c if c else float("nan") for s, c in zip(sums, counts)])
    return [sum(v) / len(v) for v in zip(*per_group)]


def record(it, frames, t0, returns, eval_env, policy, cfg, groups, extra, axis: SeedAxis | None = None) -> dict:
    """One iteration's record; with several seeds (``axis``: seed-major blocks of ``eval_env``)
    also ``eval_return_seeds`` when evaluated."""
    axis = axis if axis is not None else SeedAxis.blocks(1)
    rec = {"iter": it, "frames": frames, "time_s": time.perf_counter() - t0,
           "train_return": float(sum(returns) / len(returns)) if returns else float("nan"),
           "eval_return": float("nan")}
    last = it == cfg.n_iters - 1
    if eval_env is not None and cfg.eval_interval and ((it + 1) % cfg.eval_interval == 0 or last):
        per_group = evaluate_groups(eval_env, policy, cfg.max_steps, list(groups))
        per_env = torch.stack(list(per_group.values())).mean(0)
        rec["eval_return"] = float(per_env.mean())
        rec["eval_episode_returns"] = per_env.flatten().tolist()  # seed-major blocks
        rec.update({f"eval_episode_returns/{g}": v.flatten().tolist() for g, v in per_group.items()})
        if len(per_group) > 1:
            rec.update({f"eval_return/{g}": float(v.mean()) for g, v in per_group.items()})
        rec.update(axis.seed_values("eval_return", axis.split(per_env.flatten()).mean(-1).tolist()))
    rec.update(extra)
    return rec


def check_seeds(groups: Mapping[str, OnPolicyParts], axis: SeedAxis) -> None:
    """Every seed-stacked network of ``groups`` must hold the axis's seeds (none for one seed),
    and nothing may pool statistics over the seeds."""
    for g, p in groups.items():
        axis.check_stacked(p.loss, f"group {g!r}")
        axis.refuse_shared(f"Group {g!r}'s value normalisation (its running statistics)",
                           getattr(p.loss, "value_norm", None) is not None, "set value_norm=None")
        axis.refuse_shared(f"Group {g!r}'s normalize_advantage=True (the minibatch statistics)",
                           getattr(getattr(p.loss, "config", None), "normalize_advantage", False),
                           "set normalize_advantage=False")


def seed_axis(env, eval_env, groups: Mapping, n_seeds: int | SeedAxis) -> tuple[SeedAxis, int]:
    """The run's :class:`~tdrl.core.train.SeedAxis` (``n_seeds``: a count or an axis) and the
    training env's sub-envs per seed, after every seed refusal of both loops: envs that do not
    split into one block per seed, parts stacked over another count, shared statistics, and
    recurrent parts without ``is_init``."""
    axis = SeedAxis.of(n_seeds)
    n_envs = axis.check_blocks(env.batch_size.numel(), "env")
    if eval_env is not None:
        axis.check_blocks(eval_env.batch_size.numel(), "eval_env")
    check_seeds(groups, axis)
    check_recurrent(env, groups)
    return axis, n_envs


def is_recurrent(groups: Mapping) -> bool:
    """Whether any group's parts have recurrent networks (they train on whole trajectories)."""
    return any(getattr(p, "recurrent", False) for p in groups.values())


def check_recurrent(env, groups: Mapping) -> None:
    """Recurrent parts need ``is_init`` from the env (the one home of this refusal, for the on-
    and off-policy loops). Any seed count works: a recurrent network stacked over seeds carries
    every sub-env's hidden state in its seed's block."""
    if not is_recurrent(groups):
        return
    if IS_INIT not in env.observation_spec.keys():
        raise ValueError("Recurrent (GRU / LSTM) parts reset their hidden state where 'is_init' is True, but the "
                         "env does not write it; wrap it: TransformedEnv(env, InitTracker()) (tdrl.core).")
