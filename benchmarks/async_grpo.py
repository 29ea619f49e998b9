"""Asynchronous GRPO (``GRPOConfig.async_generation``, one step off-policy, TIS-corrected) against
the synchronous trainer on the embedded tiny model: seconds per round and the reward curve.

Both runs: the same fresh tiny Qwen2 (``tdrl.llm.make_tiny_lm``), the arithmetic task's prompts,
the digit-fraction reward, the same seed and settings; one torch thread per thread of work.

    flock /tmp/tdrl-cpu.lock python -m benchmarks.async_grpo --steps 20 --record
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from tdrl.llm import ArithmeticTask, GRPOConfig, GRPOLossConfig, GRPOTrainer, make_tiny_lm


def digit_fraction_reward(prompts, completions, **_):
    return [sum(ch.isdigit() for ch in c) / 8.0 for c in completions]


def run(async_generation: bool, steps: int, folder: str, task):
    model, tok = make_tiny_lm(folder, task.corpus(), hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1,
                              intermediate_size=128, seed=0)
    cfg = GRPOConfig(steps=steps, prompts_per_step=8, group_size=8, max_new_tokens=8, lr=1e-2, seed=0,
                     progress=False, async_generation=async_generation, loss=GRPOLossConfig(tis_cap=2.0))
    trainer = GRPOTrainer(model, tok, [digit_fraction_reward], task.splits(256, 16, seed=0)[0], cfg)
    times, rewards = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        m = trainer.step()
        times.append(time.perf_counter() - t0)
        rewards.append(m["reward"])
    if trainer._pending is not None:
        trainer._pending.result()
    return statistics.median(times[1:]), rewards


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    task = ArithmeticTask(max_value=9)
    out = {}
    with tempfile.TemporaryDirectory() as d:
        for mode in (False, True):
            out[mode] = run(mode, args.steps, f"{d}/{mode}", task)
    for mode, (s, r) in out.items():
        print(f"async_generation={mode}: {s:.4f} s/round, reward first 5 {sum(r[:5]) / 5:.3f} last 5 {sum(r[-5:]) / 5:.3f}")
    ratio = out[False][0] / out[True][0]
    print(f"rounds/s async / sync: x{ratio:.2f}")
    if args.record:
        from benchmarks.records import write_record

        table = f"GRPO async_generation vs synchronous, tiny Qwen2 (2 layers, hidden 64), 8 prompts x 8, {args.steps} rounds"
        note = ("Median s/round, first round excluded; both sides TIS cap 2.0, same seed and settings, one run. "
                "The async side trains one step off-policy and is not bit-reproducible (thread timing).")
        for mode, name in ((False, "synchronous"), (True, "async_generation=True")):
            s, r = out[mode]
            write_record("LLM (GRPO)", table, name,
                         {"s/round": round(s, 4), "reward first 5": round(sum(r[:5]) / 5, 3),
                          "reward last 5": round(sum(r[-5:]) / 5, 3)},
                         peer="synchronous" if mode else None, ratio=f"x{ratio:.2f} rounds/s" if mode else None,
                         note=note)


if __name__ == "__main__":
    main()
