"""Brax wrapper benchmark (not named brax.py: it would shadow the package): ``BraxEnv`` per-step cost vs raw Brax, side by side, one run.

For each environment (``inverted_pendulum``, ``ant``; the ``spring`` pipeline) and batch (8,
64), one XLA thread and one torch thread, the same pre-drawn actions on both sides:

- ``raw``: Brax's own ``envs.create(name, batch_size=B, auto_reset=False)`` stepped by
  ``jax.jit(env.step)`` with JAX actions, waiting for each step's observation (a policy
  needs it before the next action);
- ``tdrl``: ``BraxEnv.step(td)`` with torch actions written into the TensorDict (the action
  handed to JAX as a numpy view, the step, the packed outputs copied into a row of
  preallocated torch tensors, the TensorDict);
- ``raw + torch interop``: raw's step with the torch action passed as numpy and the
  observation, reward and done turned into torch tensors with ``torch.from_dlpack`` (what a
  torch user of raw Brax writes; context, not the target);
- with resets: ``raw auto-reset`` (``envs.create(..., auto_reset=True)``: Brax resets done
  sub-envs inside its step and reports the reset state as the step's) against ``tdrl
  step_and_maybe_reset`` (the real last transition kept, the done sub-envs reset for the next
  root, in one jitted call).

Target: tdrl <= 1.1x raw. Figures: the median over ``--repeats`` interleaved blocks of
``--steps`` steps; compilation is excluded (both sides step once before timing).

    flock /tmp/tdrl-cpu.lock python -m benchmarks.brax_step --record
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
warnings.filterwarnings("ignore")

import torch  # noqa: E402

torch.set_num_threads(1)

ENVS = ("inverted_pendulum", "ant")
BATCHES = (8, 64)


def _time(fn, steps: int) -> float:
    start = time.perf_counter()
    fn(steps)
    return (time.perf_counter() - start) / steps * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--envs", nargs="+", default=list(ENVS))
    parser.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args()

    import brax
    import jax
    import jax.numpy as jnp
    from brax import envs

    from tdrl.core.envs.brax import BraxEnv

    results = {}
    print(f"{'env':>18} {'B':>4} {'raw us/step':>12} {'tdrl us/step':>13} {'ratio':>7}")
    for name in args.envs:
        for batch in args.batches:
            raw_env = envs.create(name, backend="spring", batch_size=batch, auto_reset=False)
            raw_step = jax.jit(raw_env.step)
            ours = BraxEnv(name, num_envs=batch, backend="spring", seed=0)
            g = torch.Generator().manual_seed(0)
            actions = torch.rand(args.steps, batch, ours.action_spec.shape[-1], generator=g) * 2 - 1
            jax_actions = [jnp.asarray(a.numpy()) for a in actions]
            auto_env = envs.create(name, backend="spring", batch_size=batch, auto_reset=True)
            auto_step = jax.jit(auto_env.step)
            ours_reset = BraxEnv(name, num_envs=batch, backend="spring", seed=0)
            state = {"raw": jax.jit(raw_env.reset)(jax.random.PRNGKey(0)),  # split into B by create()
                     "auto": jax.jit(auto_env.reset)(jax.random.PRNGKey(0))}
            td, root = ours.reset(), ours_reset.reset()

            def raw_auto(steps):
                s = state["auto"]
                for t in range(steps):
                    s = auto_step(s, jax_actions[t])
                    s.obs.block_until_ready()
                state["auto"] = s

            def tdrl_reset(steps):
                nonlocal root
                for t in range(steps):
                    root["action"] = actions[t]
                    _, root = ours_reset.step_and_maybe_reset(root)

            def raw(steps):
                s = state["raw"]
                for t in range(steps):
                    s = raw_step(s, jax_actions[t])
                    s.obs.block_until_ready()
                state["raw"] = s

            def raw_torch(steps):
                # what a torch user of raw Brax writes: torch actions in through numpy, the
                # step's observation, reward and done out through DLPack
                s = state["raw"]
                for t in range(steps):
                    s = raw_step(s, actions[t].numpy())
                    torch.from_dlpack(s.obs), torch.from_dlpack(s.reward), torch.from_dlpack(s.done)
                state["raw"] = s

            def tdrl(steps):
                nonlocal td
                for t in range(steps):
                    td["action"] = actions[t]
                    td = ours.step(td)["next"]

            sides = {"raw": raw, "tdrl": tdrl, "raw auto-reset": raw_auto, "tdrl reset": tdrl_reset,
                     "raw torch": raw_torch}
            for fn in sides.values():
                fn(2)  # compile
            times = {k: [] for k in sides}
            for _ in range(args.repeats):
                for k, fn in sides.items():
                    times[k].append(_time(fn, args.steps))
            us = {k: statistics.median(v) for k, v in times.items()}
            results[(name, batch)] = us
            print(f"{name:>18} {batch:>4} {us['raw']:>12.1f} {us['tdrl']:>13.1f} "
                  f"{us['tdrl'] / us['raw']:>6.2f}x | with resets: raw auto-reset {us['raw auto-reset']:.1f}, "
                  f"tdrl step_and_maybe_reset {us['tdrl reset']:.1f} "
                  f"({us['tdrl reset'] / us['raw auto-reset']:.2f}x) | raw + torch interop "
                  f"{us['raw torch']:.1f} ({us['tdrl'] / us['raw torch']:.2f}x)")  # fmt: skip
    if args.record:
        from benchmarks.records import cpu_model, write_record

        load = os.getloadavg()[0]
        for (name, batch), us in results.items():
            ratio = us["tdrl"] / us["raw"]
            write_record(
                "Environments", "BraxEnv vs raw Brax (spring pipeline, one XLA thread)",
                f"{name}, batch {batch}",
                {"tdrl us/step": round(us["tdrl"], 1), "raw us/step": round(us["raw"], 1),
                 "tdrl step_and_maybe_reset us/step": round(us["tdrl reset"], 1),
                 "raw auto-reset us/step": round(us["raw auto-reset"], 1),
                 "raw + torch interop us/step": round(us["raw torch"], 1)},
                peer=f"brax {brax.__version__} (jax {jax.__version__}), same actions; raw = "
                "jit(env.step) of envs.create(auto_reset=False), waiting for each observation",
                ratio=f"{ratio:.2f}x raw (target <= 1.1x: {'met' if ratio <= 1.1 else 'missed'}); "
                      f"with resets {us['tdrl reset'] / us['raw auto-reset']:.2f}x raw auto-reset; "
                      f"{us['tdrl'] / us['raw torch']:.2f}x raw + torch interop",
                machine=f"shared 2-core CPU box ({cpu_model()}), load {load:.1f}, one torch thread",
                note=f"Median of {args.repeats} interleaved repeats of {args.steps} steps; "
                "compilation excluded. Random actions: inverted_pendulum's episodes end within a "
                "few steps, so the reset columns reset sub-envs most steps; raw auto-reset records "
                "Brax's reset state as the finished step's outcome and restores the episode's first "
                "state (no new draw), tdrl keeps the real last transition and draws fresh initial "
                "states (a reset computation inside the jitted step). Raw + torch interop: raw's "
                "step with the torch action handed in as numpy and the observation, reward and "
                "done taken out with torch.from_dlpack, what a torch user of raw Brax writes. "
                "The wrapper's own work (TensorDict, action to numpy, the output copy) is ~16 us "
                "a step when hot but 40-80 us right after an XLA step (cold caches; measured "
                "2026-12-04, inverted_pendulum, batch 8). Since 2026-12-06 tdrl's jitted step "
                "takes the state as one array per dtype instead of its 29 (inverted_pendulum) / "
                "48 (ant) leaves, each of which cost the XLA CPU dispatch time (jitted step alone "
                "at inverted_pendulum, batch 8: 354-361 -> 227-269 us; raw's 390-435 us); the "
                "last record with the leaves (2026-12-04, AMD EPYC box) was 1.19x / 1.15x raw at "
                "inverted_pendulum 8 / 64 and 1.00x / 1.09x at ant.",
            )


if __name__ == "__main__":
    main()
