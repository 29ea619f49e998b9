"""An auto-batching inference server: many env workers, one policy forward per batch.

Env workers send the policy inputs of their current step (``policy.in_keys`` of the root);
the server gathers requests until it holds ``max_batch`` rows, or every collecting worker
has asked, or ``max_wait_s`` passed since the first one, runs the policy once on the
concatenated rows (``torch.no_grad``, the collector's interaction type) and sends each
worker its rows of the output with the weights' version. ``update_weights`` copies new
weights into the served policy between two forwards and increments the version.

Transports (one interface, :class:`_Hub`): ``"thread"`` (workers are threads of this
process, messages through ``queue.Queue``) and ``"process"`` (workers are spawned
processes; inputs, outputs and batches live in shared-memory TensorDicts, the pipes carry
only small messages; the server thread waits on the pipes and the process sentinels, so a
dead worker is reported at once). In both the server is a thread of the trainer process,
so weights never leave it. :mod:`.inference_collector` builds the collector on top.
"""

from __future__ import annotations

import copy
import queue
import threading
import time
import traceback
from multiprocessing.connection import wait as mp_wait

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import InteractionType, set_interaction_type

from ..threads import carry_num_threads

__all__ = ["InferenceServer"]

_POLL_S = 0.05


class InferenceServer:
    """The batching core: a private copy of the policy, its weights' version, one forward.

    Args:
        policy: a ``TensorDictModuleBase`` (its ``in_keys`` are what workers send); the
            server deep-copies it, so training the original never races a forward.
        max_batch: most rows in one forward (``None``: no limit).
        max_wait_s: longest wait, after the first request, for more requests.
        exploration_type: interaction type of the forward.
    """

    def __init__(self, policy, *, max_batch: int | None = None, max_wait_s: float = 0.002,
                 exploration_type: InteractionType = InteractionType.RANDOM) -> None:
        if max_batch is not None and (isinstance(max_batch, bool) or not isinstance(max_batch, int)
                                      or max_batch < 1):
            raise ValueError(f"max_batch must be an int >= 1 or None, got {max_batch!r}.")
        if not max_wait_s >= 0:
            raise ValueError(f"max_wait_s must be >= 0 seconds, got {max_wait_s!r}.")
        in_keys = getattr(policy, "in_keys", None)
        if not in_keys:
            raise TypeError("The inference server needs a TensorDict module with in_keys "
                            f"(e.g. a TensorDictModule), got {type(policy).__name__}.")
        self.in_keys = list(in_keys)
        self.policy = copy.deepcopy(policy)
        self._params = (TensorDict.from_module(self.policy).data
                        if isinstance(self.policy, torch.nn.Module) else None)
        self.max_batch = max_batch
        self.max_wait_s = float(max_wait_s)
        self.exploration_type = exploration_type
        self.version = 0
        self.forwards = 0  # number of batched forwards (diagnostics)
        self.rows = 0  # rows served
        self._lock = threading.Lock()

    def update_weights(self, weights) -> int:
        """Copy ``weights`` (a module or a TensorDict of parameters) into the served policy.

        Returns:
            The new version (forwards after this call use these weights).
        """
        if self._params is None:
            raise TypeError("update_weights needs a torch.nn.Module policy.")
        if isinstance(weights, torch.nn.Module):
            weights = TensorDict.from_module(weights)
        with self._lock:
            self._params.update_(weights.data if hasattr(weights, "data") else weights)
            self.version += 1
            return self.version

    def forward(self, inputs: list[TensorDictBase]) -> tuple[list[TensorDictBase], int]:
        """One policy call on the rows of every request.

        Args:
            inputs: one TensorDict per request (any batch size; rows are its flattened batch).

        Returns:
            ``(outputs, version)``: per request, the entries the policy wrote (same batch size
            as its input), and the weights' version the forward used.
        """
        flat = [td.reshape(-1) if td.batch_dims != 1 else td for td in inputs]
        sizes = [td.batch_size[0] for td in flat]
        big = flat[0] if len(flat) == 1 else torch.cat(flat, 0)
        before = set(big.keys(True, True))
        with self._lock, torch.no_grad(), set_interaction_type(self.exploration_type):
            out = self.policy(big.clone(False))
            version = self.version
        out = out.select(*[k for k in out.keys(True, True) if k not in before])
        self.forwards += 1
        self.rows += big.batch_size[0]
        parts = out.split(sizes, 0) if len(sizes) > 1 else [out]
        return [p.reshape(td.batch_size) for p, td in zip(parts, inputs, strict=True)], version


class _Hub:
    """Messages between the trainer, its server thread and the env workers.

    Workers send ``(kind, payload)``: ``"infer"`` goes to the server; everything else
    (``"ready"``, ``"error"``, ``"dead"``) to the trainer's ``outbox``.
    """

    def __init__(self, server: InferenceServer, n: int) -> None:
        self.server = server
        self.n = n
        self.outbox: queue.Queue = queue.Queue()
        self.active = 0  # workers collecting now (the server stops waiting when all asked)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=carry_num_threads(self._serve), name="tdrl-inference-server", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(2.0)

    # -------------------------------------------------------------- transport
    def _receive(self, timeout: float) -> list[tuple[int, str, object]]:
        raise NotImplementedError

    def _inputs(self, i: int, payload) -> TensorDictBase:
        raise NotImplementedError

    def _reply(self, i: int, out: TensorDictBase, version: int) -> None:
        raise NotImplementedError

    def command(self, i: int, cmd: str, arg=None) -> None:
        raise NotImplementedError

    # -------------------------------------------------------------- server loop
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
                pending.append((i, self._inputs(i, payload)))
            else:
                self.outbox.put((i, kind, payload))
        return pending


class _ThreadHub(_Hub):
    """Workers are threads: one shared inbox, one reply queue and one command queue each."""

    def __init__(self, server: InferenceServer, n: int) -> None:
        super().__init__(server, n)
        self.inbox: queue.Queue = queue.Queue()
        self.replies = [queue.Queue() for _ in range(n)]
        self.commands = [queue.Queue() for _ in range(n)]

    def _receive(self, timeout: float) -> list:
        try:
            msgs = [self.inbox.get(timeout=timeout)]
        except queue.Empty:
            return []
        while True:
            try:
                msgs.append(self.inbox.get_nowait())
            except queue.Empty:
                return msgs

    def _inputs(self, i: int, payload) -> TensorDictBase:
        return payload

    def _reply(self, i: int, out: TensorDictBase, version: int) -> None:
        self.replies[i].put((out, version))

    def command(self, i: int, cmd: str, arg=None) -> None:
        self.commands[i].put((cmd, arg))


class _ProcessHub(_Hub):
    """Workers are processes: a pipe each (small messages), shared-memory inputs/outputs."""

    def __init__(self, server: InferenceServer, conns: list, procs: list) -> None:
        super().__init__(server, len(conns))
        self.conns, self.procs = conns, procs
        self._in_bufs: list[TensorDictBase | None] = [None] * self.n
        self._out_bufs: list[TensorDictBase | None] = [None] * self.n
        self._send_locks = [threading.Lock() for _ in conns]
        self._dead: set[int] = set()

    def _receive(self, timeout: float) -> list:
        live = [i for i in range(self.n) if i not in self._dead]
        if not live:
            time.sleep(timeout)
            return []
        index = {self.conns[i]: i for i in live}
        sentinels = {self.procs[i].sentinel: i for i in live}
        msgs = []
        for r in mp_wait(list(index) + list(sentinels), timeout=timeout):
            if r in index:
                i = index[r]
                try:
                    kind, payload = r.recv()
                except (EOFError, OSError):
                    continue  # its sentinel reports the death
                msgs.append((i, kind, payload))
            else:
                i = sentinels[r]
                self._dead.add(i)
                msgs.append((i, "dead", self.procs[i].exitcode))
        return msgs

    def _inputs(self, i: int, payload) -> TensorDictBase:
        if payload is not None:  # the first request carries the worker's shared input buffer
            self._in_bufs[i] = payload
        return self._in_bufs[i]

    def _reply(self, i: int, out: TensorDictBase, version: int) -> None:
        buf = self._out_bufs[i]
        if buf is None:
            buf = self._out_bufs[i] = out.clone().share_memory_()
            self._send(i, ("action", (buf, version)))
        else:
            buf.update_(out)
            self._send(i, ("action", (None, version)))

    def _send(self, i: int, msg) -> None:
        with self._send_locks[i]:
            try:
                self.conns[i].send(msg)
            except (BrokenPipeError, OSError):
                pass  # its sentinel reports the death

    def command(self, i: int, cmd: str, arg=None) -> None:
        self._send(i, (cmd, arg))
