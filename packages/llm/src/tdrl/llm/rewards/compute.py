"""Apply several reward functions to a batch: TRL's calling convention, per-call timeouts, and
what a failure does (a function that fails on a whole batch stops the run; a sample that fails
alone scores 0 and is counted).

With a timeout, a plain reward function runs in a worker process forked for the call and killed
at the deadline (:mod:`tdrl.llm.rewards.workers`): the timeout holds for code that keeps the GIL
(a backtracking regex) and nothing is left running. The fork inherits the function, so lambdas
and closures work unpickled, but its side effects stay in the worker; a reward marked
:func:`tdrl.llm.rewards.workers.thread_safe_reward` runs in a thread instead (abandoned, not
killed, past its timeout). A coroutine function (``async def``) with a timeout runs the same
way: awaited on an event loop of its own inside the forked worker, which is killed at the
deadline, so a coroutine that blocks its loop (a regex, ``time.sleep``) cannot hang the trainer
either; marked ``thread_safe_reward`` it is awaited in a thread of the caller and *cancelled*
at its timeout (``asyncio.wait_for``; one that blocks its loop is then abandoned). Blocking work
inside a reward (running programs, HTTP calls) can be spread over a bounded pool with
:func:`map_bounded`.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import torch

from tdrl.core.threads import carry_num_threads, thread_initializer
from tdrl.llm.rewards.sandbox import SandboxUnavailable
from tdrl.llm.rewards.workers import (
    RewardTimeout,
    call_in_worker,
    can_fork,
    runs_in_thread,
    thread_safe_reward,
    warn_no_fork,
)

__all__ = [
    "DEFAULT_REWARD_TIMEOUT_S",
    "ON_REWARD_ERROR",
    "RewardFn",
    "RewardFunctionError",
    "RewardTimeout",
    "as_messages",
    "bind_reward",
    "call_with_timeout",
    "compute_rewards",
    "is_async_reward",
    "is_conversational",
    "map_bounded",
    "thread_safe_reward",
    "wants_text",
]

log = logging.getLogger(__name__)

RewardFn = Callable[..., list[float]]

DEFAULT_REWARD_TIMEOUT_S = 60.0


def is_async_reward(fn) -> bool:
    """Whether ``fn`` is a coroutine function (``async def``, or an object with ``async def __call__``)."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))


def _timeout_message(name: str, timeout: float, cancelled: bool) -> str:
    if cancelled:
        return (f"{name} did not return within {timeout:g} s (reward_timeout); the coroutine was cancelled. "
                f"Make it faster, bound its own waits, or raise the limit (GRPOConfig.reward_timeout).")
    return (f"{name} did not return within {timeout:g} s (reward_timeout); its thread is left running "
            f"in the background because Python threads cannot be killed. Make the function faster, "
            f"bound its own waits, or raise the limit (GRPOConfig.reward_timeout).")


def _await_with_timeout(call: Callable[[], object], timeout: float | None, name: str) -> list:
    """Run the coroutine ``call()`` makes on a fresh event loop, cancelling it after ``timeout`` s.

    The loop runs in a daemon thread of its own, so this works whether or not the caller is
    already inside an event loop (a notebook) and whatever the coroutine blocks on; the wait for
    that thread is bounded too (a coroutine that blocks its loop without awaiting cannot be
    cancelled, and is then abandoned like a blocking function).
    """

    async def main():
        if not timeout:
            return await call()
        try:
            return await asyncio.wait_for(call(), timeout)
        except asyncio.TimeoutError:
            raise RewardTimeout(_timeout_message(name, timeout, cancelled=True)) from None

    box: dict = {}

    def work():
        try:
            box["value"] = asyncio.run(main())
        except BaseException as exc:  # handed to the caller
            box["error"] = exc

    worker = threading.Thread(target=carry_num_threads(work), name=f"tdrl-reward-{name}", daemon=True)
    worker.start()
    worker.join(None if not timeout else timeout + 5.0)  # cancellation itself may take a moment
    if worker.is_alive():
        raise RewardTimeout(_timeout_message(name, timeout, cancelled=False))
    if "error" in box:
        raise box["error"]
    return box["value"]


def call_with_timeout(call: Callable[[], list], timeout: float | None, name: str = "reward function",
                      is_async: bool = False, in_thread: bool = False) -> list:
    """``call()``, returning within about ``timeout`` seconds whatever it does.

    By default ``call()`` runs in a worker process forked for it and killed at the timeout
    (:func:`tdrl.llm.rewards.workers.call_in_worker`: no pickling of ``call``, its result must
    pickle, its side effects stay in the worker). With ``in_thread=True`` (a reward marked
    :func:`tdrl.llm.rewards.workers.thread_safe_reward`), or where ``fork`` does not exist, it
    runs in a daemon thread instead, which is abandoned at the timeout and keeps running (a
    thread cannot be killed). With ``is_async=True``, ``call()`` returns a coroutine, awaited on
    an event loop of its own: inside the killable worker by default, or (``in_thread``, no
    ``fork``) in a thread of the caller, cancelled at the timeout.

    Args:
        call: a no-argument callable (returning a coroutine when ``is_async``).
        timeout: seconds; ``None`` or ``0`` calls ``call`` in the caller's thread, without limit
            (a coroutine still gets a loop of its own).
        name: what to name in the error.
        is_async: ``call()`` returns a coroutine.
        in_thread: run in a thread rather than a killable process.

    Raises:
        RewardTimeout: ``call`` did not return in time.
        Exception: whatever ``call`` raised.
    """
    if is_async:
        if timeout and not in_thread and can_fork():  # the loop runs in the worker: killed at the deadline
            return call_in_worker(lambda: _await_with_timeout(call, None, name), timeout, name)
        return _await_with_timeout(call, timeout, name)
    if not timeout:
        return call()
    if not in_thread:
        if can_fork():
            return call_in_worker(call, timeout, name)
        warn_no_fork()
    box: dict = {}

    def work():
        try:
            box["value"] = call()
        except BaseException as exc:  # handed to the caller
            box["error"] = exc

    worker = threading.Thread(target=carry_num_threads(work), name=f"tdrl-reward-{name}", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise RewardTimeout(_timeout_message(name, timeout, cancelled=False))
    if "error" in box:
        raise box["error"]
    return box["value"]


def map_bounded(fn: Callable, items: Sequence, workers: int) -> list:
    """``[fn(x) for x in items]`` with at most ``workers`` calls running at once (threads).

    For blocking work that releases the GIL (subprocesses, I/O): the code-execution reward
    runs its programs this way. Results keep the order of ``items``; the first exception raised
    by a call is raised after every started call has finished (no call is left running).

    Raises:
        ValueError: ``workers`` is not a positive integer.
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"map_bounded: workers={workers!r}; expected an integer >= 1")
    items = list(items)
    if workers == 1 or len(items) <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=min(workers, len(items)), thread_name_prefix="tdrl-reward-pool",
                            initializer=thread_initializer()) as pool:
        futures = [pool.submit(fn, x) for x in items]
        return [f.result() for f in futures]


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


ON_REWARD_ERROR = ("raise_if_all", "zero", "raise")


class RewardFunctionError(RuntimeError):
    """A reward function failed in a way that must stop training (see ``on_error``)."""


def is_conversational(prompts: Sequence) -> bool:
    """Whether the prompts are chat-message lists (TRL's conversational format)."""
    return bool(prompts) and all(isinstance(p, Sequence) and not isinstance(p, str) for p in prompts)


def wants_text(fn) -> bool:
    """Whether ``fn`` reads completions as plain text even for conversational prompts.

    tdrl's own rewards (:mod:`tdrl.llm.rewards`) do; any other function gets TRL's message lists
    unless it sets ``fn.text_completions = True``.
    """
    flag = getattr(fn, "text_completions", None)
    if flag is not None:
        return bool(flag)
    return getattr(fn, "__module__", "").startswith("tdrl.llm.rewards")


def as_messages(completions: Sequence[str]) -> list[list[dict]]:
    """TRL's conversational completions: ``[[{"role": "assistant", "content": text}], ...]``."""
    return [[{"role": "assistant", "content": c}] for c in completions]


def _slice(columns: Mapping[str, Sequence], i: int) -> dict[str, list]:
    return {k: [v[i]] for k, v in columns.items()}


def _fail_message(name: str, n_failed: int | None, n: int, exc: BaseException, conversational: bool) -> str:
    hint = ""
    if conversational and isinstance(exc, (TypeError, AttributeError, KeyError, IndexError)):
        hint = (" The prompts are chat messages, so each completion is a message list "
                "[{'role': 'assistant', 'content': text}] (TRL's convention): read c[0]['content'], "
                "or set text_completions = True on the function to get plain text.")
    if n_failed is None:  # on_error="raise": the batch call's own error
        return (f"reward function {name} raised on this batch of {n} completions: {type(exc).__name__}: {exc} "
                f"(traceback chained above; GRPOConfig.on_reward_error='raise').{hint}")
    return (f"reward function {name} failed on {n_failed} of {n} completions of this batch, the first with "
            f"{type(exc).__name__}: {exc} (traceback chained above).{hint} A function that fails on a whole "
            f"batch is taken as a bug, not a flaky sample; GRPOConfig.on_reward_error='zero' scores such "
            f"batches 0 and trains on.")


def compute_rewards(
    reward_fns: Sequence[RewardFn],
    prompts: Sequence,
    completions: Sequence[str],
    columns: Mapping[str, Sequence] | None = None,
    weights: Sequence[float] | None = None,
    timeout: float | None = DEFAULT_REWARD_TIMEOUT_S,
    on_error: str = "raise_if_all",
    logged: set[str] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """Evaluate reward functions and sum them with weights.

    Conversational prompts (message lists) hand each function its completions as TRL does,
    ``[{"role": "assistant", "content": text}]``, except tdrl's own rewards and functions with
    ``text_completions = True``, which get the text.

    A function that raises on the batch is called again on each completion alone, to tell
    the samples that fail from those that do not. What happens then is ``on_error``:

    - ``"raise_if_all"`` (default): a function that fails on every completion of the batch is
      a bug: :class:`RewardFunctionError` is raised at once with the first traceback chained;
      the completions that fail alone score 0 and are counted;
    - ``"zero"``: every failure scores 0 and is counted (training never stops for a reward);
    - ``"raise"``: the first failure of any kind (a raise, a timeout, a wrong count) is raised.

    :class:`tdrl.llm.rewards.sandbox.SandboxUnavailable` (the code sandbox cannot isolate
    programs on this machine) is always raised as is: it is a setup error, not a sample's.

    A function that does not return within ``timeout`` seconds (its worker process is killed,
    coroutine functions included; one marked ``thread_safe_reward`` is left running in its
    thread, or cancelled if it is a coroutine function), returns the wrong number of values, or returns a value
    that is not a finite number, gives 0 for the affected samples and is counted (``"raise"``
    raises instead, but a non-finite value is always scored 0). The first traceback of each
    function is logged once per name in ``logged``. A function whose signature cannot take
    the batch raises a ``TypeError`` at once.

    Args:
        reward_fns: ``K`` callables ``(prompts, completions, **columns) -> list[float]``, or
            coroutine functions whose coroutine returns that list; called with keywords when their signature allows it (TRL's convention, so
            ``def f(completions, **kwargs)`` works), else positionally.
        prompts: ``N`` prompts (strings or message lists).
        completions: ``N`` completion texts.
        columns: extra dataset columns, each of length ``N``, passed as keyword arguments.
        weights: ``K`` weights (default all 1).
        timeout: seconds each function may take per batch (default 60), enforced by running it
            in a worker process forked for the call (see the module docstring: its side effects
            stay there); ``None`` or ``0``: no limit, the function runs in the caller's thread.
        on_error: ``"raise_if_all"``, ``"zero"`` or ``"raise"`` (above).
        logged: names of functions whose first traceback was already logged (updated); the
            trainer keeps one set per run. ``None``: log every batch's first traceback.

    Returns:
        ``(total [N], per_function [N, K], stats)`` where ``stats`` holds
        ``"reward_errors"`` (samples that got 0 because of an error, a timeout or a bad value),
        ``"reward_timeouts"`` (functions that timed out) and the mean of each function
        (``"reward/<name>"``).

    Raises:
        RewardFunctionError: as ``on_error`` says.
    """
    if timeout is not None and not (timeout >= 0 and math.isfinite(timeout)):
        raise ValueError(f"compute_rewards: timeout={timeout!r}; expected seconds > 0, or None / 0 for no limit")
    if on_error not in ON_REWARD_ERROR:
        raise ValueError(f"compute_rewards: on_error={on_error!r}; expected one of {ON_REWARD_ERROR}")
    n = len(completions)
    weights = [1.0] * len(reward_fns) if weights is None else list(weights)
    if len(weights) != len(reward_fns):
        raise ValueError(f"compute_rewards: {len(reward_fns)} reward functions but {len(weights)} weights")
    columns = dict(columns or {})
    conversational = is_conversational(prompts)
    messages = as_messages(completions) if conversational else None
    per_fn = torch.zeros(n, len(reward_fns))
    errors = timeouts = 0
    stats: dict[str, float] = {}
    given = [completions if messages is None or wants_text(fn) else messages for fn in reward_fns]
    calls = [bind_reward(fn, prompts, c, columns) for fn, c in zip(reward_fns, given)]
    for k, (fn, call) in enumerate(zip(reward_fns, calls)):
        name = _name(fn)
        try:
            values = _checked(call_with_timeout(call, timeout, f"reward function {name}", is_async_reward(fn),
                                                runs_in_thread(fn)), n)
        except SandboxUnavailable:
            raise  # the machine cannot isolate code: a setup error for every sample, whatever on_error says
        except RewardTimeout as exc:
            if on_error == "raise":
                raise RewardFunctionError(f"{exc} (GRPOConfig.on_reward_error='raise')") from exc
            log.warning("%s; its rewards are 0 for this batch", exc)
            timeouts += 1
            errors += n
            values = [0.0] * n
        except Exception as exc:
            if on_error == "raise":
                raise RewardFunctionError(_fail_message(name, None, n, exc, conversational)) from exc
            values, failed, first = _one_by_one(fn, prompts, given[k], columns, timeout, name, exc)
            if on_error == "raise_if_all" and failed == n:
                raise RewardFunctionError(_fail_message(name, failed, n, first, conversational)) from first
            errors += failed
            if logged is None or name not in logged:
                log.warning("reward function %s failed on %d of %d completions (scored 0; counted in reward_errors); "
                            "the first traceback:", name, failed, n, exc_info=first)
                if logged is not None:
                    logged.add(name)
        for i, v in enumerate(values):
            try:
                v = float(v)
            except (TypeError, ValueError):
                v = math.nan
            if not math.isfinite(v):
                errors += 1
                v = 0.0
            per_fn[i, k] = v
        stats[f"reward/{name}"] = per_fn[:, k].mean().item() if n else 0.0
    total = per_fn @ torch.tensor(weights, dtype=per_fn.dtype)
    stats["reward_errors"] = float(errors)
    stats["reward_timeouts"] = float(timeouts)
    return total, per_fn, stats


def _checked(values, n: int) -> list:
    values = list(values)
    if len(values) != n:
        raise ValueError(f"returned {len(values)} values for {n} completions")
    return values


def _one_by_one(fn, prompts, completions, columns, timeout, name, batch_exc) -> tuple[list, int, BaseException]:
    """Call ``fn`` on each sample alone after the batch call raised ``batch_exc``.

    Returns:
        ``(values, n_failed, first_exception)``; a failed sample's value is 0 (NaN is not
        used: it would count the sample twice).
    """
    values, failed, first = [], 0, None
    for i in range(len(completions)):
        try:
            call = bind_reward(fn, [prompts[i]], [completions[i]], _slice(columns, i))
            values.append(_checked(call_with_timeout(call, timeout, f"reward function {name}", is_async_reward(fn),
                                                     runs_in_thread(fn)), 1)[0])
        except Exception as exc:  # counted by the caller; a timeout here counts as a failure too
            failed += 1
            first = first or exc
            values.append(0.0)
    return values, failed, first or batch_exc
