"""Replay buffer speed: tdrl vs TorchRL 0.14, side by side in one run.

Run with the peers' venv (it has TorchRL and tdrl installed):

    flock /tmp/tdrl-cpu.lock .venv-bench/bin/python benchmarks/replay.py

Cases (issue 3):
- extend: batches of 1024 transitions (obs 64 floats, next obs, action 8, reward, done)
  into a 1M-slot tensor storage (filled to capacity first, so writes wrap around);
- sample: batches of 256 from that full storage;
- prioritized: sample 256 + update their priorities, 1M slots, full.

Times are CPU seconds of this process (``time.process_time``), so that other jobs on the
shared machine inflate them less; each figure is the median over ``--repeats`` rounds,
ours and the peer's interleaved round by round. One torch thread.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from tensordict import TensorDict

from tdrl.core.replay import PrioritizedReplayBuffer, ReplayBuffer, TensorStorage

torch.set_num_threads(1)


def make_batch(n: int) -> TensorDict:
    return TensorDict(
        {
            "observation": torch.randn(n, 64),
            "action": torch.randn(n, 8),
            "next": {"observation": torch.randn(n, 64), "reward": torch.randn(n, 1),
                     "done": torch.zeros(n, 1, dtype=torch.bool)},
        },
        [n],
    )


def per_call_us(fn, calls: int) -> float:
    start = time.process_time()
    for _ in range(calls):
        fn()
    return (time.process_time() - start) / calls * 1e6


def fill(extend, capacity: int, batch: TensorDict) -> None:
    for _ in range(-(-capacity // batch.shape[0])):
        extend(batch)


def torchrl_buffers(capacity: int):
    try:
        from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
    except ImportError as err:  # pragma: no cover - depends on the venv
        return None, f"TorchRL not importable ({err}); run with .venv-bench/bin/python"
    return TensorDictReplayBuffer(storage=LazyTensorStorage(capacity), batch_size=256), None


def torchrl_prioritized(capacity: int):
    try:
        from torchrl.data import LazyTensorStorage, TensorDictPrioritizedReplayBuffer

        return TensorDictPrioritizedReplayBuffer(alpha=0.6, beta=0.4,
                                                 storage=LazyTensorStorage(capacity),
                                                 batch_size=256), None
    except Exception as err:  # noqa: BLE001 - report why the peer cannot run
        return None, f"{type(err).__name__}: {err}"


class NaivePrioritized:
    """Reference without a tree: ``torch.multinomial`` over all priorities (O(N) a sample)."""

    def __init__(self, capacity: int, alpha=0.6, beta=0.4) -> None:
        self.q = torch.ones(capacity, dtype=torch.float64)
        self.alpha, self.beta = alpha, beta

    def sample_update(self, data: TensorDict) -> None:
        idx = torch.multinomial(self.q, 256, replacement=True)
        p = self.q[idx] / self.q.sum()
        w = (p * self.q.numel()) ** -self.beta
        _ = data[idx].set("_weight", (w / w.max()).float())
        self.q[idx] = (torch.rand(256, dtype=torch.float64) + 1e-8) ** self.alpha


def row(name: str, ours: float, peer: float | None, peer_name: str) -> None:
    if peer is None:
        print(f"{name:<34} tdrl {ours:9.1f} us   {peer_name:<18} {'n/a':>9}")
    else:
        print(f"{name:<34} tdrl {ours:9.1f} us   {peer_name:<18} {peer:9.1f} us   "
              f"speed-up x{peer / ours:5.2f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--capacity", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--record", action="store_true",
                    help="also store the rows in benchmarks/results (then run make_results.py)")
    args = ap.parse_args()
    rec = _Recorder(args.capacity) if args.record else None
    cap, batch = args.capacity, make_batch(1024)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, capacity {cap}, "
          f"median of {args.repeats} rounds x {args.calls} calls (CPU time per call)")

    ours = ReplayBuffer(TensorStorage(cap), batch_size=256)
    peer, why = torchrl_buffers(cap)
    fill(ours.extend, cap, batch)
    if peer is not None:
        fill(peer.extend, cap, batch)
    res = {"extend": ([], []), "sample": ([], [])}
    for _ in range(args.repeats):
        res["extend"][0].append(per_call_us(lambda: ours.extend(batch), args.calls))
        res["sample"][0].append(per_call_us(ours.sample, args.calls))
        if peer is not None:
            res["extend"][1].append(per_call_us(lambda: peer.extend(batch), args.calls))
            res["sample"][1].append(per_call_us(peer.sample, args.calls))
    size = f"{cap // 1000}k" if cap < 1_000_000 else f"{cap / 1e6:g}M"
    for case, label in (("extend", f"extend 1024 (obs 64), {size} storage"),
                        ("sample", f"sample 256, {size} storage")):
        o, p = res[case]
        row(label, statistics.median(o), statistics.median(p) if p else None, "TorchRL TDRB")
        if rec:
            rec.add(case, statistics.median(o), statistics.median(p) if p else None)
    if peer is None:
        print("  TorchRL:", why)
    del peer

    pr = PrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=TensorStorage(cap), batch_size=256)
    fill(pr.extend, cap, batch)
    tpr, why = torchrl_prioritized(cap)
    if tpr is not None:
        fill(tpr.extend, cap, batch)
    naive = NaivePrioritized(cap)
    data = pr.storage._data

    def ours_step():
        s = pr.sample()
        pr.update_priority(s["index"], torch.rand(256))

    def peer_step():
        s = tpr.sample()
        s.set("td_error", torch.rand(256))
        tpr.update_tensordict_priority(s)

    o, p, n = [], [], []
    for _ in range(args.repeats):
        o.append(per_call_us(ours_step, args.calls))
        n.append(per_call_us(lambda: naive.sample_update(data), max(5, args.calls // 5)))
        if tpr is not None:
            p.append(per_call_us(peer_step, args.calls))
    label = "prioritized sample 256 + update"
    row(label, statistics.median(o), statistics.median(p) if p else None, "TorchRL PRB")
    if tpr is None:
        print(f"  TorchRL 0.14.1 prioritized buffer cannot run here: {why}")
    row(label, statistics.median(o), statistics.median(n), "naive multinomial")
    if rec:
        rec.add("prioritized", statistics.median(o), statistics.median(p) if p else None)
        rec.add("naive", statistics.median(o), statistics.median(n))


class _Recorder:
    """Writes this run's rows into benchmarks/results (section "Replay buffers")."""

    def __init__(self, capacity: int) -> None:
        self.size = f"{capacity // 1000}k" if capacity < 1_000_000 else f"{capacity / 1e6:g}M"
        self.table = f"Replay buffer calls, {self.size}-slot storages"

    def add(self, case: str, ours: float, peer: float | None) -> None:
        from records import write_record

        rows = {
            "extend": (f"extend 1024 transitions, TensorStorage({self.size})",
                       f"TorchRL TensorDictReplayBuffer(LazyTensorStorage({self.size}))"),
            "sample": (f"sample 256 from the full {self.size} storage", "TorchRL, same"),
            "prioritized": (f"prioritized: sample 256 + update 256 priorities, {self.size} slots",
                            "TorchRL prioritized" if peer is not None else "TorchRL prioritized: cannot run"),
            "naive": ("prioritized, against a naive torch.multinomial over all priorities (O(N))",
                      "torch.multinomial"),
        }
        row, peer_name = rows[case]
        write_record("Replay buffers", self.table, row,
                     {"tdrl us": round(ours), "peer us": None if peer is None else round(peer)},
                     peer=peer_name, ratio=None if peer is None else f"x{peer / ours:.2f}")


if __name__ == "__main__":
    main()
