"""Memory of the compact-observation path: bytes per stored transition, plain vs compact.

A ``Collector`` over DeepMind Control's cartpole-swingup rendering 84x84 RGB pixels (uint8,
a real render through ``DMControlEnv(pixels=True)``; ``--stack 4`` adds ``CatFrames`` along
the channels, 84x84x12) fills two ``ReplayBuffer(TensorStorage(n))``: one with the plain
batches (``observation``, ``pixels`` and ``("next", ...)`` copies of both), one with
``compact_obs=True`` batches (no ``("next", obs)``). Bytes per transition: every stored
leaf's bytes over the items stored. Also timed: sampling slices of 8 (``SliceSampler``) from
each, the compact one followed by ``NextStateReconstructor`` (what a consumer pays to get the
next observations back). One torch thread.

TorchRL 0.14.1 side in the same run (when ``import torchrl`` works in this interpreter): the
same env through ``DMControlWrapper(suite.load(...), from_pixels=True, pixels_only=False)``
rendering 84x84 (its state stays as ``position`` / ``velocity``, 5 floats as tdrl's
``observation``), its ``CatFrames`` for ``--stack``, its ``Collector(compact_obs=True)`` into
``ReplayBuffer(LazyTensorStorage)`` with ``SliceSampler(slice_len=8, traj_key=("collector",
"traj_ids"))``, and its ``NextStateReconstructor`` after each sample. The two sides' timing
rounds are interleaved; the ratio is tdrl / TorchRL.

The lossy variant, ``NextObservationDelta`` (issue 43), only compresses floating observations,
so its rows take the same env's pixels through ``ToTensorImage`` (float32 3x84x84, what a
TorchRL pixel pipeline stores) plus the state: plain storage vs ``NextObservationDelta()`` in
the env (float16 ``("next", "delta", k)`` for every float key), each side's own transform
rebuilding ``("next", k)`` after a uniform sample of 256 (``RandomSampler``, TorchRL's default
sampler); one frame (``--stack`` does not apply), TorchRL's side in the same run.

    flock /tmp/tdrl-cpu.lock .venv-bench/bin/python -m benchmarks.compact_obs --frames 400 \
        --stack 4 --record
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("MUJOCO_GL", "egl")  # DeepMind Control renders offscreen

import torch  # noqa: E402

from tdrl.core.collectors import Collector  # noqa: E402
from tdrl.core.envs.dm_control import DMControlEnv  # noqa: E402
from tdrl.core.replay import (  # noqa: E402
    NextStateReconstructor,
    ReplayBuffer,
    SliceSampler,
    TensorStorage,
)
from tdrl.core.transforms import (  # noqa: E402
    CatFrames,
    Compose,
    NextObservationDelta,
    ToTensorImage,
    TransformedEnv,
)


def make_env(stack: int):
    env = DMControlEnv("cartpole", "swingup", pixels=True, pixels_size=84)
    if stack > 1:
        env = TransformedEnv(env, CatFrames(stack, dim=-1, in_keys=["pixels"]))
    return env


def fill(compact: bool, frames: int, stack: int, seed: int = 0) -> tuple[ReplayBuffer, tuple]:
    torch.manual_seed(seed)
    env = make_env(stack)
    env.set_seed(seed)
    col = Collector(env, None, frames_per_batch=100, compact_obs=compact)
    rb = ReplayBuffer(TensorStorage(frames), SliceSampler(slice_len=8), batch_size=256)
    while len(rb) < frames:
        rb.extend(col.rollout())
    keys = tuple(env.observation_keys)
    col.shutdown()
    return rb, keys


def bytes_per_item(rb: ReplayBuffer) -> float:
    items = rb[:]
    total = sum(v.numel() * v.element_size() for v in items.values(True, True))
    return total / len(rb)


def sample_us(rb: ReplayBuffer, after=None, calls: int = 30, repeats: int = 5) -> float:
    rounds = []
    for _ in range(repeats):
        start = time.process_time()
        for _ in range(calls):
            batch = rb.sample()
            if after is not None:
                after(batch)
        rounds.append((time.process_time() - start) / calls * 1e6)
    return statistics.median(rounds)


def torchrl_side(frames: int, stack: int, seed: int = 0):
    """TorchRL's plain and compact buffers and its reconstructor, or ``None`` and why."""
    try:
        from dm_control import suite
        from torchrl.collectors import Collector as TRLCollector
        from torchrl.data import LazyTensorStorage, ReplayBuffer as TRLReplayBuffer
        from torchrl.data.replay_buffers.samplers import SliceSampler as TRLSliceSampler
        from torchrl.envs import CatFrames as TRLCatFrames, DMControlWrapper
        from torchrl.envs import TransformedEnv as TRLTransformedEnv
        from torchrl.envs.transforms import NextStateReconstructor as TRLReconstructor
    except ImportError as err:
        return None, (f"TorchRL not importable ({err}): the peer side is missing; build "
                      ".venv-bench with benchmarks/setup_peers.sh and run with "
                      ".venv-bench/bin/python -m benchmarks.compact_obs")

    def fill_trl(compact: bool):
        torch.manual_seed(seed)
        env = DMControlWrapper(suite.load("cartpole", "swingup", task_kwargs={"random": seed}),
                               from_pixels=True, pixels_only=False,
                               render_kwargs={"height": 84, "width": 84})
        if stack > 1:
            env = TRLTransformedEnv(env, TRLCatFrames(stack, dim=-1, in_keys=["pixels"]))
        col = TRLCollector(env, None, frames_per_batch=100, total_frames=-1,
                           compact_obs=compact)
        rb = TRLReplayBuffer(storage=LazyTensorStorage(frames),
                             sampler=TRLSliceSampler(slice_len=8,
                                                     traj_key=("collector", "traj_ids")),
                             batch_size=256)
        it = iter(col)
        while len(rb) < frames:
            rb.extend(next(it))
        obs_keys = list(env.observation_spec.keys(True, True))
        col.shutdown()
        return rb, obs_keys

    plain, _ = fill_trl(False)
    compact, obs_keys = fill_trl(True)
    # TorchRL's fill value is one per transform and NaN cannot fill uint8 pixels: one
    # reconstructor for the pixels (fill 0, as tdrl's default for integer dtypes), one for the
    # float state keys (NaN)
    pix = [k for k in obs_keys if k == "pixels"]
    rest = [k for k in obs_keys if k != "pixels"]
    rebuild_pixels = TRLReconstructor(pix, fill_value=0)
    rebuild_rest = TRLReconstructor(rest)
    return (plain, compact, lambda td: rebuild_rest(rebuild_pixels(td))), None


def fill_delta(delta: bool, frames: int, seed: int = 0) -> tuple[ReplayBuffer, list]:
    """tdrl's buffer of float pixels + state, plain or through ``NextObservationDelta``, and
    the keys stored as deltas."""
    torch.manual_seed(seed)
    env = DMControlEnv("cartpole", "swingup", pixels=True, pixels_size=84)
    env = TransformedEnv(env, Compose(ToTensorImage(in_keys=["pixels"]),
                                      *([NextObservationDelta()] if delta else [])))
    env.set_seed(seed)
    col = Collector(env, None, frames_per_batch=100)
    rb = ReplayBuffer(TensorStorage(frames), batch_size=256)
    while len(rb) < frames:
        rb.extend(col.rollout().reshape(-1))
    col.shutdown()
    return rb, list(env.transform[-1].in_keys) if delta else []


def torchrl_delta_side(frames: int, seed: int = 0):
    """TorchRL's plain and ``NextObservationDelta`` buffers of the same env, and its rebuild."""
    from dm_control import suite
    from torchrl.collectors import Collector as TRLCollector
    from torchrl.data import LazyTensorStorage, ReplayBuffer as TRLReplayBuffer
    from torchrl.envs import Compose as TRLCompose, DMControlWrapper
    from torchrl.envs import TransformedEnv as TRLTransformedEnv
    from torchrl.envs.transforms import NextObservationDelta as TRLDelta, ToTensorImage as TRLToTensor

    def fill_trl(delta: bool):
        torch.manual_seed(seed)
        env = DMControlWrapper(suite.load("cartpole", "swingup", task_kwargs={"random": seed}),
                               from_pixels=True, pixels_only=False,
                               render_kwargs={"height": 84, "width": 84})
        env = TRLTransformedEnv(env, TRLCompose(TRLToTensor(in_keys=["pixels"]),
                                                *([TRLDelta()] if delta else [])))
        keys = [k for k, v in env.observation_spec.items(True, True) if v.dtype.is_floating_point]
        col = TRLCollector(env, None, frames_per_batch=100, total_frames=-1)
        rb = TRLReplayBuffer(storage=LazyTensorStorage(frames), batch_size=256)
        it = iter(col)
        while len(rb) < frames:
            rb.extend(next(it).reshape(-1))
        col.shutdown()
        return rb, keys

    plain, _ = fill_trl(False)
    packed, keys = fill_trl(True)
    return plain, packed, TRLDelta(keys)


def delta_rows(args, peer_ok: bool) -> None:
    """Bytes per transition and sample + rebuild time of the delta variant, tdrl and TorchRL."""
    (plain, _), (packed, keys) = fill_delta(False, args.frames), fill_delta(True, args.frames)
    rebuild = NextObservationDelta(keys)
    runs = {"plain": (plain, None), "delta": (packed, rebuild)}
    if peer_ok:
        p_plain, p_packed, p_rebuild = torchrl_delta_side(args.frames)
        runs.update({"trl plain": (p_plain, None), "trl delta": (p_packed, p_rebuild)})
    rounds: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.repeats):
        for name, (rb, after) in runs.items():
            rounds[name].append(sample_us(rb, after, repeats=1))
    t = {name: statistics.median(v) for name, v in rounds.items()}
    b = {name: bytes_per_item(rb) for name, (rb, _) in runs.items()}
    shape = tuple(plain[:1]["pixels"].shape[1:])
    print(f"NextObservationDelta, float32 pixels {shape} + state: plain {b['plain']:,.0f} "
          f"B/transition, delta {b['delta']:,.0f} ({b['delta'] / b['plain']:.3f} of plain); "
          f"sample 256: plain {t['plain']:,.0f} us, delta + rebuild {t['delta']:,.0f} us")
    if peer_ok:
        print(f"{'':34s}{'tdrl':>12s}{'TorchRL':>12s}{'tdrl/TorchRL':>14s}")
        for label, x, y in (("plain B/transition", b["plain"], b["trl plain"]),
                            ("delta B/transition", b["delta"], b["trl delta"]),
                            ("plain sample us", t["plain"], t["trl plain"]),
                            ("delta sample + rebuild us", t["delta"], t["trl delta"])):
            print(f"{label:34s}{x:12,.0f}{y:12,.0f}{x / y:14.3f}")
    if args.record:
        from benchmarks.records import cpu_model, write_record

        row = (f"DMC cartpole-swingup pixels float32 {shape[0]}x{shape[1]}x{shape[2]} "
               f"(ToTensorImage) + state, {args.frames} transitions ({cpu_model()})")
        figures = {"plain B": round(b["plain"]), "delta B": round(b["delta"])}
        if peer_ok:
            figures.update({"TorchRL plain B": round(b["trl plain"]),
                            "TorchRL delta B": round(b["trl delta"])})
        figures["sample + rebuild us"] = round(t["delta"])
        if peer_ok:
            figures["TorchRL sample + rebuild us"] = round(t["trl delta"])
        write_record(
            "Replay buffers", "NextObservationDelta (lossy compact) vs TorchRL 0.14.1 (issue 43)",
            row, figures, peer="TorchRL 0.14.1" if peer_ok else "plain storage",
            ratio=(f"x{b['delta'] / b['plain']:.3f} bytes of plain"
                   + (f", x{b['delta'] / b['trl delta']:.3f} bytes and x{t['delta'] / t['trl delta']:.2f} "
                      "time of TorchRL's" if peer_ok else "")),
            note="NextObservationDelta() in each side's env (float16 deltas of every float key), "
                 "each side's Collector into its replay buffer, 256 items sampled uniformly then "
                 "each side's NextObservationDelta rebuilding the next observations; CPU time per "
                 f"call, {args.repeats} interleaved rounds x 30 calls, medians, one torch thread.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=400)
    parser.add_argument("--stack", type=int, default=1, help="CatFrames over this many frames")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved timing rounds")
    parser.add_argument("--record", action="store_true", help="write benchmarks/results records")
    args = parser.parse_args()
    torch.set_num_threads(1)
    plain, keys = fill(False, args.frames, args.stack)
    compact, _ = fill(True, args.frames, args.stack)
    shape = tuple(plain[:1]["pixels"].shape[1:])
    b_plain, b_compact = bytes_per_item(plain), bytes_per_item(compact)
    rebuild = NextStateReconstructor(keys)
    peer, why = torchrl_side(args.frames, args.stack)
    if peer is None:
        print(why)
    # interleaved rounds: each round times every configuration once, medians over rounds
    runs = {"plain": (plain, None), "compact": (compact, rebuild)}
    if peer is not None:
        runs.update({"trl plain": (peer[0], None), "trl compact": (peer[1], peer[2])})
    rounds: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.repeats):
        for name, (rb, after) in runs.items():
            rounds[name].append(sample_us(rb, after, repeats=1))
    t = {name: statistics.median(v) for name, v in rounds.items()}
    t_plain, t_compact = t["plain"], t["compact"]
    ratio = b_compact / b_plain
    print(f"pixels uint8 {shape} + state obs: plain {b_plain:,.0f} B/transition, compact "
          f"{b_compact:,.0f} B/transition ({ratio:.3f} of plain); sample 32x8 slices: plain "
          f"{t_plain:,.0f} us, compact + NextStateReconstructor {t_compact:,.0f} us")
    if peer is not None:
        p_plain, p_compact = bytes_per_item(peer[0]), bytes_per_item(peer[1])
        tp_plain, tp_compact = t["trl plain"], t["trl compact"]
        print(f"{'':34s}{'tdrl':>12s}{'TorchRL':>12s}{'tdrl/TorchRL':>14s}")
        for label, a, b in (("plain B/transition", b_plain, p_plain),
                            ("compact B/transition", b_compact, p_compact),
                            ("plain sample us", t_plain, tp_plain),
                            ("compact sample + rebuild us", t_compact, tp_compact)):
            print(f"{label:34s}{a:12,.0f}{b:12,.0f}{a / b:14.3f}")
    if args.record:
        from benchmarks.records import cpu_model, write_record

        write_record(
            "Replay buffers", "Compact observations: bytes per stored transition (issue 43)",
            f"DMC cartpole-swingup pixels uint8 {shape[0]}x{shape[1]}x{shape[2]} + state, "
            f"{args.frames} transitions ({cpu_model()})",
            {"plain B": round(b_plain), "compact B": round(b_compact),
             "plain sample us": round(t_plain), "compact sample + rebuild us": round(t_compact)},
            peer="plain storage (obs and next obs)", ratio=f"x{ratio:.3f} bytes",
            note="sample: 256 items as 32 slices of 8 (SliceSampler), CPU time per call, "
                 f"median of {args.repeats} rounds x 30 calls; the compact row includes "
                 "NextStateReconstructor.")
        if peer is not None:
            write_record(
                "Replay buffers", "Compact observations vs TorchRL 0.14.1 (issue 43)",
                f"DMC cartpole-swingup pixels uint8 {shape[0]}x{shape[1]}x{shape[2]} + state, "
                f"{args.frames} transitions, compact_obs=True both sides ({cpu_model()})",
                {"compact B": round(b_compact), "TorchRL compact B": round(p_compact),
                 "plain B": round(b_plain), "TorchRL plain B": round(p_plain),
                 "sample + rebuild us": round(t_compact),
                 "TorchRL sample + rebuild us": round(tp_compact)},
                peer="TorchRL 0.14.1",
                ratio=f"x{b_compact / p_compact:.3f} bytes, x{t_compact / tp_compact:.2f} time",
                note="each side's Collector(compact_obs=True) into its replay buffer "
                     "(TorchRL: LazyTensorStorage, SliceSampler on traj_ids), 32 slices of 8 "
                     "then each side's NextStateReconstructor; CPU time per call, rounds "
                     "interleaved, medians, one torch thread; ratio tdrl/TorchRL.")
    delta_rows(args, peer is not None)


if __name__ == "__main__":
    main()
