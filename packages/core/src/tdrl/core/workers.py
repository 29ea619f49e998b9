"""Worker-process plumbing shared by :class:`~tdrl.core.envs.ParallelEnv` and the
multi-process collectors: a worker that exits with its parent, the start method, pickling of
what a worker builds from, stopping workers, and the shutdown / context-manager protocol."""

from __future__ import annotations

import ctypes
import importlib.util
import multiprocessing as mp
import os
import pickle
import signal
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["WARN_EVERY_S", "parent_token", "exit_with_parent", "dumps", "send", "serve_commands",
           "stop_workers", "kill_hung", "default_start_method", "WorkerLifecycle"]

WARN_EVERY_S = 60.0
"""Seconds between the warnings of a wait without a timeout (``timeout=None``)."""
_PR_SET_PDEATHSIG = 1


def parent_token() -> tuple[int, bool]:
    """What a worker needs to follow its parent: the parent's pid, and whether the
    parent-death signal may be used (it fires when the *thread* that started the worker
    exits, so only when that is the main thread)."""
    return os.getpid(), threading.current_thread() is threading.main_thread()


def exit_with_parent(token: tuple[int, bool], poll_s: float = 0.5) -> None:
    """In a worker process: exit as soon as the process that started it dies.

    On Linux ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` makes the kernel kill the worker when its
    parent dies; everywhere a daemon thread polls ``os.getppid()`` (a dead parent's
    children are re-parented) and calls ``os._exit``. Without this a worker whose parent
    was killed (``kill -9``) waits on its pipe forever when a sibling holds the other end.
    """
    parent_pid, pdeathsig = token
    if pdeathsig and sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):  # pragma: no cover - no prctl: the thread remains
            pass
    if os.getppid() != parent_pid:
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent_pid:
                os._exit(1)

    threading.Thread(target=watch, name="tdrl-parent-watch", daemon=True).start()


def dumps(obj) -> bytes:
    """Pickle what a worker builds from (cloudpickle where installed: lambdas and closures)."""
    if importlib.util.find_spec("cloudpickle") is not None:
        import cloudpickle

        return cloudpickle.dumps(obj)
    return pickle.dumps(obj)


def send(conn, msg) -> None:
    """Send on a pipe whose other end may be gone (its death is reported elsewhere)."""
    try:
        conn.send(msg)
    except (BrokenPipeError, OSError, EOFError):
        pass


def serve_commands(conn, handle: Callable[[str, Any], bool], report: Callable = send) -> None:
    """A worker's command loop: ``handle(cmd, arg)`` for each ``(cmd, arg)`` the trainer sends,
    until it returns True (the worker closed) or the trainer is gone. A command that raises
    sends ``("error", <traceback>)`` back through ``report(conn, msg)`` and the loop goes on."""
    while True:
        try:
            cmd, arg = conn.recv()
        except (EOFError, OSError, KeyboardInterrupt):
            break  # the trainer is gone
        try:
            if handle(cmd, arg):
                break
        except BaseException:  # noqa: BLE001 - everything goes back to the trainer
            report(conn, ("error", traceback.format_exc()))


def stop_workers(procs: list, conns: list, timeout: float) -> None:
    """Ask the workers to close, then terminate and kill what is left (idempotent)."""
    for conn in conns:
        send(conn, ("close", None))
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(1.0)
        if p.is_alive():
            p.kill()
            p.join(1.0)
    for conn in conns:
        try:
            conn.close()
        except OSError:
            pass


def kill_hung(procs: list) -> None:
    """Kill worker processes known not to answer (past their timeout) and reap them.

    A hung worker would not read a ``close`` either: waiting the shutdown timeout for it
    only delays the error (the hang was reported ``shutdown_timeout`` seconds late)."""
    for p in procs:
        if p.is_alive():
            p.kill()
    for p in procs:
        p.join(1.0)


def default_start_method() -> str:
    """``fork`` where it is safe (available, CUDA not initialised), else ``spawn``."""
    methods = mp.get_all_start_methods()
    if "fork" in methods and not torch.cuda.is_initialized():
        return "fork"
    return "spawn"


class WorkerLifecycle:
    """Shutdown and context management of a collector with workers: ``shutdown`` runs the
    ``weakref.finalize`` set in ``__init__`` once (``_closed`` says it ran); ``with`` shuts down."""

    _closed: bool
    _finalizer: weakref.finalize

    def shutdown(self) -> None:
        """Stop every worker (idempotent): close, then terminate/kill after a timeout."""
        if not self._closed:
            self._closed = True
            self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
