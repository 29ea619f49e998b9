"""The run harness: one run folder, its loggers, checkpoints, cadence and resume.

Every app and trainer writes the same layout::

    <out>/config.yaml        the resolved config (written once, on a fresh start)
    <out>/metrics.csv        one row per logged step (``step`` column = the app's unit)
    <out>/summary.json       the run's result (written before any plot, so it always exists)
    <out>/*.png              plots (skipped with a warning when matplotlib is missing)
    <out>/checkpoints/       step_<n>.pt, atomic, loaded with weights_only=True
    <out>/tensorboard/       with ``tensorboard=true``

A rerun into a folder that holds an earlier run never destroys it: without ``resume`` the
run goes to the first free numbered folder beside it (``<out>-1``, ``<out>-2``, ...) and says
so; with ``resume`` it continues from the latest checkpoint there, the metrics CSV cut back to
that checkpoint's step so no step is logged twice. Under ``torch.distributed`` only rank 0
writes (every rank reads the same checkpoint and gets the same folder).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from tdrl.core.train.checkpoint import Checkpointer
from tdrl.core.train.distributed import broadcast_object, is_main_process, rank_and_world
from tdrl.core.train.history import MetricHistory, truncate_csv
from tdrl.core.train.loggers import CSVLogger, Logger, TensorboardLogger, WandbLogger
from tdrl.core.train.progress import ProgressBar

__all__ = ["Run", "changed_settings", "crossed", "run_folder"]

log = logging.getLogger(__name__)

_RUN_FILES = ("config.yaml", "metrics.csv", "summary.json", "summary.jsonl", "checkpoints",
              "sweep.jsonl")  # a run's files, or a sweep's list of jobs


def crossed(every: int, before: int, now: int) -> bool:
    """Whether a cadence of ``every`` steps fires between step ``before`` (excluded) and ``now``
    (included): ``now // every > before // every``; never when ``every`` is 0."""
    return every > 0 and now // every > before // every


def _holds_run(folder: Path) -> bool:
    return folder.is_dir() and any((folder / name).exists() for name in _RUN_FILES)


def run_folder(out: str | os.PathLike, resume: bool) -> tuple[Path, bool]:
    """The folder a run writes to, and whether it resumes there.

    ``resume`` with a checkpoint in ``out``: ``(out, True)``. Otherwise ``out`` if it holds no
    earlier run, else the first ``out-<k>`` that holds none: ``(folder, False)``.
    """
    out = Path(out)
    if resume and Checkpointer(out / "checkpoints").latest() is not None:
        return out, True
    if resume:
        log.warning("resume=true but %s has no checkpoint: starting a fresh run there.", out)
    if not _holds_run(out):
        return out, False
    k = 1
    while _holds_run(out.with_name(f"{out.name}-{k}")):
        k += 1
    new = out.with_name(f"{out.name}-{k}")
    log.warning("%s holds an earlier run, kept as it is; this run writes to %s "
                "(resume=true continues the earlier one; out=DIR picks another folder).", out, new)
    return new, False


class Run:
    """The bookkeeping of one training run in ``cfg.out``.

    Args:
        cfg: the app's config (a :class:`tdrl.core.train.RunConfig` subclass, or any object
            with ``out``, ``resume``, ``checkpoint_every``; ``tensorboard``, ``wandb``,
            ``progress``, ``threads`` are read when present). ``cfg.out`` is set to the folder
            actually used.
        name: the app's name (progress-bar label, TensorBoard / wandb run name).
        total: the length of the run in steps (for the progress bar), or ``None``.
        unit: what a step counts (``"frames"``, ``"round"``, ...): each metrics row gets this
            column beside ``step`` (``"step"``: no extra column).
        keep: checkpoints kept (older ones are deleted).
        per_rank: under ``torch.distributed`` every rank also checkpoints its own state
            (``checkpoints/rank<r>/``: samplers and RNG streams that differ per rank) and
            restores it on resume; otherwise only rank 0 writes and every rank loads its file.
        summary_file: the name :meth:`finish` writes the summary to; ``"summary.jsonl"`` (one
            line) keeps the run folder free of ``*.json`` besides the app's own (BenchMARL's
            multirun loader merges every ``*.json`` under a folder).

    Use::

        run = Run(cfg, "ppo", total=cfg.total_frames)
        extra = run.start(model=model, optim=optim)  # restores them when resuming
        for ...:
            run.log(step, {"loss": ...})
            run.maybe_checkpoint(step, extra={...}, model=model, optim=optim)
        run.checkpoint(step, model=model, optim=optim)
        run.finish({"eval_return": ...}, plots={"learning_curve.png": ("frames", ["train_return"])})
    """

    def __init__(self, cfg: Any, name: str, total: int | None = None, unit: str = "step", keep: int = 2,
                 per_rank: bool = False, summary_file: str = "summary.json") -> None:
        self.cfg, self.name, self.total, self.unit = cfg, name, total, unit
        self.summary_file = summary_file
        self.main = is_main_process()
        self.rank = rank_and_world()[0]
        self.per_rank = per_rank and rank_and_world()[1] > 1
        threads = getattr(cfg, "threads", None)
        if threads:
            torch.set_num_threads(int(threads))
        folder, self.resuming = broadcast_object(run_folder(cfg.out, bool(getattr(cfg, "resume", False)))
                                                 if self.main else None)
        self.out = Path(folder)
        cfg.out = str(self.out)
        ckpt_dir = self.out / "checkpoints"
        self.ckpt = Checkpointer(ckpt_dir / f"rank{self.rank}" if self.per_rank and not self.main else ckpt_dir,
                                 keep=keep)
        self.history = MetricHistory()
        self.bar: ProgressBar | None = None
        self.t0 = time.perf_counter()
        self.time_offset = 0.0
        self._last_ckpt = 0
        self.step = 0
        self.recent_episodes: list[float] = []  # returns of the last 100 finished training episodes
        if self.main:
            self.out.mkdir(parents=True, exist_ok=True)
            if not self.resuming:
                self._write_config()

    # ------------------------------------------------------------------ lifecycle
    def _write_config(self) -> None:
        values = dataclasses.asdict(self.cfg) if dataclasses.is_dataclass(self.cfg) else dict(vars(self.cfg))
        try:
            from omegaconf import OmegaConf

            text = OmegaConf.to_yaml(OmegaConf.create(_plain(values)))
        except ImportError:
            text = json.dumps(_plain(values), indent=2) + "\n"
        tmp = self.out / ".config.yaml.tmp"
        tmp.write_text(text)
        tmp.replace(self.out / "config.yaml")

    def start(self, **objects: Any) -> dict | None:
        """Restore ``objects`` (name -> object with ``load_state_dict``) from the latest
        checkpoint when resuming; then open the loggers and the progress bar.

        Returns:
            The checkpoint's ``extra`` dict (it holds ``"step"``), or ``None`` on a fresh start.
        """
        extra, rows = None, []
        if self.resuming:
            holder = MetricHistory()
            state = self.ckpt.load(history=holder, **objects)
            extra, rows = dict(state["extra"]), holder.rows
            self.step = self._last_ckpt = int(state["step"])
            extra.setdefault("step", self.step)
            self.time_offset = float(extra.get("time_s", 0.0))
            self.recent_episodes = [float(x) for x in extra.get("recent_episodes", [])]
            if self.main:
                truncate_csv(self.out / "metrics.csv", self.step)
            log.info("%s: resumed from %s (step %d).", self.name, self.ckpt.latest(), self.step)
        self.history = MetricHistory(self._loggers() if self.main else [])
        self.history.rows = rows
        if self.main:
            hparams = dataclasses.asdict(self.cfg) if dataclasses.is_dataclass(self.cfg) else {}
            for logger in self.history.loggers:
                if not isinstance(logger, CSVLogger):  # config.yaml already holds them
                    logger.log_hparams(_plain(hparams))
        self.bar = ProgressBar(total=self.total, desc=self.name, mininterval=5.0,
                               disable=not (self.main and getattr(self.cfg, "progress", True)))
        if self.step:
            self.bar.update(self.step)
        return extra

    def _loggers(self) -> list[Logger]:
        loggers: list[Logger] = [CSVLogger(self.out, "")]
        if getattr(self.cfg, "tensorboard", False):
            loggers.append(TensorboardLogger(self.out, "tensorboard"))
        if getattr(self.cfg, "wandb", ""):
            loggers.append(WandbLogger(self.cfg.wandb, exp_name=f"{self.name}-{self.out.name}", dir=str(self.out)))
        return loggers

    @property
    def elapsed(self) -> float:
        """Wall seconds of the run so far, including the time before a resume."""
        return self.time_offset + time.perf_counter() - self.t0

    def out_of_time(self) -> bool:
        """Whether ``cfg.time_limit_s`` (when set) has passed."""
        limit = getattr(self.cfg, "time_limit_s", 0.0)
        return bool(limit) and self.elapsed > limit

    def should_stop(self, row: Mapping[str, Any]) -> bool:
        """Whether training should end after this row: ``cfg.stop_return`` (when set) reached
        by the row's ``eval_return``, or ``cfg.time_limit_s`` passed."""
        target = getattr(self.cfg, "stop_return", None)
        if target is not None and row.get("eval_return", -math.inf) >= target:
            log.info("%s: eval_return %.4g reached stop_return %.4g.", self.name, row["eval_return"], target)
            return True
        return self.out_of_time()

    # ------------------------------------------------------------------ per step
    def record_episodes(self, returns: list[float]) -> float:
        """Remember finished training episodes' returns (the last 100 are checkpointed);
        returns their mean (NaN if none)."""
        self.recent_episodes = (self.recent_episodes + [float(r) for r in returns])[-100:]
        return sum(returns) / len(returns) if returns else math.nan

    def log(self, step: int, row: Mapping[str, Any], show: tuple[str, ...] = ()) -> None:
        """Log ``row`` at ``step`` (``time_s`` added; ``None`` and NaN entries dropped) and
        advance the progress bar, showing the ``show`` metrics."""
        values = {"time_s": round(self.elapsed, 2), **row}
        if self.unit != "step":
            values = {self.unit: step, **values}
        values = {k: float(v) for k, v in values.items() if v is not None and not math.isnan(float(v))}
        self.history.log(values, step=step)
        if self.bar is not None:
            self.bar.update(max(step - self.bar.n, 0), **{k: values[k] for k in show if k in values})
        self.step = step

    def maybe_checkpoint(self, step: int, extra: dict | None = None, **objects: Any) -> Path | None:
        """Checkpoint when ``cfg.checkpoint_every`` steps have passed since the last one."""
        if crossed(getattr(self.cfg, "checkpoint_every", 0), self._last_ckpt, step):
            return self.checkpoint(step, extra, **objects)
        return None

    def checkpoint(self, step: int, extra: dict | None = None, **objects: Any) -> Path | None:
        """Write ``checkpoints/step_<step>.pt`` now (rank 0; other ranks return ``None``):
        every object's state, the metric history, the RNG states and ``extra``."""
        self._last_ckpt = step
        if not (self.main or self.per_rank):
            return None
        extra = {"step": int(step), "time_s": self.elapsed, "recent_episodes": list(self.recent_episodes),
                 **(extra or {})}
        return self.ckpt.save(step, extra=extra, history=self.history, **objects)

    # ------------------------------------------------------------------ the end
    def finish(self, summary: Mapping[str, Any], plots: Mapping[str, tuple[str, list[str]]] | None = None,
               title: str | None = None) -> dict:
        """Write ``summary.json`` (with ``time_s``), then the plots, and close the loggers.

        Args:
            summary: the run's result (plain values).
            plots: ``{file name: (x column, [y columns])}`` drawn from the metric history.
            title: the plots' title (default: the app's name).

        Returns:
            The summary as written.
        """
        from tdrl.core.train.plots import plot_curves

        out = {**_plain(dict(summary)), "time_s": round(self.elapsed, 2), "out": str(self.out)}
        if self.bar is not None:
            self.bar.close()
        self.history.close()
        if self.main:
            tmp = self.out / f".{self.summary_file}.tmp"
            tmp.write_text(json.dumps(out, indent=None if self.summary_file.endswith(".jsonl") else 2) + "\n")
            tmp.replace(self.out / self.summary_file)
            for fname, (x, ys) in (plots or {}).items():
                plot_curves(self.history.rows, self.out / fname, x, ys, title or self.name)
        return out


def changed_settings(folder: str | os.PathLike, cfg: Any, ignore: tuple[str, ...] = ()) -> dict[str, tuple]:
    """The settings of ``cfg`` that differ from the run in ``folder`` (its ``config.yaml``).

    An app calls it when resuming, to refuse a resume whose settings changed (the finished part
    was trained with the old ones) instead of recording the new values above the old results.

    Args:
        folder: a run folder. cfg: the new config (a dataclass).
        ignore: keys allowed to differ (``resume``, ``out``, ``progress``...).

    Returns:
        ``{key: (old, new)}``; empty when ``folder`` holds no ``config.yaml``.
    """
    path = Path(folder) / "config.yaml"
    if not path.is_file():
        return {}
    try:
        from omegaconf import OmegaConf

        old = OmegaConf.to_container(OmegaConf.load(path))
    except ImportError:
        old = json.loads(path.read_text())
    new = json.loads(json.dumps(_plain(dataclasses.asdict(cfg))))
    old = json.loads(json.dumps(old))
    return {k: (old.get(k), new.get(k)) for k in sorted(set(old) | set(new))
            if k not in ignore and old.get(k) != new.get(k)}


def _plain(value: Any) -> Any:
    """``value`` with tuples as lists, paths as strings and tensors as numbers (for YAML/JSON)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, float) and math.isnan(value):
        return None
    return value
