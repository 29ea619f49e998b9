"""Multi-process collectors: one :class:`~tdrl.core.collectors.Collector` per worker process.

- :class:`MultiSyncCollector` asks every worker for a batch when the trainer asks for
  one and returns them stacked: ``(num_workers, *env_batch, T)``. Workers wait while the
  trainer trains, so every batch is collected with the latest weights (on-policy).
- :class:`MultiAsyncCollector` keeps every worker collecting and returns the first batch
  ready, ``(*env_batch, T)``; a worker starts its next batch as soon as its last one was
  copied out (weights may lag by one batch: off-policy use).

Transport: each worker owns a shared-memory TensorDict into which it writes every batch
(the trainer copies it out); policy weights live in one shared-memory TensorDict that the
trainer overwrites in :meth:`update_policy_weights_` and the workers copy into their policy
(under a lock) when told to. Faults: a worker whose env or policy raises sends its
traceback, a worker that dies is noticed through its process sentinel; both surface in
the trainer as :class:`~tdrl.core.envs.WorkerError` (after every worker is stopped).
``shutdown()``, garbage collection and interpreter exit stop all workers.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import pickle
import time
import traceback
import weakref
from collections.abc import Callable, Sequence
from multiprocessing.connection import wait as mp_wait

import torch
import torch.multiprocessing  # noqa: F401 - registers the shared-memory tensor reductions
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import InteractionType

from ..envs import EnvBase, WorkerError
from ..envs.parallel import DEFAULT_TIMEOUT_S
from ..envs.seeding import seed_from_torch, seed_if_unseeded
from ..workers import (WARN_EVERY_S, WorkerLifecycle, default_start_method, dumps, exit_with_parent, kill_hung, parent_token,
                       send, serve_commands, stop_workers)
from .single import Collector
from .contract import BatchCollector

__all__ = ["MultiSyncCollector", "MultiAsyncCollector", "WorkerError"]

_log = logging.getLogger(__name__)


def _worker_main(idx: int, conn, payload: bytes, weights, lock, token=None,
                 inherited=None) -> None:
    """Body of a worker: build a Collector, then serve commands until ``close``."""
    if token is not None:
        exit_with_parent(token)  # no orphan when the trainer is killed
    for parent_end in inherited or ():  # fork: the trainer's ends of every pipe so far
        parent_end.close()
    torch.set_num_threads(1)
    collector = None
    try:
        make_env, policy, kwargs, n_workers, default_seed = pickle.loads(payload)
        collector = Collector(make_env, policy, **kwargs)
        seed_if_unseeded(collector.env, default_seed)  # the trainer's draw, for an env its maker left unseeded
        collector._traj_stride, collector._traj_offset = n_workers, idx
        params = TensorDict.from_module(collector.policy).data if weights is not None else None
        if params is not None:
            with lock:
                params.update_(weights)
    except BaseException:  # noqa: BLE001 - everything goes back to the trainer
        send(conn, ("error", traceback.format_exc()))
        return
    buf = None

    def handle(cmd: str, arg) -> bool:
        nonlocal buf
        if cmd == "collect":
            batch = collector.rollout()
            if buf is None:
                buf = batch.clone().share_memory_()
                conn.send(("ready", buf))
            else:
                buf.update_(batch)
                conn.send(("ready", None))
        elif cmd == "update":
            with lock:
                params.update_(weights)
            conn.send(("updated", None))
        elif cmd == "seed":
            conn.send(("seeded", collector.set_seed(arg)))
        elif cmd == "close":
            collector.shutdown()
            send(conn, ("closed", None))
            return True
        else:
            raise ValueError(f"unknown command {cmd!r}")
        return False

    serve_commands(conn, handle)


class _MultiCollector(WorkerLifecycle, BatchCollector):
    """Shared machinery of the multi-process collectors (not public)."""

    _sync: bool = True

    def __init__(
        self,
        create_env_fn: Callable[[], EnvBase] | Sequence[Callable[[], EnvBase]],
        policy: Callable[[TensorDictBase], TensorDictBase] | None = None,
        *,
        num_workers: int | None = None,
        frames_per_batch: int,
        total_frames: int = -1,
        init_random_frames: int = 0,
        split_trajs: bool = False,
        exploration_type: InteractionType | str = InteractionType.RANDOM,
        device: torch.device | str | None = None,
        max_frames_per_traj: int | None = None,
        reset_at_each_iter: bool = False,
        seed: int | None = None,
        start_method: str | None = None,
        timeout: float | None = DEFAULT_TIMEOUT_S,
        shutdown_timeout: float = 5.0,
        compact_obs: bool = False,
    ) -> None:
        if num_workers is not None and (isinstance(num_workers, bool) or not isinstance(
                num_workers, int) or num_workers < 1):
            raise ValueError(f"num_workers must be an int >= 1 (or None for 2), got "
                             f"{num_workers!r}.")
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds or None, got {timeout!r}.")
        if not frames_per_batch >= 1:
            raise ValueError(f"frames_per_batch must be >= 1, got {frames_per_batch!r}.")
        fns = list(create_env_fn) if isinstance(create_env_fn, Sequence) else None
        if fns is None:
            if isinstance(create_env_fn, EnvBase):
                raise TypeError("Multi-process collectors need a callable that builds the env "
                                "in each worker, not an env instance.")
            fns = [create_env_fn] * (2 if num_workers is None else num_workers)
        elif num_workers is not None and num_workers != len(fns):
            raise ValueError(f"num_workers={num_workers} but {len(fns)} env functions given.")
        self.num_workers = n = len(fns)
        if n < 1:
            raise ValueError("Need at least one worker (an empty list of env functions was given).")
        per_worker = -(-frames_per_batch // n) if self._sync else frames_per_batch
        self.split_trajs = split_trajs
        self.compact_obs = bool(compact_obs)  # each worker's Collector drops ("next", obs)
        self.total_frames = int(total_frames)
        self.timeout = timeout
        self.shutdown_timeout = shutdown_timeout
        self.frames = 0
        self._policy = policy
        self._closed = False
        ctx = mp.get_context(start_method or default_start_method())
        self._lock = ctx.Lock()
        self._weights = None
        if isinstance(policy, torch.nn.Module):
            self._weights = TensorDict.from_module(policy).data.clone().share_memory_()
        kwargs = dict(frames_per_batch=per_worker, total_frames=-1,
                      init_random_frames=-(-init_random_frames // n) if self._sync
                      else init_random_frames,
                      exploration_type=exploration_type, device=device,
                      max_frames_per_traj=max_frames_per_traj,
                      reset_at_each_iter=reset_at_each_iter, compact_obs=compact_obs)
        self._procs, self._conns = [], []
        self._finalizer = weakref.finalize(self, stop_workers, self._procs, self._conns,
                                           shutdown_timeout)
        token = parent_token()
        fork = ctx.get_start_method() == "fork"
        # no seed: one draw here (forked or spawned workers all start from one generator state)
        base = seed_from_torch(1000 * n) if seed is None else None
        for i, fn in enumerate(fns):
            kw = dict(kwargs, seed=None if seed is None else seed + 1000 * i)
            payload = dumps((fn, policy, kw, n, None if base is None else base + 1000 * i))
            parent, child = ctx.Pipe()
            inherited = [parent, *self._conns] if fork else None
            p = ctx.Process(target=_worker_main,
                            args=(i, child, payload, self._weights, self._lock, token, inherited),
                            name=f"tdrl-collector-{i}", daemon=False)
            p.start()
            child.close()
            self._procs.append(p)
            self._conns.append(parent)
        self._bufs: list[TensorDictBase | None] = [None] * n
        self._busy = [False] * n  # a "collect" is in flight
        self._asked: list[tuple[str, float] | None] = [None] * n  # last command, when
        self._pending_acks = [0] * n
        self.frames_per_batch = per_worker * n if self._sync else per_worker
        if self.total_frames > 0 and self.total_frames % self.frames_per_batch:
            self.total_frames = -(-self.total_frames // self.frames_per_batch) * self.frames_per_batch

    # ------------------------------------------------------------------ messaging
    def _fail(self, msg: str, hung=()):
        """Shut down and raise; the ``hung`` workers are killed first (they would not answer
        a ``close``), so the error comes at the timeout, not ``shutdown_timeout`` later."""
        kill_hung([self._procs[i] for i in hung])
        self.shutdown()
        raise WorkerError(msg)

    def _request(self, i: int, cmd: str, arg=None) -> None:
        if not self._procs[i].is_alive():
            self._report_death(i, f"cannot send it {cmd!r}")
        try:
            self._conns[i].send((cmd, arg))
            if not (cmd == "update" and self._busy[i]):  # a collect in flight keeps its age
                self._asked[i] = (cmd, time.monotonic())
        except (BrokenPipeError, OSError) as err:
            self._fail(f"Collector worker {i} cannot be reached ({err!r}); cannot send {cmd!r}.")

    def _receive(self, wanted: set[int]) -> tuple[int, str, object]:
        """Next message from one of the ``wanted`` workers, failing on errors and deaths."""
        start = time.monotonic()
        deadline = None if self.timeout is None else start + self.timeout
        index = {c: i for i, c in enumerate(self._conns)}
        sentinels = {p.sentinel: i for i, p in enumerate(self._procs)}
        while True:
            if self._closed:
                raise RuntimeError("This collector was shut down.")
            now = time.monotonic()
            if deadline is not None:  # a worker's clock starts when it was asked, not here
                deadline = min([deadline] + [self._asked[i][1] + self.timeout for i in wanted
                                             if self._asked[i]])
            left = WARN_EVERY_S if deadline is None else max(0.0, deadline - now)
            ready = mp_wait([self._conns[i] for i in wanted] + [self._procs[i].sentinel for i in wanted],
                            timeout=left)
            now = time.monotonic()
            if self.timeout is not None:  # async: others answering must not hide a hung one
                answered = {index[r] for r in ready if r in index}  # read, not yet received
                stale = [i for i in wanted if i not in answered
                         and self._asked[i] and now - self._asked[i][1] > self.timeout]
                if stale:
                    self._fail(f"{type(self).__name__}: no answer within timeout="
                               f"{self.timeout} s from {self._waited_on(stale)}. The env or "
                               "policy may hang; pass a larger timeout= if a batch "
                               "legitimately takes longer.", hung=stale)
            if not ready and deadline is None:
                _log.warning("%s: still waiting (timeout=None) for %s.", type(self).__name__,
                             self._waited_on(wanted))
                continue
            if not ready:
                self._fail(f"{type(self).__name__}: no answer within timeout={self.timeout} s "
                           f"from {self._waited_on(wanted)}. The env or policy may hang; pass "
                           "a larger timeout= if a batch legitimately takes longer.",
                           hung=[i for i in wanted if self._asked[i]])  # an idle one still closes
            # Deaths first: a live worker's messages must not hide a dead one's silence.
            for s in ready:
                if s in sentinels:
                    self._report_death(sentinels[s])
            for conn in (r for r in ready if r in index):
                i = index[conn]
                try:
                    kind, payload = conn.recv()
                except (EOFError, OSError):
                    self._report_death(i)
                if kind == "error":
                    self._fail(f"Collector worker {i} raised:\n{payload}")
                if kind == "updated" and self._pending_acks[i] > 0:
                    self._pending_acks[i] -= 1
                    if not self._sync:
                        continue  # async acks are only bookkeeping
                self._asked[i] = None
                return i, kind, payload

    def _waited_on(self, wanted) -> str:
        """``worker 1 (pid 123, 'collect' asked 12.3 s ago), ...``"""
        now, parts = time.monotonic(), []
        for i in sorted(wanted):
            cmd, when = self._asked[i] or ("nothing", now)
            parts.append(f"worker {i} (pid {self._procs[i].pid}, {cmd!r} asked "
                         f"{now - when:.1f} s ago)")
        return ", ".join(parts)

    def _report_death(self, i: int, context: str = "without reporting an error"):
        """Raise for a dead worker, with its last error message if it sent one."""
        conn, last_error = self._conns[i], None
        try:
            while conn.poll():
                kind, payload = conn.recv()
                if kind == "error":
                    last_error = payload
        except (EOFError, OSError):
            pass
        if last_error is not None:
            self._fail(f"Collector worker {i} raised:\n{last_error}")
        self._procs[i].join(0.5)
        self._fail(f"Collector worker {i} is dead (exit code {self._procs[i].exitcode}); "
                   f"{context}.")

    def _take(self, i: int, payload) -> None:
        if payload is not None:
            self._bufs[i] = payload
        self._busy[i] = False

    def _collect(self, i: int) -> None:
        """Ask worker ``i`` for its next batch."""
        self._request(i, "collect")
        self._busy[i] = True

    def _collect_idle(self) -> None:
        """Ask every idle worker for its next batch."""
        for i in range(self.num_workers):
            if not self._busy[i]:
                self._collect(i)

    # ------------------------------------------------------------------ API
    def update_policy_weights_(self, weights=None) -> None:
        """Send new policy weights to every worker, without restarting them.

        Args:
            weights: a module, or a TensorDict of parameters (``TensorDict.from_module``);
                ``None`` reads the policy the collector was built with.

        Raises:
            WorkerError: a worker is dead or does not answer (sync collectors wait for
                every worker to confirm; async ones check that each is alive).
        """
        if self._closed:
            raise RuntimeError("This collector was shut down.")
        if self._weights is None:
            raise TypeError("update_policy_weights_ needs a torch.nn.Module policy.")
        src = self._policy if weights is None else weights
        if isinstance(src, torch.nn.Module):
            src = TensorDict.from_module(src)
        if isinstance(src, dict):
            src = TensorDict(src).unflatten_keys(".")
        with self._lock:
            self._weights.update_(src.data if hasattr(src, "data") else src)
        for i in range(self.num_workers):
            self._request(i, "update")
            self._pending_acks[i] += 1
        if self._sync:
            waiting = set(range(self.num_workers))
            while waiting:
                i, kind, _ = self._receive(waiting)
                if kind == "updated":
                    waiting.discard(i)

    def set_seed(self, seed: int) -> int:
        """Seed worker ``i``'s env with ``seed + 1000 * i``; returns the next free seed."""
        for i in range(self.num_workers):
            self._request(i, "seed", seed + 1000 * i)
        waiting, last = set(range(self.num_workers)), seed
        while waiting:
            i, kind, payload = self._receive(waiting)
            if kind == "seeded":
                waiting.discard(i)
                last = max(last, payload)
            elif kind == "ready":
                self._take(i, payload)
        return last

    @property
    def workers(self) -> list:
        """The worker processes (``multiprocessing.Process``)."""
        return list(self._procs)


class MultiSyncCollector(_MultiCollector):
    """Collects one batch from every worker, stacked: ``(num_workers, *env_batch, T)``.

    Args:
        create_env_fn: a callable building the env (used by ``num_workers`` workers, default
            2), or a list of callables (one per worker).
        policy: as in :class:`~tdrl.core.collectors.Collector`; pickled into each worker.
        num_workers: number of processes when ``create_env_fn`` is a single callable.
        frames_per_batch: frames per yielded batch over all workers (split evenly).
        start_method: ``"fork"`` (default on Linux without CUDA) or ``"spawn"``.
        timeout: seconds to wait for an answer before failing with a
            :class:`~tdrl.core.envs.WorkerError` naming the workers waited on and for what;
            default :data:`~tdrl.core.envs.parallel.DEFAULT_TIMEOUT_S` (300 s). ``None``
            waits while they are alive, logging a warning every minute. Deaths and errors
            are always reported at once; workers exit by themselves within about a second
            when the trainer process dies (even by ``kill -9``).
        shutdown_timeout: seconds a worker gets to exit before it is terminated.
        Other arguments: as in :class:`~tdrl.core.collectors.Collector` (``seed`` seeds
        worker ``i`` with ``seed + 1000 * i``; ``None`` draws one from torch's default
        generator in the trainer, used by the workers whose env its maker left unseeded,
        :mod:`tdrl.core.envs.seeding`).
    """

    _sync = True

    def next_batch(self) -> TensorDictBase:
        """Collect one batch from every worker and return them stacked (a copy)."""
        self._collect_idle()
        waiting = set(range(self.num_workers))
        while waiting:
            i, kind, payload = self._receive(waiting)
            if kind == "ready":
                self._take(i, payload)
                waiting.discard(i)
        out = torch.stack(self._bufs, 0)
        self.frames += self.frames_per_batch
        return out


class MultiAsyncCollector(_MultiCollector):
    """Returns the first batch ready among the workers, ``(*env_batch, T)``.

    Every worker collects ``frames_per_batch`` frames per batch and starts the next one
    as soon as its last was copied out. Arguments as in :class:`MultiSyncCollector`.
    """

    _sync = False

    def next_batch(self) -> TensorDictBase:
        """The next batch any worker finishes (a copy); that worker starts another."""
        self._collect_idle()
        busy = {i for i in range(self.num_workers) if self._busy[i]}
        while True:
            i, kind, payload = self._receive(busy)
            if kind == "ready":
                break
        self._take(i, payload)
        out = self._bufs[i].clone()
        self._collect(i)
        self.frames += self.frames_per_batch
        return out
