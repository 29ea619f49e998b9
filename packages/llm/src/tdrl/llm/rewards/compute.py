"""Apply several reward functions to a batch; a function that raises or hangs gives 0 and is counted."""

from __future__ import annotations

import inspect
import logging
import math
import threading
from collections.abc import Callable, Mapping, Sequence

import torch

__all__ = ["DEFAULT_REWARD_TIMEOUT_S", "RewardFn", "RewardTimeout", "bind_reward", "call_with_timeout", "compute_rewards"]

log = logging.getLogger(__name__)

RewardFn = Callable[..., list[float]]

DEFAULT_REWARD_TIMEOUT_S = 60.0


class RewardTimeout(TimeoutError):
    """A reward function did not return within its time limit."""


def call_with_timeout(call: Callable[[], list], timeout: float | None, name: str = "reward function") -> list:
    """``call()`` in a daemon worker thread, waiting at most ``timeout`` seconds.

    A Python thread cannot be killed: on a timeout the worker is abandoned and keeps running
    in the background (as a daemon it does not keep the interpreter alive at exit). A reward
    that can hang on external work should bound that work itself (the code sandbox does).

    Args:
        call: a no-argument callable.
        timeout: seconds; ``None`` or ``0`` calls ``call`` in the caller's thread, without limit.
        name: what to name in the error.

    Raises:
        RewardTimeout: ``call`` did not return in time.
        Exception: whatever ``call`` raised.
    """
    if not timeout:
        return call()
    box: dict = {}

    def work():
        try:
            box["value"] = call()
        except BaseException as exc:  # handed to the caller
            box["error"] = exc

    worker = threading.Thread(target=work, name=f"tdrl-reward-{name}", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise RewardTimeout(
            f"{name} did not return within {timeout:g} s (reward_timeout); its thread is left running "
            f"in the background because Python threads cannot be killed. Make the function faster, "
            f"bound its own waits, or raise the limit (GRPOConfig.reward_timeout)."
        )
    if "error" in box:
        raise box["error"]
    return box["value"]


def _name(fn) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


def bind_reward(fn: RewardFn, prompts: Sequence, completions: Sequence[str], columns: dict) -> Callable[[], list]:
    """A no-argument call of ``fn`` on the batch, TRL's way when ``fn`` allows it.

    TRL calls reward functions with keywords (``f(prompts=..., completions=..., **columns)``),
    so ``def f(completions, **kwargs)`` works there; tdrl's own rewards take
    ``(prompts, completions, **columns)``, which binds either way. Keywords are used when
    the signature accepts them, else the two positional arguments.

    Raises:
        TypeError: ``fn`` can take the batch neither way (a signature problem, reported at
            once rather than scored 0 on every batch).
    """
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins / C callables: no signature to check
        return lambda: fn(prompts, completions, **columns)
    keywords = {**columns, "prompts": prompts, "completions": completions}
    try:
        sig.bind(**keywords)
        return lambda: fn(**keywords)
    except TypeError:
        pass
    try:
        sig.bind(prompts, completions, **columns)
        return lambda: fn(prompts, completions, **columns)
    except TypeError as exc:
        raise TypeError(
            f"reward function {_name(fn)}{sig} cannot take the batch: it is called as "
            f"f(prompts=..., completions=..., **columns) (TRL's convention) or "
            f"f(prompts, completions, **columns), with columns {sorted(columns)}; "
            f"add **kwargs to accept the columns it does not use ({exc})."
        ) from None


def compute_rewards(
    reward_fns: Sequence[RewardFn],
    prompts: Sequence,
    completions: Sequence[str],
    columns: Mapping[str, Sequence] | None = None,
    weights: Sequence[float] | None = None,
    timeout: float | None = DEFAULT_REWARD_TIMEOUT_S,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """Evaluate reward functions and sum them with weights.

    A reward function that raises, does not return within ``timeout`` seconds, returns the
    wrong number of values, or returns a value that is not a finite number gives 0 for the
    affected samples; the count is reported. A function whose signature cannot take the batch
    raises a ``TypeError`` at once. A function that times out is left running in a background
    thread (threads cannot be killed), so the caller is never blocked longer than ``timeout``
    per function.

    Args:
        reward_fns: ``K`` callables ``(prompts, completions, **columns) -> list[float]``,
            called with keywords when their signature allows it (TRL's convention, so
            ``def f(completions, **kwargs)`` works), else positionally.
        prompts: ``N`` prompts.
        completions: ``N`` completion texts.
        columns: extra dataset columns, each of length ``N``, passed as keyword arguments.
        weights: ``K`` weights (default all 1).
        timeout: seconds each function may take per batch (default 60); ``None`` or ``0``:
            no limit, the function runs in the caller's thread.

    Returns:
        ``(total [N], per_function [N, K], stats)`` where ``stats`` holds
        ``"reward_errors"`` (samples that got 0 because of an error or a timeout),
        ``"reward_timeouts"`` (functions that timed out) and the mean of each function
        (``"reward/<name>"``).
    """
    if timeout is not None and not (timeout >= 0 and math.isfinite(timeout)):
        raise ValueError(f"compute_rewards: timeout={timeout!r}; expected seconds > 0, or None / 0 for no limit")
    n = len(completions)
    weights = [1.0] * len(reward_fns) if weights is None else list(weights)
    if len(weights) != len(reward_fns):
        raise ValueError(f"compute_rewards: {len(reward_fns)} reward functions but {len(weights)} weights")
    per_fn = torch.zeros(n, len(reward_fns))
    errors = timeouts = 0
    stats: dict[str, float] = {}
    calls = [bind_reward(fn, prompts, completions, dict(columns or {})) for fn in reward_fns]
    for k, (fn, call) in enumerate(zip(reward_fns, calls)):
        try:
            values = list(call_with_timeout(call, timeout, f"reward function {_name(fn)}"))
            if len(values) != n:
                raise ValueError(f"returned {len(values)} values for {n} completions")
        except RewardTimeout as exc:
            log.warning("%s; its rewards are 0 for this batch", exc)
            timeouts += 1
            errors += n
            values = [0.0] * n
        except Exception as exc:  # a broken reward must never stop training
            log.warning("reward function %s raised %r; its rewards are 0 for this batch", _name(fn), exc)
            errors += n
            values = [0.0] * n
        for i, v in enumerate(values):
            try:
                v = float(v)
            except (TypeError, ValueError):
                v = math.nan
            if not math.isfinite(v):
                errors += 1
                v = 0.0
            per_fn[i, k] = v
        stats[f"reward/{_name(fn)}"] = per_fn[:, k].mean().item() if n else 0.0
    total = per_fn @ torch.tensor(weights, dtype=per_fn.dtype)
    stats["reward_errors"] = float(errors)
    stats["reward_timeouts"] = float(timeouts)
    return total, per_fn, stats
