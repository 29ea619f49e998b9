"""Asynchronous extends and priority updates for a prioritized replay buffer.

:class:`AsyncPrioritizedReplayBuffer` is a :class:`PrioritizedReplayBuffer` whose
``extend`` and ``update_priority`` return at once: they put the work on a bounded queue that
one writer thread applies, in call order, under a lock that ``sample`` also takes (so a
sample never sees half of a write). A full queue blocks the caller (back-pressure).
:meth:`flush` applies what the thread has not yet taken itself, in order, rather than
waiting for the thread to wake (on a loaded machine that wake-up cost ~1 ms a call).

Consistency point: :meth:`flush` returns once every queued write is applied. **By default
``sample()`` flushes first**, so a batch sees everything written before it and the sampled
indices and weights are exactly those of the synchronous buffer under the same seed (what a
TorchRL user expects from ``rb.extend(...); rb.sample()``). The time saved is then the
writes' own cost overlapping the caller's work between two samples (e.g. a collector step or
a loss backward that releases the GIL). ``flush_on_sample=False`` lets ``sample()`` read the
tree as it is: priorities and items may lag by the queued writes (at most ``queue_size``
calls), as with TorchRL's ``prefetch``; :meth:`flush` still gives the exact state.

Errors raised by a write in the writer thread are kept and raised by the caller's next call
on the buffer (``sample``, ``extend``, ``update_priority``, ``flush``, ``close``, ...), as a
``RuntimeError`` naming the failed call, with the original exception as its cause; later
queued writes are still applied, as they would be for a synchronous caller that caught the
error. Every state-reading call (``state_dict``, ``dumps``, ``empty``, ``len`` is not one)
flushes first, so ``dumps`` keeps its crash-safety. :meth:`close` (also ``with``-exit and
garbage collection) flushes and stops the thread; a closed buffer refuses writes.
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from typing import Any

import torch
from tensordict import TensorDictBase

from .buffer import PrioritizedReplayBuffer

__all__ = ["AsyncPrioritizedReplayBuffer"]

class _WriterState:
    """What the writer thread shares with the buffer (never the buffer itself, so the
    buffer can be garbage collected while the thread waits).

    ``items`` is the bounded queue (guarded by ``cond``); ``lock`` is held while one item is
    taken from it *and* applied, by the writer thread or by a caller's :meth:`drain`, so the
    items are applied in call order whoever applies them, and ``sample`` (which also takes
    ``lock``) never sees half of a write.
    """

    def __init__(self, queue_size: int) -> None:
        self.items: deque = deque()
        self.size = queue_size
        self.cond = threading.Condition(threading.Lock())
        self.lock = threading.Lock()
        self.errors: list[tuple[str, BaseException]] = []
        self.stop = False

    def put(self, item) -> None:
        with self.cond:
            while len(self.items) >= self.size:
                self.cond.wait()
            self.items.append(item)
            self.cond.notify_all()

    def _apply_next(self) -> bool:
        """Take and apply the next item (caller holds ``lock``); ``False`` when none.

        Consecutive queued ``update_priority`` calls are taken together and applied as one
        (see :func:`_coalesce`): one tree update instead of several.
        """
        with self.cond:
            if not self.items:
                return False
            taken = [self.items.popleft()]
            while (taken[0][0] == _UPDATE and self.items and self.items[0][0] == _UPDATE):
                taken.append(self.items.popleft())
            self.cond.notify_all()
        if len(taken) > 1:
            try:
                _, fn, args = _coalesce(taken)
                fn(*args)
                return True
            except BaseException:  # noqa: BLE001 - applied one by one below, each error kept
                pass  # the sampler checks before it writes: nothing of the merged call landed
        for name, fn, args in taken:
            try:
                fn(*args)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's next call
                self.errors.append((name, exc))
        return True

    def drain(self) -> None:
        """Apply every queued item in this thread (the ones the writer has not taken yet)."""
        while True:
            with self.lock:
                if not self._apply_next():
                    return


_UPDATE = "update_priority"


def _coalesce(items: list) -> tuple:
    """One ``update_priority`` call equal to the consecutive calls ``items``, in order.

    Indices and priorities are concatenated in call order; the sum tree writes duplicated
    indices in order (the last write wins) and recomputes every parent from its children,
    and the running maximum priority is a max, so the tree after the merged call equals the
    tree after the calls one by one (tested), hence the same draws after a flush.
    """
    indices, priorities = [], []
    for _, _, (index, priority) in items:
        index = index.reshape(-1)
        priority = torch.as_tensor(priority, dtype=torch.float64).reshape(-1)
        indices.append(index)
        priorities.append(priority.expand(index.numel()) if priority.numel() == 1 else priority)
    fn = items[0][1]
    return _UPDATE, fn, (torch.cat(indices), torch.cat(priorities))


def _writer_loop(state: _WriterState) -> None:
    while True:
        with state.cond:
            while not state.items and not state.stop:
                state.cond.wait()
            if state.stop and not state.items:
                return
        with state.lock:
            state._apply_next()


def _stop(state: _WriterState, thread: threading.Thread) -> None:
    with state.cond:
        state.stop = True
        state.cond.notify_all()
    if threading.current_thread() is not thread:
        thread.join()


class AsyncPrioritizedReplayBuffer(PrioritizedReplayBuffer):
    """A :class:`PrioritizedReplayBuffer` whose writes run on a writer thread.

    Args:
        alpha, beta, storage, eps: as in :class:`PrioritizedReplayBuffer`.
        queue_size: most calls waiting in the queue; a write beyond that blocks until the
            writer catches up (>= 1).
        flush_on_sample: ``True`` (default): ``sample()`` first applies every queued write,
            so it draws exactly what the synchronous buffer would. ``False``: it reads the
            current tree and storage (writes may lag by up to ``queue_size`` calls).
        copy: copy the data given to ``extend`` before queueing it (default ``True``), so the
            caller may reuse or modify its batch at once. ``False`` saves that copy when every
            batch is a fresh tensor the caller does not touch again before :meth:`flush`.
        **kwargs: other :class:`ReplayBuffer` arguments (``batch_size``, ``transform``, ...).

    ``extend`` returns ``None`` (the slots are known only once the write is applied);
    ``len(buffer)`` counts the items already written. Priorities passed to
    ``update_priority`` are copied when queued.
    """

    def __init__(self, alpha: float, beta: float, storage=None, eps: float = 1e-8,
                 queue_size: int = 64, flush_on_sample: bool = True, copy: bool = True,
                 **kwargs) -> None:
        if queue_size < 1:
            raise ValueError(f"queue_size must be >= 1, got {queue_size}.")
        super().__init__(alpha, beta, storage=storage, eps=eps, **kwargs)
        self.flush_on_sample = bool(flush_on_sample)
        self.copy = bool(copy)
        self._state = _WriterState(queue_size)
        self._closed = False
        self._thread = threading.Thread(target=_writer_loop, args=(self._state,),
                                        name="tdrl-replay-writer", daemon=True)
        self._thread.start()
        self._finalizer = weakref.finalize(self, _stop, self._state, self._thread)

    # ------------------------------------------------------------------ plumbing
    def _raise_pending(self) -> None:
        errors = self._state.errors
        if not errors:
            return
        name, exc = errors[0]
        more = len(errors) - 1
        del errors[: more + 1]
        extra = f" ({more} later queued write(s) failed too)" if more else ""
        raise RuntimeError(
            f"An asynchronous {name} failed in the replay buffer's writer thread{extra}: "
            f"{type(exc).__name__}: {exc}. The writes queued after it were applied; call "
            "flush() after writes to check them at a point of your choosing."
        ) from exc

    def _put(self, name: str, fn, *args: Any) -> None:
        self._raise_pending()
        if self._closed:
            raise RuntimeError(f"{name} on a closed AsyncPrioritizedReplayBuffer; make a new one.")
        self._state.put((name, fn, args))

    def flush(self) -> None:
        """Apply every queued write, then raise a writer error if any.

        The writes the writer thread has not taken yet are applied here, in this thread
        (in call order): a flush never waits for the writer thread to be scheduled.
        """
        self._state.drain()
        self._raise_pending()

    def close(self) -> None:
        """Flush, stop the writer thread and wait for it (idempotent)."""
        if self._closed:
            self._raise_pending()
            return
        try:
            self.flush()
        finally:
            self._closed = True
            self._finalizer()  # puts the stop marker and joins the thread

    def __enter__(self) -> AsyncPrioritizedReplayBuffer:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # ------------------------------------------------------------------ writes
    def extend(self, data) -> None:  # type: ignore[override]
        """Queue a batch of items (see :meth:`ReplayBuffer.extend`); returns ``None``."""
        if self.copy and isinstance(data, (torch.Tensor, TensorDictBase)):
            data = data.clone()
        self._put("extend", super().extend, data)

    def update_priority(self, index, priority=None) -> None:
        """Queue new priorities (same arguments as :meth:`ReplayBuffer.update_priority`)."""
        index, priority = self._priority_args(index, priority)
        index = torch.as_tensor(index).detach().clone()
        if isinstance(priority, torch.Tensor):
            priority = priority.detach().clone()
        self._put(_UPDATE, super().update_priority, index, priority)

    # ------------------------------------------------------------------ reads
    def sample(self, batch_size: int | None = None, return_info: bool = False):
        """Draw a batch (see :meth:`ReplayBuffer.sample`); flushes first unless the buffer
        was built with ``flush_on_sample=False``."""
        if self.flush_on_sample:
            self.flush()
        else:
            self._raise_pending()
        with self._state.lock:
            return super().sample(batch_size, return_info)

    def __getitem__(self, index):
        self.flush()
        return super().__getitem__(index)

    # ------------------------------------------------------------------ state
    def empty(self) -> None:
        self.flush()
        super().empty()

    def state_dict(self) -> dict:
        self.flush()
        return super().state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.flush()
        super().load_state_dict(state)

    def dumps(self, path, *, checksum: bool = False) -> None:
        self.flush()  # the dump holds every write made before the call
        super().dumps(path, checksum=checksum)

    def loads(self, path) -> None:
        self.flush()
        super().loads(path)
