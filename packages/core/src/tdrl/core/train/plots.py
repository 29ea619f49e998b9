"""Learning-curve plots of a run's metric history (matplotlib, optional)."""

from __future__ import annotations

import importlib.util
import logging
import math
import os
from collections.abc import Sequence

__all__ = ["plot_curves"]

log = logging.getLogger(__name__)


def plot_curves(rows: Sequence[dict], path: str | os.PathLike, x: str, ys: Sequence[str],
                title: str = "", ylabel: str = "") -> bool:
    """Draw the columns ``ys`` of ``rows`` against ``x`` into the PNG ``path``.

    Rows without a value (or a NaN) for a column are skipped for that column; a column with a
    single point is drawn as a marker. Without matplotlib nothing is drawn and a warning says
    what to install (the run's other outputs are unaffected).

    Returns:
        Whether the file was written.
    """
    if importlib.util.find_spec("matplotlib") is None:
        log.warning("matplotlib is not installed: %s not drawn (pip install \"packages/core[apps]\").", path)
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for key in ys:
        pts = [(r[x], r[key]) for r in rows
               if x in r and r.get(key) not in (None, "") and not math.isnan(float(r[key]))]
        if pts:
            ax.plot(*zip(*pts), "o--" if len(pts) < 3 else "-", label=key)
    ax.set_xlabel(x)
    ax.set_ylabel(ylabel or ", ".join(ys))
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
