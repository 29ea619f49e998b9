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

import threading
import time
from collections.abc import Callable

import torch
from tensordict import TensorDictBase

from .inference_server import InferenceServer, _Hub

__all__ = ["RayEnvWorker", "_RayHub"]


class RayEnvWorker:
    """The body of one Ray env worker (wrapped by ``ray.remote`` in the collector)."""

    def __init__(self, make_env: Callable, in_keys: list, seed: int | None, frames: int) -> None:
        from .inference_collector import _Rollouts

        torch.set_num_threads(1)
        self.work = _Rollouts(make_env, in_keys, seed, frames)

    def begin(self) -> tuple[str, TensorDictBase]:
        return "infer", self.work.begin()

    def act(self, out: TensorDictBase, version: int) -> tuple[str, TensorDictBase]:
        nxt = self.work.act(out, version)
        return ("infer", nxt) if nxt is not None else ("ready", self.work.batch())

    def close(self) -> None:
        self.work.env.close()


class _RayHub(_Hub):
    """In-flight actor calls (object ref -> worker) in place of pipes or queues."""

    def __init__(self, server: InferenceServer, actors: list, ray) -> None:
        super().__init__(server, len(actors))
        self.actors, self._ray = actors, ray
        self._pending: dict = {}
        self._lock = threading.Lock()

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

    def _inputs(self, i: int, payload) -> TensorDictBase:
        return payload

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
