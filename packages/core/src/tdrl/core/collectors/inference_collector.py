""":class:`InferenceCollector`: env workers that share one auto-batching policy server.

Each worker owns its env and steps it; the policy runs only in the
:class:`~tdrl.core.collectors.inference_server.InferenceServer` (a thread of the trainer
process), which answers the workers' requests in batches. The trainer's loop is the same for
every transport::

    col = InferenceCollector(make_env, policy, num_workers=8, frames_per_batch=1024,
                             transport="process")    # or "thread", "ray"
    for batch in col:                                        # (num_workers, *env_batch, T)
        ...train...
        col.update_policy_weights_()                        # live: the version goes up

Batches carry the usual keys plus ``("collector", "policy_version")``: the weights' version
that chose each step's action. With a policy whose output for a row depends only on that row
(a deterministic policy, or ``exploration_type="mode"``) the data under a fixed seed are the
same for every transport and batching (tested). ``transport="local"`` runs the same process
workers each with its own copy of the policy and no server: the baseline of the benchmark
(its weights are fixed).

Faults: a worker that raises sends its traceback, a dead process is seen through its
sentinel, a server that raises reports its traceback; each surfaces as
:class:`~tdrl.core.envs.WorkerError` after every worker was stopped, and a silent worker
fails after ``timeout`` seconds naming it. Process workers exit with the trainer (even
``kill -9``), as in :mod:`.multi`.
"""

from __future__ import annotations

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
from tensordict.nn import InteractionType, set_interaction_type

from ..envs import EnvBase, WorkerError
from ..envs.parallel import DEFAULT_TIMEOUT_S, _exit_with_parent, _parent_token
from .inference_ray import RayEnvWorker, _RayHub
from .inference_server import InferenceServer, _Hub, _ProcessHub, _ThreadHub
from .multi import _WorkerLifecycle, _dumps, _stop_workers
from ..threads import carry_num_threads
from .single import as_interaction_type

__all__ = ["InferenceCollector"]

VERSION_KEY = ("collector", "policy_version")
TRANSPORTS = ("thread", "process", "ray", "local")


# ---------------------------------------------------------------------- worker side
class _Rollouts:
    """One worker's env, its current root and the rollout loop (the same for every link)."""

    def __init__(self, make_env: Callable[[], EnvBase], in_keys: list, seed: int | None,
                 frames: int) -> None:
        self.env = make_env()
        if seed is not None:
            self.env.set_seed(seed)
        self.in_keys = in_keys
        self.steps = -(-frames // max(1, self.env.batch_size.numel()))
        self.root = self.env.reset()

    def begin(self) -> TensorDictBase:
        """Start a rollout: the policy inputs of its first step."""
        self._steps, self._versions = [], []
        return self.root.select(*self.in_keys)

    def act(self, out: TensorDictBase, version: int) -> TensorDictBase | None:
        """Apply the policy's answer and step: the next step's inputs, or None at the end."""
        self.root.update(out)
        td, self.root = self.env.step_and_maybe_reset(self.root)
        self._steps.append(td)
        self._versions.append(version)
        return self.root.select(*self.in_keys) if len(self._steps) < self.steps else None

    def batch(self) -> TensorDictBase:
        """The finished rollout ``(*env_batch, T)`` with each step's weights version."""
        env = self.env
        batch = torch.stack(self._steps, len(env.batch_size))
        ver = torch.tensor(self._versions, dtype=torch.int64)
        batch.set(VERSION_KEY, ver.expand(*env.batch_size, len(self._versions)).clone())
        return batch

    def collect(self, infer: Callable[[TensorDictBase], tuple[TensorDictBase, int]]) -> TensorDictBase:
        """One rollout, asking ``infer(inputs) -> (outputs, version)`` at every step."""
        inputs = self.begin()
        while inputs is not None:
            inputs = self.act(*infer(inputs))
        return self.batch()


def _thread_worker(i: int, hub: _ThreadHub, make_env, in_keys, seed, frames, timeout) -> None:
    def infer(td):
        hub.inbox.put((i, "infer", td))
        try:
            out = hub.replies[i].get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"worker {i}: no answer from the inference server within "
                               f"{timeout} s") from None
        if out is None:
            raise RuntimeError("the inference server stopped")
        return out

    try:
        work = _Rollouts(make_env, in_keys, seed, frames)
        while True:
            cmd, _ = hub.commands[i].get()
            if cmd == "collect":
                hub.inbox.put((i, "ready", work.collect(infer)))
            elif cmd == "close":
                work.env.close()
                return
    except BaseException:  # noqa: BLE001 - everything goes back to the trainer
        hub.inbox.put((i, "error", traceback.format_exc()))


def _process_worker(i: int, conn, payload: bytes, token) -> None:
    """Body of a process worker: build the env, then serve commands until ``close``."""
    _exit_with_parent(token)
    torch.set_num_threads(1)
    try:
        make_env, policy, in_keys, seed, frames, exploration, timeout = pickle.loads(payload)
        work = _Rollouts(make_env, in_keys, seed, frames)
    except BaseException:  # noqa: BLE001
        conn.send(("error", traceback.format_exc()))
        return
    bufs = {"in": None, "out": None, "batch": None}

    def infer_remote(td):
        if bufs["in"] is None:
            bufs["in"] = td.clone().share_memory_()
            conn.send(("infer", bufs["in"]))
        else:
            bufs["in"].update_(td)
            conn.send(("infer", None))
        if not conn.poll(timeout):
            raise TimeoutError(f"worker {i}: no answer from the inference server within {timeout} s")
        kind, (buf, version) = conn.recv()
        if buf is not None:
            bufs["out"] = buf
        return bufs["out"].clone(), version

    def infer_local(td):
        with torch.no_grad(), set_interaction_type(exploration):
            out = policy(td.clone(False))
        return out.exclude(*td.keys()), 0

    infer = infer_remote if policy is None else infer_local
    while True:
        try:
            cmd, _ = conn.recv()
        except (EOFError, OSError, KeyboardInterrupt):
            return  # the trainer is gone
        try:
            if cmd == "collect":
                batch = work.collect(infer)
                if bufs["batch"] is None:
                    bufs["batch"] = batch.share_memory_()
                    conn.send(("ready", bufs["batch"]))
                else:
                    bufs["batch"].update_(batch)
                    conn.send(("ready", None))
            elif cmd == "close":
                work.env.close()
                conn.send(("closed", None))
                return
        except BaseException:  # noqa: BLE001
            conn.send(("error", traceback.format_exc()))


# ---------------------------------------------------------------------- trainer side
def _shutdown(hub: _Hub, procs: list, conns: list, threads: list, timeout: float) -> None:
    if isinstance(hub, _RayHub):
        hub.stop()
        hub.close(timeout)
        return
    if procs:
        _stop_workers(procs, conns, timeout)
    if isinstance(hub, _ThreadHub):
        for i in range(hub.n):
            hub.command(i, "close")
            hub.replies[i].put(None)  # unblocks a worker waiting for an answer
        for t in threads:
            t.join(timeout)
    hub.stop()


class InferenceCollector(_WorkerLifecycle):
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
        transport: ``"thread"``, ``"process"`` (spawned workers, shared memory), ``"ray"``
            (Ray actors, :mod:`.inference_ray`; Ray is started with ``ray_init_config`` if it
            is not running) or ``"local"`` (process workers with their own policy copy, no
            server).
        max_batch: most rows per forward (``None``: all waiting requests).
        max_wait_s: longest wait for more requests after the first one; the server also
            stops waiting as soon as every collecting worker has asked.
        exploration_type: interaction type of the policy forward.
        seed: worker ``i``'s env gets ``seed + 1000 * i`` (as :class:`MultiSyncCollector`).
        timeout: seconds to wait for a worker's batch before :class:`WorkerError`.
        shutdown_timeout: seconds a worker gets to exit before it is terminated.
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
        shutdown_timeout: float = 5.0,
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
        if isinstance(create_env_fn, EnvBase):
            raise TypeError("InferenceCollector needs a callable that builds the env in each "
                            "worker, not an env instance.")
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
        seeds = [None if seed is None else seed + 1000 * i for i in range(num_workers)]
        if transport == "thread":
            self.hub: _Hub = _ThreadHub(self.server, num_workers)
            self.hub.start()
            for i in range(num_workers):
                t = threading.Thread(target=carry_num_threads(_thread_worker), name=f"tdrl-env-worker-{i}", daemon=True,
                                     args=(i, self.hub, create_env_fn, in_keys, seeds[i], frames,
                                           self.timeout))
                t.start()
                self._threads.append(t)
        elif transport == "ray":
            from .ray_collector import _require_ray

            ray = _require_ray()
            if not ray.is_initialized():
                ray.init(**(ray_init_config or {}))
            actor_cls = ray.remote(**(ray_options or {"num_cpus": 1}))(RayEnvWorker)
            actors = [actor_cls.remote(create_env_fn, in_keys, seeds[i], frames)
                      for i in range(num_workers)]
            self.hub = _RayHub(self.server, actors, ray)
            self.hub.start()
        else:
            ctx, token = mp.get_context("spawn"), _parent_token()
            local = policy if transport == "local" else None
            for i in range(num_workers):
                payload = _dumps((create_env_fn, local, in_keys, seeds[i], frames, exploration,
                                  self.timeout))
                parent, child = ctx.Pipe()
                p = ctx.Process(target=_process_worker, args=(i, child, payload, token),
                                name=f"tdrl-env-worker-{i}", daemon=False)
                p.start()
                child.close()
                self._procs.append(p)
                self._conns.append(parent)
            self.hub = _ProcessHub(self.server, self._conns, self._procs)
            self.hub.start()
        self._finalizer = weakref.finalize(self, _shutdown, self.hub, self._procs, self._conns,
                                           self._threads, shutdown_timeout)
        self._bufs: list[TensorDictBase | None] = [None] * num_workers
        self.frames_per_batch = frames * num_workers

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

    def _fail(self, msg: str):
        self.shutdown()
        raise WorkerError(msg)

    def next_batch(self) -> TensorDictBase:
        """One batch from every worker, stacked ``(num_workers, *env_batch, T)`` (a copy)."""
        if self._closed:
            raise RuntimeError("This collector was shut down.")
        n, hub = self.num_workers, self.hub
        hub.active = n
        for i in range(n):
            hub.command(i, "collect")
        waiting = set(range(n))
        deadline = time.monotonic() + self.timeout
        while waiting:
            try:
                i, kind, payload = hub.outbox.get(timeout=0.1)
            except queue.Empty:
                if not hub.alive:
                    self._fail("InferenceCollector: the inference server thread stopped.")
                if time.monotonic() > deadline:
                    self._fail(f"InferenceCollector: no batch within timeout={self.timeout} s from "
                               f"worker(s) {sorted(waiting)}"
                               + (f" (pids {[self._procs[j].pid for j in sorted(waiting)]})"
                                  if self._procs else "")
                               + "; the env may hang.")
                continue
            if kind == "ready":
                if payload is not None:
                    self._bufs[i] = payload
                waiting.discard(i)
            elif kind == "error":
                self._fail(f"InferenceCollector worker {i} raised:\n{payload}")
            elif kind == "dead":
                if self._procs:
                    self._fail(f"InferenceCollector worker {i} (pid {self._procs[i].pid}) died "
                               f"(exit code {payload}).")
                self._fail(f"InferenceCollector worker {i} (a Ray actor) died: {payload}")
            elif kind == "server_error":
                self._fail(f"InferenceCollector: the inference server raised:\n{payload}")
        hub.active = 0
        self.frames += self.frames_per_batch
        return torch.stack(self._bufs, 0)

    def __iter__(self) -> Iterator[TensorDictBase]:
        while self.total_frames < 0 or self.frames < self.total_frames:
            yield self.next_batch()

    @property
    def workers(self) -> list:
        """The worker processes (``"process"`` / ``"local"``), threads (``"thread"``) or Ray
        actor handles (``"ray"``)."""
        if isinstance(self.hub, _RayHub):
            return list(self.hub.actors)
        return list(self._procs or self._threads)
