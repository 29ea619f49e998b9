""":class:`InferenceCollector`: env workers that share one auto-batching policy server.

Each worker owns its env and steps it; the policy runs only in the
:class:`~tdrl.core.collectors.inference_server.InferenceServer` (a thread of the trainer
process), which answers the workers' requests in batches. A thread or process worker runs a
:class:`~tdrl.core.collectors.Collector` (its dict loop included) whose policy is its rows of
the server's shared slabs (:mod:`.inference_slab`); a Ray actor is stepped by the server
thread (:mod:`.inference_ray`). The trainer's loop is the same for every transport::

    col = InferenceCollector(make_env, policy, num_workers=8, frames_per_batch=1024,
                             transport="process")    # or "thread", "ray"
    for batch in col:                                        # (num_workers, *env_batch, T)
        ...train...
        col.update_policy_weights_()                        # live: the version goes up

Batches carry the usual keys plus ``("collector", "policy_version")``: the weights' version
that chose each step's action, and the collector's ``("collector", "traj_ids")``, disjoint
across workers (every transport runs the same worker :class:`~tdrl.core.collectors.Collector`). With a policy whose output for a row
depends only on that row (a deterministic policy, or ``exploration_type="mode"``) the data
under a fixed seed are the same for every transport and batching (tested). ``transport="local"`` runs the same process
workers each with its own copy of the policy and no server: the baseline of the benchmark
(its weights are fixed).

When it pays: the server saves each worker its policy forward, and costs each worker a
block and a wake-up per step (the measured trade-off by policy size is in
benchmarks/RESULTS.md, "Collectors"): use it for a policy on a GPU, a forward that dominates
the env step, or a box with a core per worker; with a small CPU policy on few cores, own copies
(:class:`MultiSyncCollector`) are faster.

Faults: a worker that raises sends its traceback, a dead process is seen through its
sentinel, a server that raises reports its traceback; each surfaces as
:class:`~tdrl.core.envs.WorkerError` after every worker was stopped, and a silent worker
fails after ``timeout`` seconds naming it. Process workers exit with the trainer (even
``kill -9``), as in :mod:`.multi`.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import pickle
import queue
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Iterator

import torch
import torch.multiprocessing  # noqa: F401 - registers the shared-memory tensor reductions
from tensordict import TensorDictBase
from tensordict.nn import InteractionType

from ..envs import EnvBase, WorkerError
from ..envs.parallel import DEFAULT_TIMEOUT_S
from ..envs.seeding import seed_from_torch
from ..threads import carry_num_threads
from .inference_ray import RayEnvWorker, RayHub
from .inference_server import InferenceServer, versioned, worker_collector
from .inference_slab import DEFAULT_SPIN_S, QueueConn, SlabHub, SlabLayout, SlabPolicy
from ..workers import (WorkerLifecycle, default_start_method, dumps, exit_with_parent, kill_hung, parent_token,
                       serve_commands, stop_workers)
from .single import as_interaction_type

__all__ = ["InferenceCollector"]

_log = logging.getLogger(__name__)

TRANSPORTS = ("thread", "process", "ray", "local")


# ---------------------------------------------------------------------- worker side
def _worker(i: int, conn, request, reply, make_env, policy, in_keys: list, seed: tuple,
            frames: int, exploration: InteractionType, timeout: float, spin_s: float,
            n_workers: int, share: bool) -> None:
    """Body of a thread or process worker: a :class:`Collector` over its own env whose policy
    is its rows of the server's slabs (:class:`SlabPolicy`), or the policy itself
    (``"local"``); it answers commands until ``close``. ``seed``: (its seed, the default for an env
    its maker left unseeded), one of them None."""
    collector = None
    try:
        remote = None
        if policy is None:
            remote = SlabPolicy(in_keys, i, request.fileno(), reply.fileno(), timeout, spin_s)
        collector = worker_collector(make_env, remote if policy is None else policy, in_keys,
                                     frames, exploration, seed[0], i, n_workers, policy is not None,
                                     default_seed=seed[1])
        example = None if remote is None else collector._td.select(*in_keys)
        conn.send(("hello", (example, collector.steps_per_batch)))
    except BaseException:  # noqa: BLE001 - everything goes back to the trainer
        conn.send(("error", traceback.format_exc()))
        if collector is not None:
            collector.shutdown()
        return
    buf, env_batch = None, collector.env.batch_size

    def handle(cmd: str, arg) -> bool:
        nonlocal buf
        if cmd == "slabs":
            remote.attach(arg)
        elif cmd == "collect":
            if remote is not None:
                remote.versions.clear()
            versions = remote.versions if remote is not None else [0] * collector.steps_per_batch
            batch = versioned(collector.rollout(), versions, env_batch)
            if not share:
                conn.send(("ready", batch))
            elif buf is None:
                buf = batch.share_memory_()
                conn.send(("ready", buf))
            else:
                buf.update_(batch)
                conn.send(("ready", None))
        elif cmd == "close":
            collector.shutdown()
            conn.send(("closed", None))
            return True
        return False

    serve_commands(conn, handle, report=lambda c, msg: c.send(msg))
    for end in (request, reply):
        if end is not None:
            end.close()


def _process_worker(i: int, conn, request, reply, payload: bytes, token, inherited=None) -> None:
    """Body of a process worker: follow the trainer, one torch thread, then :func:`_worker`."""
    exit_with_parent(token)
    for end in inherited or ():  # fork: the trainer's ends of every pipe so far
        end.close()
    torch.set_num_threads(1)
    try:
        args = pickle.loads(payload)
    except BaseException:  # noqa: BLE001
        conn.send(("error", traceback.format_exc()))
        return
    _worker(i, conn, request, reply, *args)


# ---------------------------------------------------------------------- trainer side
def _shutdown(hub, procs: list, conns: list, threads: list, timeout: float) -> None:
    if isinstance(hub, RayHub):
        hub.stop()
        hub.close(timeout)
        return
    hub.stop()  # wakes every worker that waits for an answer
    if procs:
        stop_workers(procs, conns, timeout)
    for i in range(hub.n if threads else 0):
        hub.command(i, "close")
    for t in threads:
        t.join(timeout)
    hub.close()


class InferenceCollector(WorkerLifecycle):
    """Env workers sharing one batching policy server; batches ``(num_workers, *env_batch, T)``.

    Args:
        create_env_fn: a callable building one worker's env (picklable by cloudpickle for
            ``transport="process"``).
        policy: a TensorDict module with ``in_keys`` (the server and ``"local"`` workers
            deep-copy it).
        num_workers: env workers.
        frames_per_batch: frames per batch over all workers (split evenly; a worker takes
            ``ceil(frames / num_workers / env_batch_numel)`` steps).
        total_frames: stop iterating after this many frames (``-1``: never).
        transport: ``"thread"``, ``"process"`` (worker processes, shared memory), ``"ray"``
            (Ray actors, :mod:`.inference_ray`; Ray is started with ``ray_init_config`` if it
            is not running) or ``"local"`` (process workers with their own policy copy, no
            server).
        max_batch: most rows per forward (``None``: all waiting requests).
        max_wait_s: longest wait for more requests after the first one; the server also
            stops waiting as soon as every collecting worker has asked.
        exploration_type: interaction type of the policy forward.
        seed: worker ``i``'s env gets ``seed + 1000 * i`` (as :class:`MultiSyncCollector`;
            ``None`` draws one from torch's default generator here, used by the workers whose env its
            maker left unseeded).
        timeout: seconds to wait for a worker's batch before :class:`WorkerError`.
        spin_s: ``"thread"`` / ``"process"``: seconds the server and each worker poll for
            an answer (yielding the CPU) before they block (:mod:`.inference_slab`); ``0``
            blocks at once; ``None``: 1 ms for processes, 0 for threads (they share one
            GIL: a spinning thread takes it from the one with work).
        shutdown_timeout: seconds a worker gets to exit before it is terminated.
        start_method: ``"process"`` / ``"local"``: ``"fork"`` (default on Linux while CUDA is
            not initialised, as :class:`MultiSyncCollector`: workers start in a fraction of a
            second) or ``"spawn"`` (a fresh interpreter per worker: seconds each).
        ray_options: ``ray.remote`` options of each env actor (default ``{"num_cpus": 1}``).
        ray_init_config: arguments of ``ray.init`` when Ray is not initialised yet.
    """

    def __init__(
        self,
        create_env_fn: Callable[[], EnvBase],
        policy,
        *,
        num_workers: int = 2,
        frames_per_batch: int,
        total_frames: int = -1,
        transport: str = "thread",
        max_batch: int | None = None,
        max_wait_s: float = 0.002,
        exploration_type: InteractionType | str = InteractionType.RANDOM,
        seed: int | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        spin_s: float | None = None,
        shutdown_timeout: float = 5.0,
        start_method: str | None = None,
        ray_options: dict | None = None,
        ray_init_config: dict | None = None,
    ) -> None:
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {TRANSPORTS}, got {transport!r}.")
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"num_workers must be an int >= 1, got {num_workers!r}.")
        if not (isinstance(frames_per_batch, int) and frames_per_batch >= 1):
            raise ValueError(f"frames_per_batch must be an int >= 1, got {frames_per_batch!r}.")
        if timeout is None or not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}.")
        if spin_s is None:
            spin_s = DEFAULT_SPIN_S.get(transport, 0.0)
        if isinstance(spin_s, bool) or not isinstance(spin_s, (int, float)) or not spin_s >= 0:
            raise ValueError(f"spin_s must be a number of seconds >= 0 or None, got {spin_s!r}.")
        if isinstance(create_env_fn, EnvBase):
            raise TypeError("InferenceCollector needs a callable that builds the env in each "
                            "worker, not an env instance.")
        if start_method is not None and start_method not in mp.get_all_start_methods():
            raise ValueError(f"start_method must be one of {mp.get_all_start_methods()} or None, "
                             f"got {start_method!r}.")
        self._start_method = start_method or default_start_method()
        exploration = as_interaction_type(exploration_type)
        self.server = InferenceServer(policy, max_batch=max_batch, max_wait_s=max_wait_s,
                                      exploration_type=exploration)
        self.transport, self.num_workers = transport, num_workers
        self.timeout, self.total_frames, self.frames = float(timeout), int(total_frames), 0
        self._policy = policy
        self._closed = False
        frames = -(-frames_per_batch // num_workers)
        in_keys = self.server.in_keys
        self._procs, self._conns, self._threads = [], [], []
        self._ray_hint = ""  # the timeout message's hint about Ray scheduling
        # worker i: (its seed, the default for an env its maker left unseeded); no seed: one draw
        # here, not one per worker (forked or spawned workers share a generator state)
        base = seed_from_torch(1000 * num_workers) if seed is None else None
        seeds = [(seed + 1000 * i, None) if seed is not None else (None, base + 1000 * i) for i in range(num_workers)]
        if transport == "ray":
            from .ray_collector import require_ray, warn_unschedulable

            ray = require_ray()
            if not ray.is_initialized():
                ray.init(**(ray_init_config or {}))
            options = dict(ray_options or {"num_cpus": 1})
            have = warn_unschedulable(ray, _log, "InferenceCollector", num_workers, options, timeout,
                                      " Pass ray_options={'num_cpus': ...} with a share of a CPU "
                                      "per actor to pack them.", noun="Ray actors")
            self._ray_hint = (f" An actor that never answers is often one Ray could not schedule: "
                              f"{num_workers} actors asking {options} each, the cluster has "
                              f"{have} CPUs.")
            actor_cls = ray.remote(**options)(RayEnvWorker)
            actors = [actor_cls.remote(i, num_workers, create_env_fn, in_keys, seeds[i], frames,
                                       exploration) for i in range(num_workers)]  # (seed, default) pairs
            self.hub = RayHub(self.server, actors, ray)
            self.hub.start()
        else:
            self.hub = self._start_workers(create_env_fn, policy if transport == "local" else None,
                                           in_keys, seeds, frames, exploration, spin_s)
        self._finalizer = weakref.finalize(self, _shutdown, self.hub, self._procs, self._conns,
                                           self._threads, shutdown_timeout)
        if transport != "ray":
            self._handshake(local=transport == "local")
        self._bufs: list[TensorDictBase | None] = [None] * num_workers
        self.frames_per_batch = frames * num_workers

    def _start_workers(self, make_env, local_policy, in_keys, seeds, frames, exploration,
                       spin_s) -> SlabHub:
        """Threads or processes (forked or spawned), each with a control channel and two wake-up pipes."""
        n, threads = self.num_workers, self.transport == "thread"
        ctx = mp.get_context(self._start_method)
        fork = ctx.get_start_method() == "fork"
        token = parent_token()
        outbox = queue.Queue() if threads else None
        requests, replies = [], []  # the trainer's ends
        for i in range(n):
            req_r, req_w = (ctx.Pipe(duplex=False) if local_policy is None else (None, None))
            rep_r, rep_w = (ctx.Pipe(duplex=False) if local_policy is None else (None, None))
            requests.append(req_r)
            replies.append(rep_w)
            args = (make_env, local_policy, in_keys, seeds[i], frames, exploration, self.timeout,
                    spin_s, n, not threads)
            if threads:
                conn = QueueConn(i, outbox)
                t = threading.Thread(target=carry_num_threads(_worker), name=f"tdrl-env-worker-{i}",
                                     args=(i, conn, req_w, rep_r, *args), daemon=True)
                t.start()
                self._threads.append(t)
                self._conns.append(conn)
                continue
            parent, child = ctx.Pipe()
            inherited = None
            if fork:  # the child closes the trainer's ends it inherited (EOF stays a death)
                inherited = [e for e in (parent, *self._conns, *requests, *replies) if e is not None]
            p = ctx.Process(target=_process_worker, name=f"tdrl-env-worker-{i}", daemon=False,
                            args=(i, child, req_w, rep_r, dumps(args), token, inherited))
            p.start()
            for end in (child, req_w, rep_r):
                if end is not None:
                    end.close()
            self._procs.append(p)
            self._conns.append(parent)
        return SlabHub(self.server, self._conns, [r for r in requests if r is not None],
                       [w for w in replies if w is not None], procs=self._procs or None,
                       outbox=outbox, spin_s=spin_s)

    def _handshake(self, local: bool) -> None:
        """Wait for every worker's first root, then lay out the slabs and start the server."""
        hello: dict[int, tuple] = {}
        deadline = time.monotonic() + self.timeout
        while len(hello) < self.num_workers:
            for i, kind, payload in self.hub.events(0.1):
                if kind == "hello":
                    hello[i] = payload
                else:
                    self._report(i, kind, payload)
            if time.monotonic() > deadline:
                missing = sorted(set(range(self.num_workers)) - set(hello))
                self._fail(f"InferenceCollector: worker(s) {missing} did not build their env "
                           f"within timeout={self.timeout} s.", hung=missing)
        if local:
            return
        try:
            layout = SlabLayout([hello[i][0] for i in range(self.num_workers)], self.server,
                                share=self.transport == "process")
        except (ValueError, TypeError, RuntimeError) as err:
            self.shutdown()
            raise type(err)(f"InferenceCollector: {err}") from err
        for i in range(self.num_workers):
            self.hub.command(i, "slabs", layout)
        self.hub.start(layout, [hello[i][1] for i in range(self.num_workers)])

    def _report(self, i: int, kind: str, payload) -> None:
        """Raise :class:`WorkerError` for an ``error`` / ``dead`` / ``server_error`` event."""
        if kind == "error":
            cause = self.hub.server_error()
            if cause is not None:  # the worker only saw "the inference server stopped"
                self._fail(f"InferenceCollector: the inference server raised (the policy's forward):\n{cause}")
            self._fail(f"InferenceCollector worker {i} raised:\n{payload}")
        elif kind == "dead":
            if self._procs:
                self._fail(f"InferenceCollector worker {i} (pid {self._procs[i].pid}) died "
                           f"(exit code {payload}).")
            self._fail(f"InferenceCollector worker {i} (a Ray actor) died: {payload}")
        elif kind == "server_error":
            self._fail(f"InferenceCollector: the inference server raised:\n{payload}")

    @property
    def policy_version(self) -> int:
        """The served weights' version (``update_policy_weights_`` increments it)."""
        return self.server.version

    def update_policy_weights_(self, weights=None) -> int:
        """Copy new weights (default: the policy given at construction) into the server.

        Returns:
            The new version; every action chosen after this call uses these weights.
        """
        if self.transport == "local":
            raise TypeError("transport='local' runs fixed policy copies in the workers (the "
                            "benchmark baseline); use 'thread', 'process' or 'ray' for live weights.")
        return self.server.update_weights(self._policy if weights is None else weights)

    def _fail(self, msg: str, hung=()):
        """Shut down and raise. The ``hung`` workers would not answer a ``close``: processes
        are killed first and threads (which cannot be killed) are not joined, so the error
        comes at the timeout, not ``shutdown_timeout`` later per worker. A hung thread is
        left behind as a daemon until its env returns."""
        if isinstance(self.hub, RayHub):
            self.hub.kill(hung)
        elif self._procs:
            kill_hung([self._procs[i] for i in hung])
        elif self._threads:
            stuck = [self._threads[i] for i in hung]
            self._threads[:] = [t for t in self._threads if t not in stuck]
        self.shutdown()
        raise WorkerError(msg)

    def next_batch(self) -> TensorDictBase:
        """One batch from every worker, stacked ``(num_workers, *env_batch, T)`` (a copy)."""
        if self._closed:
            raise RuntimeError("This collector was shut down.")
        n, hub = self.num_workers, self.hub
        hub.begin_round()
        for i in range(n):
            hub.command(i, "collect")
        waiting = set(range(n))
        deadline = time.monotonic() + self.timeout
        while waiting:
            events = hub.events(0.1)
            if not events:
                if not hub.alive:
                    cause = hub.server_error()
                    self._fail("InferenceCollector: the inference server thread stopped"
                               + (f"; it raised:\n{cause}" if cause else "."))
                if time.monotonic() > deadline:
                    self._fail(f"InferenceCollector: no batch within timeout={self.timeout} s from "
                               f"worker(s) {sorted(waiting)}"
                               + (f" (pids {[self._procs[j].pid for j in sorted(waiting)]})"
                                  if self._procs else "")
                               + "; the env may hang." + self._ray_hint, hung=sorted(waiting))
            for i, kind, payload in events:
                if kind == "ready":
                    if payload is not None:
                        self._bufs[i] = payload
                    waiting.discard(i)
                else:
                    self._report(i, kind, payload)
        hub.end_round()
        self.frames += self.frames_per_batch
        return torch.stack(self._bufs, 0)

    def __iter__(self) -> Iterator[TensorDictBase]:
        while self.total_frames < 0 or self.frames < self.total_frames:
            yield self.next_batch()

    @property
    def workers(self) -> list:
        """The worker processes (``"process"`` / ``"local"``), threads (``"thread"``) or Ray
        actor handles (``"ray"``)."""
        if isinstance(self.hub, RayHub):
            return list(self.hub.actors)
        return list(self._procs or self._threads)
