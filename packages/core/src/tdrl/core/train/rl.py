"""What the single-agent RL apps share beyond the run folder: the config fields of an
environment run and of off-policy training, the gradient-step budget of an update-to-data
ratio, the per-row mean of loss diagnostics, and an off-policy loop's log / evaluate /
checkpoint cadence and its end (:class:`OffPolicyLog`)."""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch
from tensordict import TensorDictBase

from tdrl.core.train.config import ConfigError, RunConfig, check_device
from tdrl.core.train.seeds import SeedAxis
from tdrl.core.train.run import Run, crossed

log = logging.getLogger(__name__)

__all__ = ["EnvRunConfig", "OffPolicyConfig", "UpdateBudget", "mean_metrics", "finish_env_run", "OffPolicyLog"]


def _at_least(cfg, names: Sequence[str], low: int) -> None:
    for name in names:
        if getattr(cfg, name) < low:
            raise ConfigError(f"{type(cfg).__name__}.{name}={getattr(cfg, name)} is not allowed: "
                              f"expected an integer >= {low}.")


@dataclass
class EnvRunConfig(RunConfig):
    """A run of an agent on one environment."""

    env_id: str = "CartPole-v1"
    """Gymnasium task id (classic control or MuJoCo), or tdrl/Pendulum (the batched torch
    Pendulum, whose runs resume bit-identically)."""
    total_frames: int = 100_000
    """Environment steps to collect, summed over the sub-envs."""
    num_envs: int = 1
    """Sub-envs of the vector env."""
    hidden: tuple[int, ...] = (64, 64)
    """Hidden layer sizes of the networks."""
    eval_episodes: int = 10
    """Deterministic episodes per evaluation."""
    stop_return: float | None = None
    """Stop once an evaluation reaches this mean return; null: never."""
    device: str = "cpu"
    """Device of the networks and the training batches."""

    action_kinds: ClassVar[tuple[str, ...]] = ("discrete", "continuous")
    """The action kinds the app's algorithm can take (an app narrows it: DQN discrete, SAC
    continuous); ``env_id`` is checked against it before any work or folder."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _at_least(self, ("total_frames", "num_envs", "eval_episodes"), 1)
        if not self.hidden or min(self.hidden) < 1:
            raise ConfigError(f"{type(self).__name__}.hidden={self.hidden} is not allowed: "
                              "expected one or more layer sizes >= 1.")
        check_device(self)
        self._check_env()

    def _check_env(self) -> None:
        from tdrl.core.envs import action_kind  # tdrl.core.envs imports the harness: not at module level

        try:
            kind = action_kind(self.env_id)
        except ValueError as err:
            raise ConfigError(f"{type(self).__name__}.env_id: {err}") from None
        except ImportError:
            return  # the env's package is missing: make_env names the install line
        if kind not in self.action_kinds:
            raise ConfigError(
                f"{type(self).__name__}.env_id={self.env_id!r} has {kind} actions; this app's algorithm takes "
                f"{' or '.join(self.action_kinds)} actions only. Pick a {self.action_kinds[0]}-action env_id, or the "
                f"app for {kind} actions ({'dqn or ppo' if kind == 'discrete' else 'sac or ppo'}).")



@dataclass
class OffPolicyConfig(EnvRunConfig):
    """An off-policy run: a replay buffer, random actions first, ``utd_ratio`` gradient steps
    per collected frame."""

    learning_starts: int = 1_000
    """Frames of uniformly random actions before learning starts."""
    buffer_size: int = 100_000
    """Replay buffer capacity (transitions)."""
    batch_size: int = 256
    """Transitions per gradient step."""
    utd_ratio: float = 1.0
    """Gradient steps per collected frame (update-to-data ratio)."""
    gamma: float = 0.99
    """Discount."""
    tau: float = 0.005
    """Polyak factor of the target networks (0 < tau <= 1)."""
    log_every: int = 1_000
    """Frames between metrics rows."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _at_least(self, ("buffer_size", "batch_size", "log_every"), 1)
        _at_least(self, ("learning_starts",), 0)
        if self.batch_size > self.buffer_size:
            raise ConfigError(f"{type(self).__name__}.batch_size={self.batch_size} exceeds "
                              f"buffer_size={self.buffer_size}.")
        if not (self.utd_ratio > 0 and math.isfinite(self.utd_ratio)):
            raise ConfigError(f"{type(self).__name__}.utd_ratio={self.utd_ratio} is not allowed: expected > 0.")
        if not 0.0 <= self.gamma <= 1.0:
            raise ConfigError(f"{type(self).__name__}.gamma={self.gamma} is not allowed: expected [0, 1].")
        if not 0.0 <= self.tau <= 1.0:
            raise ConfigError(f"{type(self).__name__}.tau={self.tau} is not allowed: expected [0, 1].")


class UpdateBudget:
    """Gradient steps owed at an update-to-data ratio: ``ratio`` steps per collected frame
    once ``learning_starts`` frames are in, the fractional rest carried over (checkpointable).

    Example:
        >>> budget = UpdateBudget(ratio=0.5, learning_starts=100)
        >>> budget.add(frames=104, new_frames=4)   # 2 steps owed
        2
    """

    def __init__(self, ratio: float, learning_starts: int = 0) -> None:
        self.ratio, self.learning_starts = float(ratio), int(learning_starts)
        self.debt, self.updates = 0.0, 0

    def add(self, frames: int, new_frames: int) -> int:
        """Account ``new_frames`` just collected (``frames`` in all); returns the gradient steps
        to take now (0 before ``learning_starts``). Counts them in ``updates``."""
        if frames < self.learning_starts:
            return 0
        self.debt += self.ratio * new_frames
        steps = int(self.debt)
        self.debt -= steps
        self.updates += steps
        return steps

    def state_dict(self) -> dict:
        return {"debt": self.debt, "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        self.debt, self.updates = float(state["debt"]), int(state["updates"])


def mean_metrics(stats: Sequence[TensorDictBase]) -> dict[str, float]:
    """The mean of each entry over a list of (detached) loss outputs; ``{}`` for none."""
    if not stats:
        return {}
    return {k: float(v) for k, v in torch.stack(list(stats)).mean().items()}


def finish_env_run(run: Run, cfg: EnvRunConfig, frames: int, eval_return: float, title: str, **extra) -> dict:
    """End an environment run: log the final evaluation, write ``summary.json`` (task, frames,
    final evaluation, the mean return of the last 5 training episodes, ``extra``) and
    ``learning_curve.png`` (training and evaluation return against frames); log one line.

    Returns:
        The summary.
    """
    run.log(frames, {"eval_return": eval_return})
    last = run.recent_episodes[-5:]
    summary = run.finish(
        {"env_id": cfg.env_id, "frames": frames, "eval_return": eval_return, "eval_episodes": cfg.eval_episodes,
         "train_return_last5": sum(last) / len(last) if last else None, **extra},
        plots={"learning_curve.png": ("frames", ["train_return", "eval_return"])}, title=title)
    log.info("%s %s: eval return %.1f over %d episodes after %d frames (%.0f s)", run.name, cfg.env_id,
             eval_return, cfg.eval_episodes, frames, summary["time_s"])
    return summary


class OffPolicyLog:
    """Step 3 of an off-policy app's loop and its end, written once (DQN, SAC, HER).

    Every ``cfg.log_every`` frames a metrics row (updates, frames/s, the mean return of the
    training episodes that ended since the last row, their count, their success rate when
    ``success_key`` is set, ``extra()`` and the mean of each loss entry); every
    ``cfg.eval_every`` frames after ``cfg.learning_starts`` an evaluation (``evaluate(seed)``
    with ``cfg.seed + 10_000``); then the run's periodic checkpoint and its time-limit check.
    :meth:`close` ends the run: a last checkpoint, the collector and env closed, a final
    evaluation (``cfg.seed + 20_000``), ``model.pt`` and ``summary.json``.

    Args:
        run: the app's :class:`Run`. cfg: its :class:`OffPolicyConfig`. budget: its
            :class:`UpdateBudget`.
        evaluate: ``evaluate(seed) -> {"eval_return": ..., ...}`` (entries of the row).
        show: the row entries the progress line shows.
        extra: ``extra() -> dict`` of entries added to each metrics row (e.g. epsilon).
        success_key: a ``("next", key)`` flag read at episode ends (goal-conditioned tasks).
        axis: the run's :class:`~tdrl.core.train.SeedAxis` (default: ``cfg.seed`` alone). Batches
            are seed-major blocks; with several seeds each row also holds
            ``train_return/seed_<s>``, ``frames`` passed to :meth:`step` are per seed (``fps``
            counts every seed's), and :meth:`close` counts the collector's frames per seed and
            adds ``seeds`` and ``eval_return_seeds`` (read from the final evaluation's
            ``eval_return/seed_<s>`` entries) to the summary.
    """

    def __init__(self, run: Run, cfg: OffPolicyConfig, budget: UpdateBudget,
                 evaluate: Callable[[int], dict], show: Sequence[str] = ("train_return", "eval_return"),
                 extra: Callable[[], dict] | None = None, success_key: str | None = None,
                 axis: SeedAxis | None = None) -> None:
        self.run, self.cfg, self.budget = run, cfg, budget
        self.evaluate, self.show, self.extra, self.success_key = evaluate, tuple(show), extra, success_key
        self.axis = axis if axis is not None else SeedAxis([cfg.seed])
        self.returns: list[float] = []
        self.seed_returns: list[list[float]] = [[] for _ in self.axis.seeds]
        self.successes: list[float] = []
        self.stats: list[TensorDictBase] = []

    def add_batch(self, batch: TensorDictBase) -> None:
        """Record the episodes that end in ``batch`` (returns, and successes)."""
        for k, rets in enumerate(self.axis.episode_returns(batch)):
            self.returns += rets
            self.seed_returns[k] += rets
        if self.success_key is not None:
            done = batch["next", "done"].squeeze(-1)
            self.successes += batch["next", self.success_key][done].tolist()

    def add_stats(self, out: TensorDictBase) -> None:
        """Record one gradient step's loss output (detached here)."""
        self.stats.append(out.detach())

    def step(self, frames: int, new: int, state: dict) -> bool:
        """Log, evaluate and checkpoint after the batch that brought the count to ``frames``
        (``new`` of them fresh); ``state`` is what the checkpoint holds. Returns whether the
        run should stop (its time limit)."""
        cfg, run, row = self.cfg, self.run, {}
        if crossed(cfg.log_every, frames - new, frames):
            row = {"updates": self.budget.updates, "fps": frames * self.axis.n / run.elapsed,
                   **(self.extra() if self.extra is not None else {}),
                   "train_return": run.record_episodes(self.returns), "episodes": len(self.returns)}
            if self.success_key is not None:
                row["train_success"] = sum(s > 0 for s in self.successes) / max(1, len(self.successes))
            for name, rets in zip(self.axis.names("train_return"), self.seed_returns):
                row[name] = sum(rets) / len(rets) if rets else math.nan
            row.update(mean_metrics(self.stats))
            self.returns, self.successes, self.stats = [], [], []
            self.seed_returns = [[] for _ in self.axis.seeds]
        if frames >= cfg.learning_starts and crossed(cfg.eval_every, frames - new, frames):
            row["updates"] = self.budget.updates
            row.update(self.evaluate(cfg.seed + 10_000))
        if row:
            run.log(frames, row, show=self.show)
        run.maybe_checkpoint(frames, **state)
        return run.should_stop(row)

    def close(self, collector, env, state: dict, model: dict, title: str, **extra) -> dict:
        """End the run after ``collector``'s last batch: checkpoint ``state``, shut the collector
        and ``env`` down, evaluate once more, save ``model`` (state dicts; the config is added)
        as ``model.pt``, write the summary (:func:`finish_env_run`, with ``extra`` and the
        final evaluation's other entries). Returns the summary."""
        frames, cfg = collector.frames // self.axis.n, self.cfg
        self.run.checkpoint(frames, **state)
        collector.shutdown()
        env.close()
        final = dict(self.evaluate(cfg.seed + 20_000))
        eval_return = final.pop("eval_return")
        if per := {name: final[name] for name in self.axis.names("eval_return")}:
            self.run.log(frames, per)
        extra = {**self.axis.summary("eval_return", list(per.values())), **extra}
        torch.save({**model, "config": dataclasses.asdict(cfg)}, os.path.join(cfg.out, "model.pt"))
        return finish_env_run(self.run, cfg, frames, eval_return, title, updates=self.budget.updates,
                              **final, **extra)
