"""Killable reward calls: each timed call of a reward function runs in a worker process forked
from the caller, which is killed (with any process it started) when the call passes its deadline.

A Python thread cannot enforce a timeout: code that keeps the GIL (a catastrophic regex runs in
C without releasing it) delays the waiting thread, and an abandoned thread runs on. A worker
process is killed, so the caller returns within the timeout plus a fork and a kill (milliseconds)
whatever the reward does, and nothing is left running.

The worker is made with ``fork``: it inherits the reward function as it is in the caller's
memory, so lambdas, closures and bound methods need no pickling; only the *result* (the list of
scores) and an exception travel back, pickled. Consequences, documented where rewards are
described:

* side effects of the reward (a counter it increments, a cache it fills) happen in the worker
  and are lost with it; so are objects that cannot cross a fork (a CUDA context, a live network
  session: open them inside the reward, or mark it :func:`thread_safe_reward`);
* a reward whose waits are bounded by itself and which never keeps the GIL for long can be marked
  :func:`thread_safe_reward` to run in a thread of the caller instead (no fork; it keeps its
  side effects, and a timeout abandons the thread as before);
* where ``fork`` does not exist (Windows) the thread path is used for every reward, with a warning.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import pickle
import signal
import traceback
import warnings
from collections.abc import Callable

__all__ = ["RewardTimeout", "call_in_worker", "can_fork", "runs_in_thread", "thread_safe_reward"]

log = logging.getLogger(__name__)

_ATTR = "reward_in_thread"
_fork_missing_warned = False


class RewardTimeout(TimeoutError):
    """A reward function did not return within its time limit."""


class _WorkerTraceback(Exception):
    """The traceback of an exception raised in a reward's worker process (chained as the cause)."""

    def __str__(self) -> str:
        return "\n" + self.args[0]


def thread_safe_reward(fn):
    """Mark ``fn`` to run in a thread of the caller rather than a killable worker process.

    Only for a reward whose every wait is bounded by itself and that never keeps the GIL for long
    (no regex or parser over model output that can backtrack): a thread cannot be killed, so past
    its timeout such a reward is abandoned and runs on. The code-execution reward is marked
    (its programs run in sandboxes with their own timeouts).

    Returns:
        ``fn`` itself, with ``fn.reward_in_thread = True``.
    """
    setattr(fn, _ATTR, True)
    return fn


def runs_in_thread(fn) -> bool:
    """Whether ``fn`` was marked :func:`thread_safe_reward` (or sets ``reward_in_thread = True``)."""
    return bool(getattr(fn, _ATTR, False))


def can_fork() -> bool:
    """Whether worker processes can be forked here (POSIX)."""
    return "fork" in multiprocessing.get_all_start_methods()


def _die_with_parent() -> None:
    """Linux: the worker gets SIGKILL when the caller dies, so a killed trainer leaves no worker."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _portable(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling both ways, else a ``RuntimeError`` carrying its type and text."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def _work(call: Callable[[], object], conn) -> None:
    """The worker's body: run ``call``, send ``("ok", value)`` or ``("error", exception, traceback)``."""
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)  # its own process group: a kill reaches what the reward started too
    _die_with_parent()
    try:
        payload: tuple = ("ok", call())
    except BaseException as exc:  # handed to the caller
        payload = ("error", _portable(exc), traceback.format_exc())
    try:
        data = pickle.dumps(payload)
    except Exception as exc:  # a value that cannot be pickled
        data = pickle.dumps(("error", TypeError(f"the reward returned a value that cannot be sent back from its "
                                                f"worker process ({exc}); return a list of floats"), ""))
    conn.send_bytes(data)
    conn.close()


def _kill(proc) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        proc.kill()


def call_in_worker(call: Callable[[], object], timeout: float, name: str = "reward function"):
    """``call()`` in a worker process forked from this one, killed if it passes ``timeout`` s.

    Args:
        call: a no-argument callable (inherited by the fork: no pickling); its result must pickle.
        timeout: seconds (``> 0``).
        name: what to name in the errors.

    Returns:
        What ``call()`` returned.

    Raises:
        RewardTimeout: ``call`` did not return in time; the worker and every process in its
            group were killed, and reaped before this returns.
        Exception: what ``call`` raised (its traceback in the worker chained as the cause), or a
            ``RuntimeError`` when the worker died without answering (a signal, ``os._exit``).
    """
    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_work, args=(call, send), name=f"tdrl-reward-{name}"[:60])
    with warnings.catch_warnings():
        # Python 3.12+ warns that fork() in a threaded process may deadlock the child: the child
        # here only runs the reward, and a deadlock in it ends at the timeout like any other hang.
        warnings.filterwarnings("ignore", message=".*fork.*", category=DeprecationWarning)
        proc.start()
    send.close()
    data = None
    try:
        if recv.poll(timeout):
            with contextlib.suppress(EOFError, OSError):
                data = recv.recv_bytes()
        else:
            raise RewardTimeout(
                f"{name} did not return within {timeout:g} s (reward_timeout); its worker process was killed. "
                f"Make it faster, bound its own waits, or raise the limit (GRPOConfig.reward_timeout).")
    finally:
        if proc.is_alive():
            _kill(proc)
        proc.join()
        recv.close()
    if data is None:
        raise RuntimeError(f"{name}: its worker process ended without an answer (exit code {proc.exitcode}; "
                           f"a negative code is the signal that killed it, e.g. -9 for out of memory)")
    payload = pickle.loads(data)
    if payload[0] == "ok":
        return payload[1]
    _, exc, tb = payload
    if tb:
        exc.__cause__ = _WorkerTraceback(tb)
    raise exc


def warn_no_fork() -> None:
    """Warn once that rewards run in threads here (no ``fork``): their timeouts cannot kill them."""
    global _fork_missing_warned
    if not _fork_missing_warned:
        _fork_missing_warned = True
        log.warning("reward functions run in threads on this platform (no fork): a reward that passes its timeout "
                    "is abandoned, not killed")
