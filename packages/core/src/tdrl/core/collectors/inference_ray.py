"""The Ray transport of the inference server: env workers are Ray actors.

The server stays a thread of the trainer process (weights never leave it); each env worker
is a Ray actor that owns its env and steps it one policy answer at a time. The hub drives
the actors: ``begin`` starts a rollout and returns the first policy inputs, ``act(out,
version)`` applies the server's answer, steps the env and returns the next inputs, or the
finished batch after the worker's last step. The in-flight calls are Ray object refs; the
server thread waits on them (``ray.wait``), batches the inputs that arrived and answers each
worker with a new ``act`` call, so a forward serves every actor whose step is done.

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

from ..threads import carry_num_threads
from .inference_server import InferenceServer

__all__ = ["RayEnvWorker", "_RayHub"]

VERSION_KEY = ("collector", "policy_version")
_POLL_S = 0.05


class _Rollouts:
    """One actor's env, its current root and the rollout, one policy answer at a time."""

    def __init__(self, make_env: Callable, in_keys: list, seed: int | None, frames: int) -> None:
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


class RayEnvWorker:
    """The body of one Ray env worker (wrapped by ``ray.remote`` in the collector)."""

    def __init__(self, make_env: Callable, in_keys: list, seed: int | None, frames: int) -> None:
        torch.set_num_threads(1)
        self.work = _Rollouts(make_env, in_keys, seed, frames)

    def begin(self) -> tuple[str, TensorDictBase]:
        return "infer", self.work.begin()

    def act(self, out: TensorDictBase, version: int) -> tuple[str, TensorDictBase]:
        nxt = self.work.act(out, version)
        return ("infer", nxt) if nxt is not None else ("ready", self.work.batch())

    def close(self) -> None:
        self.work.env.close()


class _RayHub:
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

    def close(self, timeout: float) -> None:
        """Close the envs (bounded wait), then kill the actors."""
        ray = self._ray
        try:
            ray.wait([a.close.remote() for a in self.actors], num_returns=len(self.actors),
                     timeout=timeout)
        except Exception:  # noqa: BLE001 - the actors are killed below anyway
            pass
        for actor in self.actors:
            ray.kill(actor)
