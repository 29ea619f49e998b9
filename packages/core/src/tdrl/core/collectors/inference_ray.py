"""The Ray transport of the inference server: env workers are Ray actors.

The server stays a thread of the trainer process (weights never leave it); each env worker
is a Ray actor that runs the same :class:`~tdrl.core.collectors.Collector` as a thread or
process worker (trajectory ids, dict loop, versions: the same batches), in a thread of the
actor, with a :class:`_RelayPolicy` as its policy. The hub drives the actors: ``begin``
starts a rollout and returns the first policy inputs, ``act(out, version)`` hands the
server's answer to the rollout and returns the next inputs, or the finished batch after the
worker's last step. The in-flight calls are Ray object refs; the server thread waits on them
(``ray.wait``), batches the inputs that arrived and answers each worker with a new ``act``
call, so a forward serves every actor whose step is done: one actor call per step and
worker, the price of a transport that crosses machines.

A raising env comes back as the actor's task error (with its remote traceback), a dead actor
as ``RayActorError``: both reach the trainer as :class:`~tdrl.core.envs.WorkerError`.
"""

from __future__ import annotations

import queue
import threading
import time
import traceback
from collections.abc import Callable

import torch
from tensordict import TensorDictBase
from tensordict.nn import InteractionType, TensorDictModuleBase

from ..threads import carry_num_threads
from .inference_server import InferenceServer, versioned, worker_collector

__all__ = ["RayEnvWorker", "RayHub"]

_POLL_S = 0.05


class _Stopped(Exception):
    """The actor was closed while its rollout waited for an answer."""


class _RelayPolicy(TensorDictModuleBase):
    """A Ray actor's stand-in for the policy: each forward posts the step's inputs to the
    actor's current method call and waits for the server's answer it brings back."""

    def __init__(self, in_keys: list) -> None:
        super().__init__()
        self.in_keys, self.out_keys = list(in_keys), []
        self.posts: queue.Queue = queue.Queue()  # rollout -> method: (kind, payload)
        self.answers: queue.Queue = queue.Queue()  # method -> rollout: (out, version) or None
        self.versions: list[int] = []

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        self.posts.put(("infer", td.select(*self.in_keys)))
        answer = self.answers.get()
        if answer is None:
            raise _Stopped
        out, version = answer
        self.versions.append(version)
        return td.update(out)


class RayEnvWorker:
    """The body of one Ray env worker (wrapped by ``ray.remote`` in the collector); ``seed`` is the
    pair (its seed, the default for an env its maker left unseeded), one of them None."""

    def __init__(self, index: int, n_workers: int, make_env: Callable, in_keys: list,
                 seed: tuple, frames: int, exploration: InteractionType) -> None:
        torch.set_num_threads(1)
        self.relay = _RelayPolicy(in_keys)
        self.collector = worker_collector(make_env, self.relay, in_keys, frames, exploration,
                                          seed[0], index, n_workers, local=False, default_seed=seed[1])
        self._rollout: threading.Thread | None = None

    def _run(self) -> None:
        try:
            self.relay.versions.clear()
            batch = self.collector.rollout()
            env_batch = self.collector.env.batch_size
            self.relay.posts.put(("ready", versioned(batch, list(self.relay.versions), env_batch)))
        except _Stopped:
            pass
        except BaseException:  # noqa: BLE001 - raised by the method call that waits for it
            self.relay.posts.put(("error", traceback.format_exc()))

    def _next(self) -> tuple[str, TensorDictBase]:
        kind, payload = self.relay.posts.get()
        if kind == "error":
            raise RuntimeError(f"the env worker's rollout raised:\n{payload}")
        return kind, payload

    def begin(self) -> tuple[str, TensorDictBase]:
        """Start a rollout; its first policy inputs (or its batch, if it needs none)."""
        self._rollout = threading.Thread(target=self._run, name="tdrl-ray-rollout", daemon=True)
        self._rollout.start()
        return self._next()

    def act(self, out: TensorDictBase, version: int) -> tuple[str, TensorDictBase]:
        """The server's answer to the last inputs; the next inputs, or the finished batch."""
        self.relay.answers.put((out, version))
        return self._next()

    def close(self) -> None:
        self.relay.answers.put(None)  # a rollout waiting for an answer stops
        if self._rollout is not None:
            self._rollout.join(5.0)
        self.collector.shutdown()


class RayHub:
    """The server thread and the in-flight actor calls (object ref -> worker).

    Actors answer ``("infer", inputs)`` (to the server) or ``("ready", batch)``; those and
    ``"error"`` / ``"dead"`` / ``"server_error"`` reach the trainer through :meth:`events`.
    """

    def __init__(self, server: InferenceServer, actors: list, ray) -> None:
        self.server, self.n = server, len(actors)
        self.actors, self._ray = actors, ray
        self._pending: dict = {}
        self._lock = threading.Lock()
        self.outbox: queue.Queue = queue.Queue()
        self.active = 0  # actors collecting now (the server stops waiting when all asked)
        self._stop = threading.Event()
        self._killed: set[int] = set()  # hung actors killed before close (no close to wait for)
        self._thread = threading.Thread(target=carry_num_threads(self._serve),
                                        name="tdrl-inference-server", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(2.0)

    def begin_round(self) -> None:
        self.active = self.n

    def end_round(self) -> None:
        self.active = 0

    def server_error(self) -> str | None:
        """``None``: a Ray server's traceback comes through :meth:`events` in order (the
        actors are not told that the server stopped)."""
        return None

    def events(self, timeout: float) -> list:
        try:
            return [self.outbox.get(timeout=timeout)]
        except queue.Empty:
            return []

    def _serve(self) -> None:
        server = self.server
        try:
            while not self._stop.is_set():
                pending = self._sort(self._receive(_POLL_S))
                if not pending:
                    continue
                rows = sum(td.numel() for _, td in pending)
                deadline = time.monotonic() + server.max_wait_s
                while (len(pending) < self.active
                       and (server.max_batch is None or rows < server.max_batch)):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    more = self._sort(self._receive(left))
                    pending += more
                    rows += sum(td.numel() for _, td in more)
                outs, version = server.forward([td for _, td in pending])
                for (i, _), out in zip(pending, outs, strict=True):
                    self._reply(i, out, version)
        except BaseException:  # noqa: BLE001 - reported to the trainer
            self.outbox.put((-1, "server_error", traceback.format_exc()))

    def _sort(self, msgs) -> list[tuple[int, TensorDictBase]]:
        pending = []
        for i, kind, payload in msgs:
            if kind == "infer":
                pending.append((i, payload))
            else:
                self.outbox.put((i, kind, payload))
        return pending

    def _submit(self, i: int, ref) -> None:
        with self._lock:
            self._pending[ref] = i

    def _receive(self, timeout: float) -> list:
        ray = self._ray
        with self._lock:
            refs = list(self._pending)
        if not refs:
            time.sleep(min(timeout, 0.005))
            return []
        ready, _ = ray.wait(refs, num_returns=1, timeout=timeout)
        if not ready:
            return []
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)  # every call already done
        msgs = []
        for ref in ready:
            with self._lock:
                i = self._pending.pop(ref)
            try:
                kind, payload = ray.get(ref)
            except ray.exceptions.RayActorError as err:
                msgs.append((i, "dead", str(err).splitlines()[0] if str(err) else "actor died"))
            except ray.exceptions.RayTaskError as err:
                msgs.append((i, "error", str(err)))
            else:
                msgs.append((i, kind, payload))
        return msgs

    def _reply(self, i: int, out: TensorDictBase, version: int) -> None:
        self._submit(i, self.actors[i].act.remote(out, version))

    def command(self, i: int, cmd: str, arg=None) -> None:
        if cmd == "collect":
            self._submit(i, self.actors[i].begin.remote())

    def kill(self, indices) -> None:
        """Kill hung actors now: they would not answer ``close`` (its wait is skipped)."""
        for i in indices:
            self._ray.kill(self.actors[i])
            self._killed.add(i)

    def close(self, timeout: float) -> None:
        """Close the envs (bounded wait), then kill the actors."""
        ray = self._ray
        live = [a for i, a in enumerate(self.actors) if i not in self._killed]
        try:
            ray.wait([a.close.remote() for a in live], num_returns=len(live), timeout=timeout)
        except Exception:  # noqa: BLE001 - the actors are killed below anyway
            pass
        for actor in self.actors:
            ray.kill(actor)
