"""Scalar loggers: CSV (no dependency), TensorBoard, and Weights & Biases when installed.

All share ``log_scalar(name, value, step)``, ``log_metrics(dict, step)``,
``log_hparams(dict)`` and ``close()``. Values may be floats, ints or 0-d tensors.
:class:`CSVLogger` also writes videos (``log_video``, GIF files through Pillow). TorchRL's
``get_logger`` / ``generate_exp_name`` build one by name.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import os
from pathlib import Path
import uuid
from datetime import datetime
from typing import Any, Mapping

import torch

__all__ = ["Logger", "CSVLogger", "TensorboardLogger", "WandbLogger", "get_logger", "generate_exp_name", "write_gif"]


def _scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The metrics as floats, ``None`` values left out: nothing measured yet (tqdm's
    ``format_dict["rate"]`` before its first interval, which TorchRL's scripts log as ``time/speed``)."""
    return {k: _scalar(v) for k, v in metrics.items() if v is not None}


def _scalar(value: Any) -> float:
    """A logged value as a float; a tensor of several values is logged as its mean (TorchRL's
    SAC script logs each finished episode's return: one number per column here)."""
    if isinstance(value, torch.Tensor):
        if value.numel() == 0:
            raise ValueError(f"Only scalars can be logged, got an empty tensor of shape {tuple(value.shape)}.")
        return float(value.detach().float().mean().cpu().item())
    return float(value)


class Logger:
    """Base class: subclasses implement ``log_metrics`` (and ``close`` if needed)."""

    def log_scalar(self, name: str, value: Any, step: int | None = None) -> None:
        """Log one value; without ``step``, at one past the last step logged without one (TorchRL's)."""
        if step is None:
            step = self.__dict__.get("_auto_step", 0)
            self._auto_step = step + 1
        self.log_metrics({name: value}, step)

    def log_metrics(self, metrics: Mapping[str, Any], step: int) -> None:
        raise NotImplementedError

    def log_video(self, name: str, video: torch.Tensor, step: int = 0, fps: int | None = None) -> Path:
        """Write ``video`` (uint8 ``[T, H, W, C]``, or a float ``[T, C, H, W]`` in ``[0, 1]``) to
        ``<log_dir>/<exp_name>/videos/<name>_<step>.gif`` (or ``.pt``); returns the path."""
        folder = self.dir / "videos"
        folder.mkdir(exist_ok=True)
        frames = _video_frames(video)
        path = folder / f"{name}_{step}.{self.video_format}"
        if self.video_format == "pt":
            torch.save(frames, path)
        else:
            write_gif(frames, path, fps or self.video_fps)
        return path

    def log_hparams(self, hparams: Mapping[str, Any]) -> None:
        """Record the run's configuration (default: ignored)."""

    def close(self) -> None:
        """Flush and release files."""

    def __enter__(self) -> "Logger":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class CSVLogger(Logger):
    """One wide CSV per run, ``<log_dir>/<exp_name>/metrics.csv``: a ``step`` column and one
    column per metric (blank where a metric was not logged at that step). A metric that
    appears later widens the file (it is rewritten once with the new header).
    ``log_hparams`` writes ``hparams.json`` next to it.

    Args:
        log_dir: parent folder (default ``csv_logs`` in the working folder, TorchRL's).
        exp_name: run folder name.
        video_format: ``"gif"`` (default) or ``"pt"`` for :meth:`log_video`; video_fps: its rate.
    """

    def __init__(self, log_dir: str | os.PathLike | None = None, exp_name: str = "run", video_format: str = "gif",
                 video_fps: int = 30) -> None:
        log_dir = "csv_logs" if log_dir is None else log_dir  # TorchRL's default folder
        if video_format not in ("gif", "pt"):
            raise ValueError(f"CSVLogger(video_format={video_format!r}): 'gif' (a file any viewer opens) or 'pt' "
                             "(the uint8 frames, torch.save)")
        self.video_format, self.video_fps = video_format, int(video_fps)
        self.dir = Path(log_dir) / exp_name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "metrics.csv"
        self.columns: list[str] = []
        self._file = None
        self._writer = None
        if self.path.exists():  # resume: keep the existing columns and rows
            with open(self.path, newline="") as f:
                header = next(csv.reader(f), None)
            self.columns = [c for c in (header or []) if c != "step"]
            self._open("a")

    def _open(self, mode: str) -> None:
        self._file = open(self.path, mode, newline="")
        self._writer = csv.DictWriter(self._file, fieldnames=["step", *self.columns])
        if mode == "w":
            self._writer.writeheader()

    def _widen(self, new: list[str]) -> None:
        rows = []
        if self._file is not None:
            self._file.close()
            with open(self.path, newline="") as f:
                rows = list(csv.DictReader(f))
        self.columns += new
        self._open("w")
        for row in rows:
            self._writer.writerow(row)

    def log_metrics(self, metrics: Mapping[str, Any], step: int) -> None:
        values = _scalars(metrics)
        new = [k for k in values if k not in self.columns]
        if new or self._file is None:
            self._widen(new)
        self._writer.writerow({"step": int(step), **values})
        self._file.flush()

    def log_hparams(self, hparams: Mapping[str, Any]) -> None:
        with open(self.dir / "hparams.json", "w") as f:
            json.dump(dict(hparams), f, indent=2, default=str)

    def read(self) -> dict[str, list[float]]:
        """The logged columns: ``{"step": [...], name: [...]}`` (NaN where blank)."""
        with open(self.path, newline="") as f:
            rows = list(csv.DictReader(f))
        return {
            col: [float(r[col]) if r.get(col) not in ("", None) else math.nan for r in rows]
            for col in ["step", *self.columns]
        }

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _require(module: str, install: str, what: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise ImportError(f"{what} needs the '{module}' package: pip install {install}")


class TensorboardLogger(Logger):
    """TensorBoard event files in ``<log_dir>/<exp_name>`` (needs ``tensorboard``)."""

    def __init__(self, log_dir: str | os.PathLike, exp_name: str = "run") -> None:
        _require("tensorboard", "tensorboard", "TensorboardLogger")
        from torch.utils.tensorboard import SummaryWriter

        self.dir = Path(log_dir) / exp_name
        self.writer = SummaryWriter(log_dir=str(self.dir))

    def log_metrics(self, metrics: Mapping[str, Any], step: int) -> None:
        for name, value in _scalars(metrics).items():
            self.writer.add_scalar(name, value, global_step=int(step))

    def log_hparams(self, hparams: Mapping[str, Any]) -> None:
        self.writer.add_text("hparams", json.dumps(dict(hparams), indent=2, default=str))

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()


class WandbLogger(Logger):
    """Weights & Biases run (needs ``wandb``; raises a clear ``ImportError`` otherwise).

    Args:
        project: W&B project. exp_name: run name. **kwargs: passed to ``wandb.init``
            (e.g. ``mode="offline"``, ``dir=...``, ``config=...``).
    """

    def __init__(self, project: str, exp_name: str | None = None, **kwargs: Any) -> None:
        _require("wandb", "wandb", "WandbLogger")
        import wandb

        self._wandb = wandb
        self.run = wandb.init(project=project, name=exp_name, **kwargs)

    def log_metrics(self, metrics: Mapping[str, Any], step: int) -> None:
        self.run.log(_scalars(metrics), step=int(step))

    def log_hparams(self, hparams: Mapping[str, Any]) -> None:
        self.run.config.update(dict(hparams), allow_val_change=True)

    def close(self) -> None:
        self.run.finish()


def _video_frames(video: torch.Tensor) -> torch.Tensor:
    """uint8 ``[T, H, W, C]`` from uint8 ``[T, H, W, C]`` or float ``[T, C, H, W]`` in ``[0, 1]``."""
    video = torch.as_tensor(video).detach().cpu()
    if video.ndim != 4:
        raise ValueError(f"a video is [T, H, W, C] (uint8) or [T, C, H, W] (float), got shape {tuple(video.shape)}")
    if video.dtype.is_floating_point:
        video = (video.clamp(0, 1) * 255).round().to(torch.uint8).movedim(1, -1)
    if video.shape[-1] not in (1, 3, 4):
        raise ValueError(f"a uint8 video is [T, H, W, C] with C in (1, 3, 4), got shape {tuple(video.shape)}")
    return video


def write_gif(frames: torch.Tensor, path: str | os.PathLike, fps: int = 30) -> None:
    """An animated GIF of uint8 ``[T, H, W, C]`` frames (Pillow, which matplotlib installs)."""
    if importlib.util.find_spec("PIL") is None:
        raise ModuleNotFoundError("writing a GIF needs Pillow: pip install pillow (or CSVLogger(video_format='pt'))")
    from PIL import Image

    arr = frames.numpy()
    images = [Image.fromarray(f[..., 0] if f.shape[-1] == 1 else f) for f in arr]
    images[0].save(path, save_all=True, append_images=images[1:], duration=max(1, round(1000 / fps)), loop=0)


def generate_exp_name(model_name: str, experiment_name: str) -> str:
    """A unique run name, ``<model>_<experiment>_<short uuid>_<date>`` (TorchRL's helper)."""
    return "_".join([model_name, experiment_name, str(uuid.uuid4())[:8], datetime.now().strftime("%y_%m_%d-%H_%M_%S")])


def get_logger(logger_type: str, logger_name: str, experiment_name: str, **kwargs: Any) -> Logger:
    """A logger by name, as TorchRL's ``get_logger``: ``"csv"`` (``log_dir=logger_name``),
    ``"tensorboard"`` or ``"wandb"`` (``project=`` in ``kwargs``). TorchRL's per-backend
    settings are taken the same way: ``wandb_kwargs=`` reaches the wandb logger only (the SOTA
    scripts always pass it), ``mlflow_kwargs=`` / ``trackio_kwargs=`` name backends tdrl lacks
    and are refused when not empty."""
    wandb_kwargs = kwargs.pop("wandb_kwargs", None) or {}
    for other in ("mlflow_kwargs", "trackio_kwargs"):
        if kwargs.pop(other, None):
            raise ValueError(f"get_logger({other}=...): that backend is not in tdrl; use 'csv', "
                             "'tensorboard' or 'wandb'")
    if logger_type == "wandb":
        kwargs = {**wandb_kwargs, **kwargs}
    if logger_type == "csv":
        return CSVLogger(log_dir=logger_name, exp_name=experiment_name, **kwargs)
    if logger_type == "tensorboard":
        return TensorboardLogger(log_dir=logger_name, exp_name=experiment_name, **kwargs)
    if logger_type == "wandb":
        return WandbLogger(exp_name=experiment_name, **kwargs)
    raise ValueError(f"get_logger: logger_type must be 'csv', 'tensorboard' or 'wandb', got {logger_type!r}")
