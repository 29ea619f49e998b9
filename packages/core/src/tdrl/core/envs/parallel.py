""":class:`ParallelEnv`: sub-environments in worker processes, data through shared memory.

Each worker owns one sub-env and one row of three shared-memory TensorDict buffers (inputs:
actions, state and the ``"_reset"`` mask; step outputs; reset outputs). A command is a short
message on a pipe; the worker reads its row, runs the env, writes its row and answers
``("ok", result)`` or ``("error", traceback)``. The main process waits with ``poll`` and a
liveness check, so a worker that raises surfaces as a :class:`WorkerError` carrying the
worker's traceback, and a worker that dies (even ``kill -9``) is detected instead of hanging.
``close()``, garbage collection and interpreter exit all terminate the workers.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import pickle
import time
import traceback
import weakref
from multiprocessing.reduction import ForkingPickler as _ForkingPickler
from collections.abc import Callable, Sequence

import torch

from tdrl.core.workers import WARN_EVERY_S, dumps, exit_with_parent, kill_hung, parent_token

from .batched import BatchedEnvBase, SerialEnv, env_meta, per_worker_args, WorkerRunner
from .common import EnvBase

__all__ = ["ParallelEnv", "WorkerError", "DEFAULT_TIMEOUT_S"]

_log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 300.0
"""Default seconds a batched env or a multi-process collector waits for a worker's answer
before raising (``timeout=None`` waits without limit, logging a warning every minute)."""


class WorkerError(RuntimeError):
    """An exception raised inside a :class:`ParallelEnv` worker (message: its traceback)."""


# Wire protocol: a step is the single byte b"s" and its success answer b"k" (no pickling on
# the hot path); anything else is a pickled (command, argument) / (status, result) pair.
_STEP, _OK = b"s", b"k"


def _worker_main(idx: int, conn, parent_conns, payload: bytes, token=None) -> None:
    """Body of a worker process: build the env, then serve commands until ``close``."""
    if token is not None:
        exit_with_parent(token)
    for parent_conn in parent_conns or ():  # fork: the parent's ends of every pipe so far
        parent_conn.close()
    torch.set_num_threads(1)
    env = None
    try:
        fn, kwargs = pickle.loads(payload)
        env = fn(**kwargs)
        conn.send(("ok", env_meta(env)))
        _, (bufs, keys) = conn.recv()  # the shared-memory buffers
        runner = WorkerRunner(env, bufs, keys, idx)
    except BaseException:  # noqa: BLE001 - everything goes back to the parent
        _safe_send(conn, ("error", traceback.format_exc()))
        return
    while True:
        try:
            msg = conn.recv_bytes()
        except (EOFError, OSError, KeyboardInterrupt):
            break  # parent gone
        try:
            if msg == _STEP:
                runner.step()
                conn.send_bytes(_OK)
                continue
            cmd, arg = pickle.loads(msg)
            if cmd == "close":
                try:
                    env.close()
                finally:
                    _safe_send(conn, ("ok", None))
                break
            conn.send(("ok", runner.run(cmd, arg)))
        except BaseException:  # noqa: BLE001
            _safe_send(conn, ("error", traceback.format_exc()))


def _safe_send(conn, msg) -> None:
    try:
        conn.send(msg)
    except (OSError, BrokenPipeError, ValueError):
        pass


def _shutdown(procs: list, conns: list, timeout: float = 2.0) -> None:
    """Ask workers to close, then terminate / kill those that do not exit in time."""
    for conn, proc in zip(conns, procs, strict=False):
        if proc.is_alive():
            try:
                conn.send_bytes(pickle.dumps(("close", None)))
            except (OSError, BrokenPipeError, ValueError):
                pass
    for conn, proc in zip(conns, procs, strict=False):
        try:
            if proc.is_alive() and conn.poll(timeout):
                conn.recv_bytes()
        except (EOFError, OSError):
            pass
        proc.join(timeout)
        if proc.is_alive():
            _log.warning("ParallelEnv worker pid %s did not exit in %.1f s; terminating it.",
                         proc.pid, timeout)
            proc.terminate()
            proc.join(timeout)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout)
        conn.close()
    procs.clear()
    conns.clear()


class ParallelEnv(BatchedEnvBase):
    """``num_workers`` environments, each in its own process, batched along a leading dim.

    Args:
        num_workers: number of worker processes (one sub-env each).
        create_env_fn: callable returning an ``EnvBase`` (or a list of ``num_workers``).
            Lambdas work: the callable is sent with cloudpickle when it is installed.
        create_env_kwargs: keyword arguments for ``create_env_fn`` (or a list).
        device: device of the batched TensorDicts.
        start_method: multiprocessing start method (``"fork"`` by default on Linux,
            ``"spawn"`` elsewhere).
        timeout: seconds to wait for a worker's answer before raising, default
            :data:`DEFAULT_TIMEOUT_S` (300 s); ``None`` waits as long as the worker is alive,
            with a warning every minute naming the worker. Workers exit by themselves
            within about a second when this process dies (even by ``kill -9``).
        check_actions: check actions against the batched spec at every step.
        serial_for_single: TorchRL's: with ``num_workers == 1``, build a
            :class:`~tdrl.core.envs.SerialEnv` in this process instead (no worker).

    Raises:
        WorkerError: a worker raised; the message holds the worker's traceback.
        RuntimeError: a worker died or did not answer within ``timeout``.
    """

    def __new__(cls, num_workers: int = 1, *args, serial_for_single: bool = False, **kwargs):
        if serial_for_single and num_workers == 1:
            kwargs = {k: v for k, v in kwargs.items() if k not in ("start_method", "timeout")}
            return SerialEnv(num_workers, *args[:2], **kwargs)  # not a ParallelEnv: no __init__ below
        return super().__new__(cls)

    def __init__(
        self,
        num_workers: int,
        create_env_fn: Callable[..., EnvBase] | Sequence[Callable[..., EnvBase]],
        create_env_kwargs: dict | Sequence[dict] | None = None,
        device: torch.device | str = "cpu",
        start_method: str | None = None,
        timeout: float | None = DEFAULT_TIMEOUT_S,
        check_actions: bool = False,
        serial_for_single: bool = False,
    ) -> None:
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds or None, got {timeout!r}.")
        self.check_actions = check_actions
        self.timeout = timeout
        self._procs: list = []
        self._conns: list = []
        self.is_closed = False
        fns, kwargs = per_worker_args(num_workers, create_env_fn, create_env_kwargs)
        if start_method is None:
            start_method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
        import torch.multiprocessing as tmp  # registers the shared-memory tensor reductions

        ctx = tmp.get_context(start_method)
        token = parent_token()
        for i in range(num_workers):
            parent, child = ctx.Pipe()
            payload = dumps((fns[i], kwargs[i]))
            inherited = [parent, *self._conns] if start_method == "fork" else None
            proc = ctx.Process(
                target=_worker_main,
                args=(i, child, inherited, payload, token),
                daemon=True,
                name=f"tdrl-env-worker-{i}",
            )
            proc.start()
            child.close()
            self._procs.append(proc)
            self._conns.append(parent)
        # Terminate the workers on close(), garbage collection and interpreter exit
        # (weakref.finalize runs at exit too; it holds no reference to self).
        self._finalizer = weakref.finalize(self, _shutdown, self._procs, self._conns)
        try:
            metas = self._collect(list(range(num_workers)))
            self._setup(metas[0], num_workers, device)
            self._seeded = all(m["seeded"] for m in metas)  # sub-envs seeded by their maker keep it
            self._share_buffers()
            bufs = (self._in_buf, self._next_buf, self._reset_buf)
            keys = (self._in_keys, self._next_keys, self._reset_keys)
            for conn in self._conns:
                conn.send(("buffers", (bufs, keys)))
        except BaseException:
            self._finalizer()
            self.is_closed = True
            raise

    def _collect(self, workers: Sequence[int]) -> list:
        """Wait for one answer from each worker in ``workers``; raise on error or death."""
        results, first_error = [], None
        start = warned = time.monotonic()  # one deadline: the workers were all asked at once
        for i in workers:
            conn, proc = self._conns[i], self._procs[i]
            while not conn.poll(0.05):
                if not proc.is_alive() and not conn.poll(0):
                    self._fail(RuntimeError(
                        f"ParallelEnv worker {i} died (exit code {proc.exitcode}) without answering."
                    ))
                now = time.monotonic()
                if self.timeout is not None and now - start > self.timeout:
                    kill_hung([proc])  # it would not read a "close": no shutdown wait for it
                    self._fail(TimeoutError(
                        f"ParallelEnv worker {i} (pid {proc.pid}) did not answer within "
                        f"timeout={self.timeout} s; its env may hang. Pass a larger timeout= "
                        "if a step legitimately takes longer."
                    ))
                if self.timeout is None and now - warned > WARN_EVERY_S:
                    warned = now
                    _log.warning("ParallelEnv: still waiting for worker %d (pid %s) after "
                                 "%.0f s (timeout=None).", i, proc.pid, now - start)
            try:
                data = conn.recv_bytes()
            except (EOFError, OSError) as err:
                self._fail(RuntimeError(f"ParallelEnv worker {i} closed its pipe: {err!r}."))
            status, result = ("ok", None) if data == _OK else _ForkingPickler.loads(data)
            if status == "error" and first_error is None:
                first_error = WorkerError(f"ParallelEnv worker {i} raised:\n{result}")
            results.append(result)
        if first_error is not None:
            raise first_error
        return results

    def _fail(self, err: Exception):
        """A worker is gone: shut everything down and raise ``err``."""
        self.close()
        raise err

    def _run(self, cmd: str, workers: Sequence[int], arg) -> list:
        self._assert_open()
        msg = _STEP if cmd == "step" else pickle.dumps((cmd, arg))
        for i in workers:
            try:
                self._conns[i].send_bytes(msg)
            except (OSError, ValueError) as err:
                proc = self._procs[i]
                self._fail(RuntimeError(
                    f"ParallelEnv worker {i} is gone (alive={proc.is_alive()}, exit code "
                    f"{proc.exitcode}): {err!r}."
                ))
        return self._collect(workers)

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the workers (empty once closed)."""
        return [p.pid for p in self._procs]

    def _close(self) -> None:
        self._finalizer()

    def close(self) -> None:
        if not getattr(self, "is_closed", True):
            self.is_closed = True
            self._close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from __del__
            pass
