"""Python threads that run torch ops with the caller's intra-op thread count.

``torch.set_num_threads`` sets OpenMP's thread count for the calling thread only: a thread
started afterwards runs its torch ops with OpenMP's default team (one thread per core). On
small tensors that team's start-up and barriers cost far more than the op (ten to a hundred
times an element-wise op on a small tensor; the inference server's forward is where it
showed, see benchmarks/RESULTS.md, "Collectors"). Every thread tdrl starts that may run
torch ops carries the count over with :func:`carry_num_threads`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

import torch

__all__ = ["carry_num_threads", "thread_initializer"]

F = TypeVar("F", bound=Callable)


def carry_num_threads(fn: F) -> F:
    """``fn`` wrapped to first set, in whatever thread calls it, the intra-op thread count
    that the wrapping thread has now (``torch.get_num_threads()`` read at wrap time)."""
    n = torch.get_num_threads()

    @functools.wraps(fn)
    def run(*args, **kwargs):
        torch.set_num_threads(n)  # get_num_threads() would not tell: it reports the process value
        return fn(*args, **kwargs)

    return run  # type: ignore[return-value]


def thread_initializer() -> Callable[[], None]:
    """An ``initializer`` for :class:`concurrent.futures.ThreadPoolExecutor` that gives each
    pool thread the caller's intra-op thread count."""
    return carry_num_threads(lambda: None)
