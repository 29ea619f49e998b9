"""Replay buffer speed: tdrl vs TorchRL 0.14, side by side in one run.

Run with the peers' venv (it has TorchRL and tdrl installed):

    flock /tmp/tdrl-cpu.lock .venv-bench/bin/python -m benchmarks.replay

Cases (issue 3):
- extend: batches of 1024 transitions (obs 64 floats, next obs, action 8, reward, done)
  into a 1M-slot tensor storage (filled to capacity first, so writes wrap around);
- sample: batches of 256 from that full storage;
- prioritized: sample 256 + update their priorities, 1M slots, full.

Issue 43 (``--only tree`` / ``--only sac``):
- tree: the same prioritized step with the host tree (``PrioritizedSampler()``, SumMinTree)
  vs the device tree (``PrioritizedSampler(device=...)``, tdrl.kernels sum-tree ops); on a
  CPU both run on the CPU (the device tree runs its torch reference there), with
  ``--tree-device cuda`` the host tree pays the round trips a GPU learner would
  (indices to the device, TD errors to the host). Wall time per call, synchronised.
- sac: a SAC-style off-policy loop with prioritized replay and UTD 4 (8 transitions
  extended per env step, then 4 x [sample 256, twin-Q + actor losses, backward, Adam,
  update_priority]), ``PrioritizedReplayBuffer`` vs ``AsyncPrioritizedReplayBuffer``
  (``flush_on_sample`` True and False), with the writes issued after the update or at the
  overlapping point (priorities, and the env step's extend in the block's first update,
  right before ``backward()``); env steps per second of wall
  time, median of interleaved rounds, plus one timed synchronous pass that splits a step
  into extend / sample / update_priority / learner (the most any writer thread can win).

Times are CPU seconds of this process (``time.process_time``), so that other jobs on the
shared machine inflate them less; each figure is the median over ``--repeats`` rounds,
ours and the peer's interleaved round by round. One torch thread.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from tensordict import TensorDict

from tdrl.core.replay import (
    AsyncPrioritizedReplayBuffer,
    PrioritizedReplayBuffer,
    PrioritizedSampler,
    ReplayBuffer,
    TensorStorage,
)

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
    ap.add_argument("--only", choices=("all", "calls", "tree", "sac"), default="calls",
                    help="calls: extend/sample/prioritized vs TorchRL (the default); tree: host vs "
                         "device sum tree; sac: sync vs async prioritized writes; all: every case")
    ap.add_argument("--tree-device", default="cpu", help="device of the device tree (tree case)")
    ap.add_argument("--sac-steps", type=int, default=150, help="env steps per round (sac case)")
    ap.add_argument("--sac-hidden", type=int, default=256, help="MLP width of the SAC learner")
    args = ap.parse_args()
    if args.only in ("tree", "all"):
        tree_case(args)
    if args.only in ("sac", "all"):
        sac_case(args)
    if args.only in ("calls", "all"):
        calls_case(args)


def calls_case(args) -> None:
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


def _wall_per_call_us(fn, calls: int, sync) -> float:
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - start) / calls * 1e6


def tree_case(args) -> None:
    """Prioritized sample 256 + update 256 on a full storage: host tree vs device tree."""
    from benchmarks.records import cpu_model, write_record

    dev = torch.device(args.tree_device)
    cap = args.capacity
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    storage = TensorStorage(cap, device=dev)
    storage.set(torch.arange(cap), TensorDict({"x": torch.zeros(cap, 4, device=dev)}, [cap]))
    host = PrioritizedSampler(cap, alpha=0.6, beta=0.4)
    device = PrioritizedSampler(cap, alpha=0.6, beta=0.4, device=dev)
    for s in (host, device):
        s.mark_update(torch.arange(cap), storage)

    def host_step():  # a learner on `dev` with the tree on the host
        index, info = host.sample(storage, 256)
        index = index.to(dev)
        _ = storage.get(index), info["_weight"].to(dev)
        td_error = torch.rand(256, device=dev)
        host.update_priority(index.cpu(), td_error.cpu())

    def device_step():
        index, info = device.sample(storage, 256)
        _ = storage.get(index), info["_weight"]
        device.update_priority(index, torch.rand(256, device=dev))

    for fn in (host_step, device_step):  # warm-up (Triton compiles on first use)
        fn()
    h, d = [], []
    for _ in range(args.repeats):
        h.append(_wall_per_call_us(host_step, args.calls, sync))
        d.append(_wall_per_call_us(device_step, args.calls, sync))
    hm, dm = statistics.median(h), statistics.median(d)
    size = f"{cap / 1e6:g}M" if cap >= 1_000_000 else f"{cap // 1000}k"
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else cpu_model()
    print(f"prioritized sample 256 + update 256, {size} slots, storage on {dev} ({name}): "
          f"host tree {hm:9.1f} us   device tree {dm:9.1f} us   host/device x{hm / dm:.2f}")
    if args.record:
        write_record("Replay buffers", "Sum tree on the host vs on the device (issue 43)",
                     f"sample 256 + update 256, {size} slots, storage on {dev.type} ({name})",
                     {"host tree us": round(hm, 1), "device tree us": round(dm, 1)},
                     peer="host tree (SumMinTree)", ratio=f"x{hm / dm:.2f}")


class _SacLearner:
    """Twin-Q critic + tanh-Gaussian actor, as in SAC (Haarnoja et al., 2018), small MLPs."""

    def __init__(self, obs: int = 17, act: int = 6, hidden: int = 256) -> None:
        def mlp(i, o):
            return torch.nn.Sequential(torch.nn.Linear(i, hidden), torch.nn.ReLU(),
                                       torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
                                       torch.nn.Linear(hidden, o))
        torch.manual_seed(0)
        self.q1, self.q2, self.actor = mlp(obs + act, 1), mlp(obs + act, 1), mlp(obs, 2 * act)
        params = [*self.q1.parameters(), *self.q2.parameters(), *self.actor.parameters()]
        self.opt = torch.optim.Adam(params, lr=3e-4)

    def _act(self, obs):
        mu, log_std = self.actor(obs).chunk(2, -1)
        std = log_std.clamp(-5, 2).exp()
        pre = mu + std * torch.randn_like(mu)
        logp = (-0.5 * ((pre - mu) / std) ** 2 - std.log()).sum(-1, keepdim=True)
        return torch.tanh(pre), logp

    def update(self, s: TensorDict, on_priority=None) -> torch.Tensor:
        """One SAC update; returns |TD error| ``[B]``. ``on_priority(td_error)`` is called once
        the losses are built, right before ``backward()`` (the point where an asynchronous
        buffer's writer overlaps autograd and Adam, which run in C++ without the GIL)."""
        obs, act = s["observation"], s["action"]
        nxt = s["next", "observation"]
        with torch.no_grad():
            a2, logp2 = self._act(nxt)
            x2 = torch.cat([nxt, a2], -1)
            target = s["next", "reward"] + 0.99 * (torch.min(self.q1(x2), self.q2(x2)) - 0.2 * logp2)
        x = torch.cat([obs, act], -1)
        q1, q2 = self.q1(x), self.q2(x)
        td_error = (q1 - target).detach().abs().squeeze(-1)
        w = s["_weight"].unsqueeze(-1)
        critic = (w * ((q1 - target) ** 2 + (q2 - target) ** 2)).mean()
        a, logp = self._act(obs)
        xa = torch.cat([obs, a], -1)
        actor = (0.2 * logp - torch.min(self.q1(xa), self.q2(xa))).mean()
        self.opt.zero_grad(set_to_none=True)
        loss = critic + actor
        if on_priority is not None:
            on_priority(td_error)
        loss.backward()
        self.opt.step()
        return td_error


def _sac_transitions(n: int, obs: int = 17, act: int = 6) -> TensorDict:
    return TensorDict({"observation": torch.randn(n, obs), "action": torch.rand(n, act) * 2 - 1,
                       "next": {"observation": torch.randn(n, obs), "reward": torch.randn(n, 1),
                                "done": torch.zeros(n, 1, dtype=torch.bool)}}, [n])


def sac_case(args) -> None:
    """SAC-style loop, UTD 4: sync vs async prioritized writes (env steps per second).

    Two call orders. "after the step": extend at the top of the env step, update_priority
    once the learner's update returned (the writer thread then has nothing to overlap: the
    next sample flushes at once). "overlapped": update_priority (and, in the block's first
    update, the env step's extend) is issued right before ``backward()``, so the writer
    thread applies them while autograd and Adam run in C++ without the GIL.
    """
    from benchmarks.records import cpu_model, write_record

    cap, utd, steps = 100_000, 4, args.sac_steps
    kinds = {  # name: (buffer kind, overlapped call order)
        "sync": ("sync", True),
        "async, writes after the step": ("async", False),
        "async, writes overlapped": ("async", True),
        "async, flush_on_sample=False, writes overlapped": ("stale", True),
    }

    def make(kind):
        kw = dict(alpha=0.6, beta=0.4, storage=TensorStorage(cap), batch_size=256)
        if kind == "sync":
            rb = PrioritizedReplayBuffer(**kw)
        else:
            rb = AsyncPrioritizedReplayBuffer(**kw, flush_on_sample=(kind == "async"))
        fill(rb.extend, 20_000, _sac_transitions(1000))
        return rb

    buffers = {k: make(kind) for k, (kind, _) in kinds.items()}
    learner = _SacLearner(hidden=args.sac_hidden)
    step_data = [_sac_transitions(8) for _ in range(16)]

    def run(name):
        rb, overlapped = buffers[name], kinds[name][1]
        start = time.perf_counter()
        for t in range(steps):
            batch = step_data[t % 16]  # a collector step: 8 envs
            if not overlapped:
                rb.extend(batch)
            for u in range(utd):
                s = rb.sample()
                if overlapped:
                    learner.update(s, lambda td, i=s["index"], first=(u == 0): _overlapped_writes(
                        rb, i, td, batch if first else None))
                else:
                    rb.update_priority(s["index"], learner.update(s))
        if hasattr(rb, "flush"):
            rb.flush()
        return steps / (time.perf_counter() - start)

    for k in kinds:  # warm-up
        run(k)
    res = {k: [] for k in kinds}
    for _ in range(args.repeats):
        for k in kinds:
            res[k].append(run(k))
    med = {k: statistics.median(v) for k, v in res.items()}
    share = _replay_share(buffers["sync"], learner, step_data, steps, utd)
    writes, every = share["extend"] + share["update_priority"], 1 - share["learner"]
    note = (f"MLPs {args.sac_hidden} wide, where a synchronous step's time goes (one timed pass): "
            f"extend {share['extend']:.1%}, sample {share['sample']:.1%}, update_priority "
            f"{share['update_priority']:.1%}, learner {share['learner']:.1%}; so a writer thread "
            f"that hid the writes entirely could reach x{1 / (1 - writes):.2f} at most, and one that "
            f"also sampled ahead x{1 / (1 - every):.2f}, and only with a free core: the 2 cores "
            f"ran other jobs too (load average {os.getloadavg()[0]:.1f}).")
    cpu = cpu_model()
    print(f"SAC-style loop (UTD {utd}, batch 256, MLPs {args.sac_hidden} wide, 8 transitions per env step, prioritized, "
          f"{cap // 1000}k slots), env steps/s, median of {args.repeats} interleaved rounds x "
          f"{steps} steps, {cpu}, torch threads {torch.get_num_threads()}:")
    for k in kinds:
        print(f"  {k:<48} {med[k]:8.1f} steps/s   vs sync x{med[k] / med['sync']:.2f}")
    print(f"  {note}")
    for rb in buffers.values():
        if hasattr(rb, "close"):
            rb.close()
    if args.record:
        for k in list(kinds)[1:]:
            write_record("Replay buffers", "Asynchronous prioritized writes, SAC-style loop (issue 43)",
                         f"{k}, UTD {utd}, batch 256, MLPs {args.sac_hidden} wide, 100k slots ({cpu})",
                         {"async steps/s": round(med[k], 1), "sync steps/s": round(med["sync"], 1)},
                         peer="PrioritizedReplayBuffer (sync)", ratio=f"x{med[k] / med['sync']:.2f}",
                         note=note)


def _overlapped_writes(rb, index, td_error, batch) -> None:
    """The writes issued right before the learner's backward: the priorities of the batch
    just sampled and, once per env step, the extend of the collected transitions."""
    rb.update_priority(index, td_error)
    if batch is not None:
        rb.extend(batch)


def _replay_share(rb, learner, step_data, steps: int, utd: int) -> dict[str, float]:
    """Fractions of a synchronous SAC-style step spent in each replay call and the learner."""
    spent = dict.fromkeys(("extend", "sample", "update_priority", "learner"), 0.0)
    clock = time.perf_counter
    start = clock()
    for t in range(steps):
        a = clock()
        rb.extend(step_data[t % 16])
        spent["extend"] += clock() - a
        for _ in range(utd):
            a = clock()
            s = rb.sample()
            b = clock()
            td_error = learner.update(s)
            c = clock()
            rb.update_priority(s["index"], td_error)
            spent["update_priority"] += clock() - c
            spent["sample"] += b - a
            spent["learner"] += c - b
    total = clock() - start
    return {k: v / total for k, v in spent.items()}


class _Recorder:
    """Writes this run's rows into benchmarks/results (section "Replay buffers")."""

    def __init__(self, capacity: int) -> None:
        self.size = f"{capacity // 1000}k" if capacity < 1_000_000 else f"{capacity / 1e6:g}M"
        self.table = f"Replay buffer calls, {self.size}-slot storages"

    def add(self, case: str, ours: float, peer: float | None) -> None:
        from benchmarks.records import write_record

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
