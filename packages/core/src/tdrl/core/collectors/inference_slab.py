"""The thread and process transports of the inference server: shared slabs, one-byte wake-ups.

Layout (:class:`SlabLayout`): worker ``i`` owns rows ``[offset_i, offset_i + rows_i)`` of
one input slab per policy in-key and one output slab per policy output, and slot ``i`` of a
versions tensor; for process workers all of them live in shared memory. A step of a worker:

1. its :class:`SlabPolicy` (the policy of the worker's own :class:`~.single.Collector`, so
   the collector's dict loop runs unchanged) writes the step's inputs into its rows and
   writes one byte into its *request pipe*;
2. the server thread (:class:`SlabHub`) polls every request pipe, gathers the workers that
   asked (``max_batch`` / ``max_wait_s``, or until every worker that has steps left in this
   round has asked), runs one forward on their rows (on the slab views themselves when every
   worker asked), writes the outputs into their rows and the version into their slots, and
   writes one byte into each one's *reply pipe*;
3. the worker reads its rows of the output.

No pickling and no TensorDict per step: a request is two small copies and two one-byte
pipe writes. Waiting first polls for ``spin_s`` seconds (``os.sched_yield`` between polls)
before blocking in ``poll``; with many workers on few cores a blocking wait costs a
scheduler wake-up per step, a short spin often finds the answer already there.

Control messages (``collect``, ``close``, the finished batch, errors) go through a separate
channel: a ``multiprocessing`` pipe per process worker, queues for thread workers
(:class:`QueueConn`). A reply byte ``0`` means "the server stopped" (sent at shutdown, so no
worker waits out its timeout). A dead process closes its request pipe: the server stops
waiting for it, and the trainer sees its sentinel.
"""

from __future__ import annotations

import os
import queue
import select
import threading
import time
import traceback
from multiprocessing.connection import wait as mp_wait

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase

from ..threads import carry_num_threads
from .inference_server import InferenceServer

__all__ = ["SlabLayout", "SlabPolicy", "SlabHub", "QueueConn", "DEFAULT_SPIN_S"]

# a short spin before blocking pays for processes (a wake-up costs more than 1 ms of polling)
# and not for threads (the spin holds the GIL): python -m benchmarks.inference_server
DEFAULT_SPIN_S = {"process": 0.001, "thread": 0.0}
_POLL_S = 0.05
_GO, _STOP = b"\x01", b"\x00"


def poll_spinning(poller, timeout: float | None, spin_s: float) -> list:
    """``poller.poll`` that first polls without blocking for ``spin_s`` seconds (yielding the
    CPU between polls), then blocks for the rest of ``timeout`` (``None``: forever)."""
    if spin_s > 0:
        start = time.perf_counter()
        end = start + (spin_s if timeout is None else min(spin_s, timeout))
        while True:
            ready = poller.poll(0)
            if ready:
                return ready
            now = time.perf_counter()
            if now >= end:
                break
            os.sched_yield()
        if timeout is not None:
            timeout = max(0.0, timeout - (now - start))
    return poller.poll(None if timeout is None else max(0, int(timeout * 1000 + 0.999)))


def _write(fd: int, byte: bytes) -> None:
    try:
        os.write(fd, byte)
    except OSError:  # the other end is gone; its death is reported elsewhere
        pass


class SlabLayout:
    """Rows of the shared input / output slabs and the versions tensor, per worker.

    Built by the trainer from one example input per worker (the root after the worker's
    first reset) and one dry-run forward of the server (under a forked RNG, so the
    trainer's random stream does not move).

    Args:
        examples: per worker, its policy inputs ``{key: tensor [*env_batch, ...]}`` as a
            TensorDict with the env's batch size.
        server: the inference server (its dry run gives the outputs' keys, shapes, dtypes).
        share: put the slabs in shared memory (process workers).
    """

    def __init__(self, examples: list[TensorDictBase], server: InferenceServer, share: bool) -> None:
        first = examples[0]
        keys = list(server.in_keys)
        self.batch_shapes = [tuple(td.batch_size) for td in examples]
        self.rows = [max(1, td.batch_size.numel()) for td in examples]
        self.offsets = [sum(self.rows[:i]) for i in range(len(examples))]
        total = sum(self.rows)
        flat = []
        for i, td in enumerate(examples):
            entry = {}
            for k in keys:
                if k not in td.keys(True, True):
                    raise ValueError(f"The policy reads {k!r}, which worker {i}'s example input does "
                                     f"not hold; its keys are {sorted(map(str, td.keys(True, True)))}.")
                v = td.get(k)
                ref = first.get(k)
                feat, ref_feat = v.shape[td.batch_dims:], ref.shape[first.batch_dims:]
                if feat != ref_feat or v.dtype != ref.dtype:
                    raise ValueError(f"Worker {i}'s {k!r} is {tuple(feat)} {v.dtype} per row, worker 0's "
                                     f"{tuple(ref_feat)} {ref.dtype}: one server needs one input layout.")
                entry[k] = v.reshape(self.rows[i], *feat)
            flat.append(entry)
        self.inputs = {k: torch.cat([e[k] for e in flat], 0) for k in keys}
        with torch.random.fork_rng(devices=[]):
            out, _ = server.run({k: v.clone() for k, v in self.inputs.items()}, total)
        server.forwards, server.rows = 0, 0
        for k, v in out.items():
            if v.shape[:1] != (total,):
                raise ValueError(f"The policy's output {k!r} has shape {tuple(v.shape)} for {total} "
                                 "rows of input: the inference server needs one output row per input row.")
        self.outputs = {k: torch.zeros(v.shape, dtype=v.dtype) for k, v in out.items()}
        self.versions = torch.zeros(len(examples), dtype=torch.int64)
        if share:
            for t in [*self.inputs.values(), *self.outputs.values(), self.versions]:
                t.share_memory_()

    def views(self, i: int) -> tuple[list, list]:
        """Worker ``i``'s ``(input views, output views)``: ``[(key, tensor [*env_batch, ...])]``."""
        lo, hi, shape = self.offsets[i], self.offsets[i] + self.rows[i], self.batch_shapes[i]

        def mine(slabs: dict) -> list:
            return [(k, v[lo:hi].view((*shape, *v.shape[1:]))) for k, v in slabs.items()]

        return mine(self.inputs), mine(self.outputs)


class SlabPolicy(TensorDictModuleBase):
    """A worker's stand-in for the policy: its rows of the slabs, one round trip per step.

    ``versions`` lists the weights' version of every answer since it was last cleared.
    """

    def __init__(self, in_keys: list, index: int, request_fd: int, reply_fd: int, timeout: float,
                 spin_s: float) -> None:
        super().__init__()
        self.in_keys, self.out_keys = list(in_keys), []
        self.index, self.timeout, self.spin_s = index, float(timeout), float(spin_s)
        self._request, self._reply = request_fd, reply_fd
        self._poller = select.poll()
        self._poller.register(reply_fd, select.POLLIN)
        self.versions: list[int] = []

    def attach(self, layout: SlabLayout) -> None:
        self._ins, self._outs = layout.views(self.index)
        self._version = layout.versions.numpy()
        self.out_keys = [k for k, _ in self._outs]

    def _ask(self) -> None:
        os.write(self._request, _GO)
        if not poll_spinning(self._poller, self.timeout, self.spin_s):
            raise TimeoutError(f"worker {self.index}: no answer from the inference server within "
                               f"{self.timeout} s")
        if os.read(self._reply, 1) != _GO:
            raise RuntimeError("the inference server stopped")
        self.versions.append(int(self._version[self.index]))

    def dict_call(self, batch_size: torch.Size, device) -> object:
        """The collector's dict loop: write the root's inputs, ask, read the outputs."""
        ins, outs, ask = self._ins, self._outs, self._ask

        def act(root: dict) -> dict:
            for k, view in ins:
                view.copy_(root[k])
            ask()
            for k, view in outs:
                root[k] = view.clone()
            return root

        return act

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        for k, view in self._ins:
            view.copy_(td.get(k))
        self._ask()
        for k, view in self._outs:
            td.set(k, view.clone())
        return td


class QueueConn:
    """A thread worker's control channel: ``send`` to the trainer's shared outbox (tagged with
    the worker's index), ``recv`` from its own command queue."""

    def __init__(self, index: int, outbox: queue.Queue) -> None:
        self.index, self.outbox, self.inbox = index, outbox, queue.Queue()

    def send(self, msg) -> None:
        self.outbox.put((self.index, *msg))

    def recv(self):
        return self.inbox.get()

    def tell(self, msg) -> None:
        """The trainer's side: a command for the worker."""
        self.inbox.put(msg)


class SlabHub:
    """The trainer's side of the thread / process transports: control channels, the wake-up
    pipes and the server thread that answers requests from the slabs.

    Args:
        server: the inference server.
        conns: per worker, its control channel (``multiprocessing`` connections for
            processes, :class:`QueueConn` for threads).
        requests / replies: per worker, the trainer's ends of its wake-up pipes
            (``multiprocessing`` connections, used through their file descriptors).
        procs: the worker processes (``None`` for threads).
        outbox: the thread workers' shared control outbox (``None`` for processes).
        spin_s: seconds the server polls before blocking.
    """

    def __init__(self, server: InferenceServer, conns: list, requests: list, replies: list, *,
                 procs: list | None = None, outbox: queue.Queue | None = None,
                 spin_s: float = 0.0) -> None:
        self.server, self.n = server, len(conns)
        self.conns, self.procs, self.outbox = conns, procs, outbox
        self._pipes = [*requests, *replies]
        self.request_fds = [c.fileno() for c in requests]
        self.reply_fds = [c.fileno() for c in replies]
        self.spin_s = float(spin_s)
        self.layout: SlabLayout | None = None
        self.steps = [0] * self.n  # steps of a round, per worker
        self.remaining = [0] * self.n  # requests each worker still makes this round
        self._errors: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._dead: set[int] = set()  # deaths the trainer has reported (events)
        self._gone: set[int] = set()  # request pipes at EOF (the server thread's own set)
        self._index_cache: dict = {}
        self._thread = threading.Thread(target=carry_num_threads(self._serve),
                                        name="tdrl-inference-server", daemon=True)

    # -------------------------------------------------------------- trainer side
    def start(self, layout: SlabLayout, steps: list[int]) -> None:
        self.layout, self.steps = layout, list(steps)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self.layout is None or self._thread.is_alive()

    def command(self, i: int, cmd: str, arg=None) -> None:
        conn = self.conns[i]
        try:
            conn.tell((cmd, arg)) if isinstance(conn, QueueConn) else conn.send((cmd, arg))
        except (BrokenPipeError, OSError, EOFError):
            pass  # its sentinel reports the death

    def begin_round(self) -> None:
        self.remaining = list(self.steps)

    def end_round(self) -> None:
        self.remaining = [0] * self.n

    def server_error(self) -> str | None:
        """The server thread's traceback if it raised (it is posted before the workers are
        told that the server stopped, so a worker's "server stopped" is explained by it)."""
        try:
            return self._errors.get_nowait()[2]
        except queue.Empty:
            return None

    def events(self, timeout: float) -> list[tuple[int, str, object]]:
        """Control messages ``(worker, kind, payload)``; ``"dead"`` for a process that exited,
        ``"server_error"`` (worker ``-1``) for a server that raised."""
        try:
            return [self._errors.get_nowait()]
        except queue.Empty:
            pass
        if self.outbox is not None:
            try:
                return [self.outbox.get(timeout=timeout)]
            except queue.Empty:
                return []
        live = [i for i in range(self.n) if i not in self._dead]
        index = {self.conns[i]: i for i in live}
        sentinels = {self.procs[i].sentinel: i for i in live}
        msgs = []
        ready = mp_wait([*index, *sentinels], timeout=timeout)
        for r in ready:
            if r in index:
                try:
                    msgs.append((index[r], *r.recv()))
                except (EOFError, OSError):
                    continue  # its sentinel reports the death
        for r in [r for r in ready if r in sentinels] if not msgs else ():  # messages first
            i = sentinels[r]
            self._dead.add(i)
            self.procs[i].join(0.5)  # the exit code is known once it is reaped
            msgs.append((i, "dead", self.procs[i].exitcode))
        return msgs

    def stop(self) -> None:
        """Stop the server thread and wake every worker waiting for an answer (it reads
        "stopped"); the pipes stay open until :meth:`close`."""
        self._stop.set()
        for fd in self.reply_fds:
            _write(fd, _STOP)
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(2.0)

    def close(self) -> None:
        for conn in self._pipes:
            conn.close()

    # -------------------------------------------------------------- server thread
    def _serve(self) -> None:
        server, layout = self.server, self.layout
        poller = select.poll()
        fd_worker = {}
        for i, fd in enumerate(self.request_fds):
            poller.register(fd, select.POLLIN)
            fd_worker[fd] = i
        pending: list[int] = []
        try:
            while not self._stop.is_set():
                if not pending:
                    self._receive(poller, fd_worker, _POLL_S, pending)
                    if not pending:
                        continue
                deadline = time.monotonic() + server.max_wait_s
                while not self._full(pending) and self._more_coming(pending):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._receive(poller, fd_worker, left, pending)
                take = self._take(pending)
                self._answer(layout, take)
        except BaseException:  # noqa: BLE001 - reported to the trainer
            self._errors.put((-1, "server_error", traceback.format_exc()))
            for fd in self.reply_fds:
                _write(fd, _STOP)

    def _receive(self, poller, fd_worker: dict, timeout: float, pending: list) -> None:
        for fd, _ in poll_spinning(poller, timeout, self.spin_s):
            i = fd_worker[fd]
            try:
                data = os.read(fd, 64)
            except OSError:
                data = b""
            if not data:  # the worker is gone: never wait for it again
                poller.unregister(fd)
                self._gone.add(i)
                self.remaining[i] = 0
                continue
            pending.append(i)
            self.remaining[i] -= 1

    def _full(self, pending: list) -> bool:
        cap = self.server.max_batch
        return cap is not None and sum(self.layout.rows[i] for i in pending) >= cap

    def _more_coming(self, pending: list) -> bool:
        asked = set(pending)
        return any(r > 0 and i not in asked and i not in self._gone
                   for i, r in enumerate(self.remaining))

    def _take(self, pending: list) -> list[int]:
        """The first requests that fit ``max_batch`` rows (at least one); the rest wait."""
        cap, rows = self.server.max_batch, self.layout.rows
        n, total = 0, 0
        for i in pending:
            if n and cap is not None and total + rows[i] > cap:
                break
            n, total = n + 1, total + rows[i]
        take = sorted(pending[:n])
        del pending[:n]
        return take

    def _answer(self, layout: SlabLayout, take: list[int]) -> None:
        total = sum(layout.rows[i] for i in take)
        if len(take) == self.n:  # every worker: the slabs themselves
            out, version = self.server.run(layout.inputs, total)
            for k, slab in layout.outputs.items():
                slab.copy_(out[k])
        else:
            idx = self._index(layout, take)
            out, version = self.server.run({k: v.index_select(0, idx) for k, v in layout.inputs.items()},
                                           total)
            for k, slab in layout.outputs.items():
                slab.index_copy_(0, idx, out[k].to(slab.device))
        layout.versions[take] = version
        for i in take:
            _write(self.reply_fds[i], _GO)

    def _index(self, layout: SlabLayout, take: list[int]) -> torch.Tensor:
        key = tuple(take)
        idx = self._index_cache.get(key)
        if idx is None:
            if len(self._index_cache) > 256:
                self._index_cache.clear()
            idx = torch.cat([torch.arange(layout.offsets[i], layout.offsets[i] + layout.rows[i])
                             for i in take])
            self._index_cache[key] = idx
        return idx
