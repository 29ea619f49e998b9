"""Helpers shared by the single-agent apps (ppo, dqn, sac): command-line overrides of a
config dataclass, deterministic evaluation episodes, the run's bookkeeping (:class:`AppRun`:
``tdrl.core.train`` loggers, progress bar, atomic checkpoints and ``--resume``) and a
learning-curve PNG. Apps import it as ``ppo.app_utils`` with ``apps/`` on ``sys.path``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shutil
import time
from pathlib import Path
from typing import Any

import torch
from tensordict.nn import InteractionType, set_interaction_type

from tdrl.core import step_mdp
from tdrl.core.train import (
    Checkpointer,
    CSVLogger,
    MetricHistory,
    ProgressBar,
    TensorboardLogger,
    truncate_csv,
)

__all__ = ["parse_config", "evaluate_episodes", "plot_curve", "AppRun", "episode_returns"]


@torch.no_grad()
def evaluate_episodes(env, policy, episodes: int, seed: int) -> float:
    """Mean return of one deterministic-policy episode per sub-env of ``env``.

    Args:
        env: a batched env of batch size ``(episodes,)`` with a ``RewardSum`` transform
            (``("next", "episode_reward")``); it is closed at the end.
        policy: a TensorDict policy.
        episodes: number of sub-envs (= episodes).
        seed: seed of the evaluation envs.

    Returns:
        The mean of the first finished episode's return of each sub-env.
    """
    env.set_seed(seed)
    td = env.reset()
    finished = torch.zeros(episodes, dtype=torch.bool)
    returns = torch.zeros(episodes)
    with set_interaction_type(InteractionType.DETERMINISTIC):
        while not bool(finished.all()):
            td = env.step(policy(td))
            done = td["next", "done"].squeeze(-1)
            first = done & ~finished
            returns[first] = td["next", "episode_reward"].squeeze(-1)[first]
            finished |= done
            td = step_mdp(td)
            if bool(done.any()):
                td["_reset"] = done.unsqueeze(-1)
                td = env.reset(td).exclude("_reset")
    env.close()
    return float(returns.mean())


def parse_config(cls, argv: list[str] | None = None):
    """Build a config dataclass from ``--field value`` command-line overrides.

    Booleans take ``--flag`` / ``--no-flag``; tuples take several values (``--hidden 256 256``).
    """
    parser = argparse.ArgumentParser(description=(cls.__doc__ or "").split("\n")[0])
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        flag = f"--{f.name}"
        if isinstance(default, bool) or (default is None and "bool" in str(f.type)):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default)
        elif isinstance(default, tuple):
            parser.add_argument(flag, type=type(default[0]), nargs="+", default=default)
        elif default is None:  # optional field: the type named in the annotation
            kind = next((t for t in (int, float) if t.__name__ in str(f.type)), str)
            parser.add_argument(flag, type=kind, default=None)
        else:
            parser.add_argument(flag, type=type(default), default=default)
    args = vars(parser.parse_args(argv))
    args = {k: tuple(v) if isinstance(v, list) else v for k, v in args.items()}
    return cls(**args)


def plot_curve(rows: list[dict], path: str, title: str, x: str = "frames") -> None:
    """Learning curve: training episode return (and evaluation return) against frames."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for key, style in (("train_return", "-"), ("eval_return", "o--")):
        pts = [(r[x], r[key]) for r in rows if r.get(key) not in (None, "") and not math.isnan(r[key])]
        if pts:
            ax.plot(*zip(*pts), style, label=key)
    ax.set_xlabel(x)
    ax.set_ylabel("episode return")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def episode_returns(batch) -> list[float]:
    """Returns of the episodes that end in a collected batch (``RewardSum``'s
    ``("next", "episode_reward")`` where ``("next", "done")``)."""
    done = batch["next", "done"]
    return batch["next", "episode_reward"][done].tolist()


class AppRun:
    """The bookkeeping of one app run in ``cfg.out``, built on ``tdrl.core.train``.

    * metrics: a :class:`MetricHistory` forwarding each row to a :class:`CSVLogger`
      (``<out>/metrics.csv``, ``step`` = frames) and, with ``cfg.tensorboard``, to a
      :class:`TensorboardLogger` (``<out>/tensorboard``);
    * a :class:`ProgressBar` over frames showing the latest metrics (``cfg.progress``);
    * a :class:`Checkpointer` (``<out>/checkpoints/step_<frames>.pt``, written atomically,
      loaded with ``weights_only=True``) of every stateful object the app passes, the metric
      history and the RNG states; :meth:`maybe_resume` restores the latest one when
      ``cfg.resume`` is set. The CSV is truncated to the checkpoint's step, so a resumed run
      logs each step once.
    * :meth:`finish`: final row, ``learning_curve.png`` and ``summary.json``.

    Without ``cfg.resume`` a previous run's metrics and checkpoints in ``cfg.out`` are removed.

    Args:
        cfg: the app config (fields ``out``, ``total_frames``, ``tensorboard``, ``progress``,
            ``resume``, ``checkpoint_every``, ``seed``).
        name: the app's name (progress-bar label, TensorBoard run).
    """

    def __init__(self, cfg: Any, name: str) -> None:
        self.cfg, self.name = cfg, name
        self.out = Path(cfg.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.ckpt = Checkpointer(self.out / "checkpoints", keep=2)
        self.csv_path = self.out / "metrics.csv"
        self.history: MetricHistory | None = None
        self.bar: ProgressBar | None = None
        self.t0 = time.perf_counter()
        self.time_offset = 0.0  # wall time of the run before a resume
        self._next_ckpt = cfg.checkpoint_every
        self.last_episodes: list[float] = []  # returns of the last 100 training episodes
        if not cfg.resume or self.ckpt.latest() is None:
            shutil.rmtree(self.ckpt.directory, ignore_errors=True)
            self.csv_path.unlink(missing_ok=True)

    # ------------------------------------------------------------------ lifecycle
    def maybe_resume(self, **objects: Any) -> dict | None:
        """Restore ``objects`` (name -> object with ``load_state_dict``) from the latest
        checkpoint if ``cfg.resume`` and one exists; then open the loggers.

        Returns:
            The checkpoint's ``extra`` dict (with ``"frames"``), or ``None`` for a fresh run.
        """
        extra, rows = None, []
        if self.cfg.resume and self.ckpt.latest() is not None:
            holder = MetricHistory()
            state = self.ckpt.load(history=holder, **objects)
            extra, rows = state["extra"], holder.rows
            truncate_csv(self.csv_path, state["step"])
            self.time_offset = float(extra.get("time_s", 0.0))
            self.last_episodes = [float(x) for x in extra.get("last_episodes", [])]
            self._next_ckpt = state["step"] + self.cfg.checkpoint_every
        loggers = [CSVLogger(self.out, "")]
        if self.cfg.tensorboard:
            loggers.append(TensorboardLogger(self.out, "tensorboard"))
        self.history = MetricHistory(loggers)
        self.history.rows = rows
        for logger in loggers:
            logger.log_hparams(dataclasses.asdict(self.cfg))
        start = int(extra["frames"]) if extra else 0
        self.bar = ProgressBar(total=self.cfg.total_frames, desc=self.name,
                               disable=not self.cfg.progress, mininterval=5.0)
        if start:
            self.bar.update(start)
        return extra

    @property
    def elapsed(self) -> float:
        """Wall seconds of the run so far, including the time before a resume."""
        return self.time_offset + time.perf_counter() - self.t0

    def record_episodes(self, returns: list[float]) -> float:
        """Remember finished training episodes' returns; returns their mean (NaN if none)."""
        self.last_episodes = (self.last_episodes + list(returns))[-100:]
        return sum(returns) / len(returns) if returns else math.nan

    def log(self, frames: int, row: dict, show: tuple[str, ...] = ()) -> None:
        """Log ``row`` at step ``frames`` (adds ``frames`` and ``time_s``); NaNs are skipped."""
        row = {"frames": frames, "time_s": round(self.elapsed, 2), **row}
        row = {k: float(v) for k, v in row.items() if v is not None and not math.isnan(float(v))}
        self.history.log(row, step=frames)
        advance = frames - self.bar.n
        self.bar.update(max(advance, 0), **{k: row[k] for k in show if k in row})

    def maybe_checkpoint(self, frames: int, extra: dict | None = None, **objects: Any) -> None:
        """Checkpoint every ``cfg.checkpoint_every`` frames (0: never during training)."""
        if not self.cfg.checkpoint_every or frames < self._next_ckpt:
            return
        while self._next_ckpt <= frames:
            self._next_ckpt += self.cfg.checkpoint_every
        self.checkpoint(frames, extra, **objects)

    def checkpoint(self, frames: int, extra: dict | None = None, **objects: Any) -> Path:
        """Write ``checkpoints/step_<frames>.pt`` now."""
        extra = {"frames": int(frames), "time_s": self.elapsed,
                 "last_episodes": list(self.last_episodes), **(extra or {})}
        return self.ckpt.save(frames, extra=extra, history=self.history, **objects)

    def finish(self, frames: int, eval_return: float, title: str, **summary: Any) -> dict:
        """Log the final evaluation, draw ``learning_curve.png``, write ``summary.json``,
        close the loggers; returns the summary."""
        self.log(frames, {"eval_return": eval_return})
        self.bar.close()
        self.history.close()
        rows = self.history.rows
        plot_curve(rows, str(self.out / "learning_curve.png"), title)
        train = self.last_episodes[-5:]
        out = {"env_id": self.cfg.env_id, "frames": frames, "eval_return": eval_return,
               "eval_episodes": self.cfg.eval_episodes,
               "train_return_last5": sum(train) / len(train) if train else None,
               "time_s": self.elapsed, **summary}
        with open(self.out / "summary.json", "w") as fh:
            json.dump(out, fh, indent=2)
        return out
