"""Wall-clock timers by name and the default device: TorchRL's ``timeit`` and
``get_available_device`` (``torchrl._utils``), which its SOTA scripts use.

``with timeit("update"): ...`` (or ``@timeit("update")``) adds the block's duration to a
class-wide table of ``name -> (mean per call, total, calls)``; ``timeit.todict(prefix="time")``
gives the means for a logger, ``timeit.print()`` logs the table (``logging``, never ``print``),
``timeit.printevery(n, total)`` does so ``n`` times over ``total`` calls, ``timeit.erase()``
empties it.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["get_available_device", "timeit"]

log = logging.getLogger("tdrl.timeit")


def get_available_device() -> torch.device:
    """CUDA when a GPU is visible, else MPS when available, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda:0")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


class timeit:  # noqa: N801 (TorchRL's spelling)
    """A named timer: a context manager, a decorator and a class-wide table of durations.

    Args:
        name: the row of the table this timer adds to.
    """

    table: dict[str, list[float]] = {}  # name -> [mean seconds per call, total seconds, calls]
    calls_seen = 0  # printevery's counter

    def __init__(self, name: str) -> None:
        self.name = name
        self.t0 = time.perf_counter()

    def __call__(self, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            with self:
                return fn(*args, **kwargs)
        return timed

    def start(self) -> timeit:
        self.t0 = time.perf_counter()
        return self

    def __enter__(self) -> timeit:
        return self.start()

    def elapsed(self) -> float:
        """Seconds since the timer started."""
        return time.perf_counter() - self.t0

    def __exit__(self, *exc: Any) -> None:
        self.record(self.name, self.elapsed())

    @classmethod
    def record(cls, name: str, seconds: float) -> None:
        """Add one call of ``seconds`` to row ``name``."""
        row = cls.table.setdefault(name, [0.0, 0.0, 0])
        row[1] += seconds
        row[2] += 1
        row[0] = row[1] / row[2]

    @classmethod
    def todict(cls, percall: bool = True, prefix: str | None = None) -> dict[str, float]:
        """``{[prefix/]name: mean seconds per call}`` (``percall=False``: total seconds)."""
        col = 0 if percall else 1
        return {(f"{prefix}/{k}" if prefix else k): v[col] for k, v in sorted(cls.table.items())}

    @classmethod
    def print(cls, prefix: str | None = None) -> str:
        """Log the table (one line per name: mean per call, total, calls); returns the text."""
        lines = [f"{(prefix + '/') if prefix else ''}{k}: {v[0]:.4f}s per call, {v[1]:.3f}s total, "
                 f"{int(v[2])} calls" for k, v in sorted(cls.table.items())]
        text = "\n".join(lines)
        if text:
            log.info("%s", text)
        return text

    @classmethod
    def printevery(cls, num_prints: int, total_count: int, *, erase: bool = False) -> None:
        """Call once per iteration: logs the table ``num_prints`` times over ``total_count``
        iterations (``erase=True`` then empties it)."""
        cls.calls_seen += 1
        every = max(1, total_count // max(1, num_prints))
        if cls.calls_seen % every == 0:
            cls.print()
            if erase:
                cls.erase()

    @classmethod
    def erase(cls) -> None:
        """Empty the table."""
        cls.table.clear()
