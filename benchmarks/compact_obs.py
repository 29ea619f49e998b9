"""Memory of the compact-observation path: bytes per stored transition, plain vs compact.

A ``Collector`` over DeepMind Control's cartpole-swingup rendering 84x84 RGB pixels (uint8,
a real render through ``DMControlEnv(pixels=True)``; ``--stack 4`` adds ``CatFrames`` along
the channels, 84x84x12) fills two ``ReplayBuffer(TensorStorage(n))``: one with the plain
batches (``observation``, ``pixels`` and ``("next", ...)`` copies of both), one with
``compact_obs=True`` batches (no ``("next", obs)``). Bytes per transition: every stored
leaf's bytes over the items stored. Also timed: sampling slices of 8 (``SliceSampler``) from
each, the compact one followed by ``NextStateReconstructor`` (what a consumer pays to get the
next observations back). One torch thread.

    python -m benchmarks.compact_obs --frames 400 --stack 4 --record
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
from tdrl.core.transforms import CatFrames, TransformedEnv  # noqa: E402


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=400)
    parser.add_argument("--stack", type=int, default=1, help="CatFrames over this many frames")
    parser.add_argument("--record", action="store_true", help="write benchmarks/results records")
    args = parser.parse_args()
    torch.set_num_threads(1)
    plain, keys = fill(False, args.frames, args.stack)
    compact, _ = fill(True, args.frames, args.stack)
    shape = tuple(plain[:1]["pixels"].shape[1:])
    b_plain, b_compact = bytes_per_item(plain), bytes_per_item(compact)
    rebuild = NextStateReconstructor(keys)
    t_plain = sample_us(plain)
    t_compact = sample_us(compact, rebuild)
    ratio = b_compact / b_plain
    print(f"pixels uint8 {shape} + state obs: plain {b_plain:,.0f} B/transition, compact "
          f"{b_compact:,.0f} B/transition ({ratio:.3f} of plain); sample 32x8 slices: plain "
          f"{t_plain:,.0f} us, compact + NextStateReconstructor {t_compact:,.0f} us")
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
                 "median of 5 rounds x 30 calls; the compact row includes NextStateReconstructor.")


if __name__ == "__main__":
    main()
