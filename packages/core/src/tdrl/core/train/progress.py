"""A progress bar over frames or iterations that shows live metrics (tqdm when
installed; otherwise a ``logging`` line every ``log_every`` updates)."""

from __future__ import annotations

import importlib.util
import logging
from typing import Any

import torch

__all__ = ["ProgressBar"]

_log = logging.getLogger(__name__)


def _fmt(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().item()
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


class ProgressBar:
    """``bar.update(n, reward=..., loss=...)`` advances by ``n`` and shows the metrics.

    Args:
        total: total units (frames, iterations); ``None`` if unknown.
        desc: label. disable: no output at all. log_every: fallback logging period.
        **tqdm_kwargs: passed to ``tqdm`` (e.g. ``file=``, ``mininterval=``).
    """

    def __init__(
        self,
        total: int | None = None,
        desc: str = "",
        disable: bool = False,
        log_every: int = 10,
        **tqdm_kwargs: Any,
    ) -> None:
        self.total, self.desc, self.disable = total, desc, disable
        self.n, self.metrics = 0, {}
        self._updates, self.log_every = 0, log_every
        self._bar = None
        if not disable and importlib.util.find_spec("tqdm") is not None:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, desc=desc, dynamic_ncols=True, **tqdm_kwargs)

    def update(self, n: int = 1, **metrics: Any) -> None:
        """Advance by ``n`` and replace the shown metrics with ``metrics`` (if any)."""
        self.n += n
        self._updates += 1
        if metrics:
            self.metrics = {k: _fmt(v) for k, v in metrics.items()}
        if self.disable:
            return
        if self._bar is not None:
            if metrics:
                self._bar.set_postfix(self.metrics, refresh=False)
            self._bar.update(n)
        elif self._updates % self.log_every == 0:
            done = f"{self.n}/{self.total}" if self.total else str(self.n)
            _log.info("%s %s %s", self.desc, done, " ".join(f"{k}={v}" for k, v in self.metrics.items()))

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> "ProgressBar":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
