"""Environment benchmarks: tdrl vs raw Gymnasium vs TorchRL, side by side, in one run.

1. Stepping by hand (HalfCheetah-v5, Pendulum-v1, CartPole-v1), per step: ``env.step(td)``
   and a user's loop ``td["action"] = a; td, td = env.step_and_maybe_reset(td)`` vs the same
   raw gymnasium env fed the same actions (reset when done), raw gymnasium with torch tensors
   in and out (the floor of any torch wrapper), and TorchRL's ``GymEnv`` in the same run.
   Target: the loop <= 1.1x raw on HalfCheetah-v5. ``--record`` writes the rows.
2. ``ParallelEnv`` of 8 CPU envs: frames/s vs ``gymnasium.vector.AsyncVectorEnv`` (and
   TorchRL's ``ParallelEnv`` when installed). Target: at least AsyncVectorEnv's.
3. Batched torch ``PendulumEnv`` at batch 4096: env-steps/s vs the same env at batch 1
   stepped 4096 times.

Every figure is the median over ``--repeats`` interleaved blocks, one torch thread.
Run (peers live in .venv-bench):

    flock /tmp/tdrl-cpu.lock .venv-bench/bin/python -m benchmarks.envs
    flock /tmp/tdrl-cpu.lock .venv-bench/bin/python -m benchmarks.envs --only wrapper --repeats 9 --record
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
import warnings

import numpy as np
import torch

warnings.filterwarnings("ignore")
torch.set_num_threads(1)

HAS_TORCHRL = importlib.util.find_spec("torchrl") is not None


def _median_per_step(blocks: list[float], steps: int) -> float:
    return statistics.median(blocks) / steps


def _row(name: str, ours: float, peers: dict[str, float | None], unit: str = "us/step") -> None:
    parts = [f"{name:<34} tdrl {ours:9.2f} {unit}"]
    for peer, val in peers.items():
        if val is None:
            parts.append(f"{peer} n/a")
        else:
            parts.append(f"{peer} {val:9.2f} {unit} (tdrl/{peer} = {ours / val:5.2f}x)")
    print(" | ".join(parts), flush=True)


# ---------------------------------------------------------------------------- 1. by hand
BY_HAND_TABLE = "Stepping by hand: GymEnv vs raw Gymnasium and TorchRL"


def bench_wrapper(env_id: str, steps: int, repeats: int) -> dict:
    """Stepping by hand, per step: (a) ``env.step(td)`` on fresh TensorDicts, (b) a user's loop
    ``td["action"] = a; td, td = env.step_and_maybe_reset(td)``, against raw gymnasium fed the
    same actions (``obs, r, term, trunc, info = e.step(a)``, ``e.reset()`` when done), raw
    gymnasium with torch in and out (the action tensor's ``.numpy()``, ``torch.from_numpy`` of
    the observation: the floor of any torch wrapper), and TorchRL's ``GymEnv`` when installed.

    Returns:
        ``{"step" | "loop": {side: us per step}}``.
    """
    import gymnasium as gym
    from tensordict import TensorDict

    from tdrl.core import GymEnv

    raw = gym.make(env_id)
    ours = GymEnv(env_id, categorical_action_encoding=False)
    trl = None
    if HAS_TORCHRL:
        from torchrl.envs import GymEnv as TorchRLGymEnv

        trl = TorchRLGymEnv(env_id)
    rng = np.random.default_rng(0)
    space = raw.action_space
    if isinstance(space, gym.spaces.Discrete):
        idx = rng.integers(0, space.n, steps)
        raw_actions = [int(i) for i in idx]
        actions = list(torch.nn.functional.one_hot(torch.as_tensor(idx), space.n))
    else:
        arr = rng.uniform(space.low, space.high, (steps, *space.shape)).astype(space.dtype)
        raw_actions = list(arr)
        actions = [torch.from_numpy(a) for a in arr]
    our_tds = [TensorDict({"action": a}, []) for a in actions]
    trl_tds = [TensorDict({"action": a}, []) for a in actions]

    # HalfCheetah never terminates and truncates at step 1000: with steps <= 1000 the bare
    # step needs no done check, so its figure is the pure step cost. Other tasks check done
    # after every step on every side (TensorDict lookups make that check cost more for
    # tdrl and TorchRL than a Python bool does for raw gymnasium).
    check = not (env_id.startswith("HalfCheetah") and steps <= 1000)

    def run_raw() -> float:
        raw.reset(seed=0)
        t = time.perf_counter()
        for a in raw_actions:
            obs, r, term, trunc, info = raw.step(a)
            if term or trunc:
                obs, info = raw.reset()
        return time.perf_counter() - t

    def run_raw_torch() -> float:  # raw, with torch tensors in and out
        raw.reset(seed=0)
        t = time.perf_counter()
        for a in actions:
            obs, r, term, trunc, info = raw.step(a.numpy() if a.dtype.is_floating_point else int(a.numpy().argmax()))
            obs = torch.from_numpy(obs)
            if term or trunc:
                obs, info = raw.reset()
        return time.perf_counter() - t

    def run_step(env, tds) -> float:  # (a) env.step(td)
        env.reset()
        for td in tds:  # fresh inputs: no "next" left from the previous repeat
            td.pop("next", None)
        t = time.perf_counter()
        for td in tds:
            env.step(td)
            if check and td.get("next").get("done").item():
                env.reset()
        return time.perf_counter() - t

    def run_loop(env) -> float:  # (b) the user's loop: step_and_maybe_reset
        td = env.reset()
        t = time.perf_counter()
        for a in actions:
            td["action"] = a
            td, td = env.step_and_maybe_reset(td)
        return time.perf_counter() - t

    step = {"raw": [], "raw + torch": [], "tdrl": [], "torchrl": []}
    loop = {"raw": [], "raw + torch": [], "tdrl": [], "torchrl": []}
    for _ in range(repeats):  # interleaved: every side sees the same load
        step["raw"].append(run_raw())
        step["raw + torch"].append(run_raw_torch())
        step["tdrl"].append(run_step(ours, our_tds))
        loop["tdrl"].append(run_loop(ours))
        if trl is not None:
            step["torchrl"].append(run_step(trl, trl_tds))
            loop["torchrl"].append(run_loop(trl))
    loop["raw"], loop["raw + torch"] = step["raw"], step["raw + torch"]  # the same raw loop
    out = {}
    for name, res in (("step", step), ("loop", loop)):
        us = out[name] = {k: _median_per_step(v, steps) * 1e6 if v else None for k, v in res.items()}
        label = f"env.step(td) {env_id}" if name == "step" else f"step_and_maybe_reset loop {env_id}"
        _row(label, us["tdrl"], {"raw gymnasium": us["raw"], "raw + torch": us["raw + torch"],
                                 "TorchRL": us["torchrl"]})
    return out


def _record_by_hand(results: dict, args) -> None:
    """The rows of :data:`BY_HAND_TABLE` (``--record``)."""
    import os

    import shlex

    from benchmarks.records import cpu_model, remove_records, this_command, write_record

    load = os.getloadavg()[0]
    words = shlex.split(this_command())  # the command without the note's text
    if "--note" in words:
        i = words.index("--note")
        words[i:i + 2] = ["--note", "..."]
    command = shlex.join(words)
    remove_records("Environments", "GymEnv.step vs raw Gymnasium and TorchRL")  # superseded
    for env_id, res in results.items():
        for name, us in res.items():
            what = "env.step(td)" if name == "step" else "td, td = env.step_and_maybe_reset(td) loop"
            ratio = us["tdrl"] / us["raw"]
            text = f"{ratio:.2f}x raw"
            if name == "loop":
                text += f" (target <= 1.1x: {'met' if ratio <= 1.1 else 'missed'})"
            text += f"; {us['raw + torch'] / us['raw']:.2f}x raw for raw + torch"
            if us["torchrl"]:
                text += f"; {us['tdrl'] / us['torchrl']:.2f}x TorchRL"
            figures = {"tdrl us/step": round(us["tdrl"], 1), "raw us/step": round(us["raw"], 1),
                       "raw + torch us/step": round(us["raw + torch"], 1),
                       "TorchRL us/step": round(us["torchrl"], 1) if us["torchrl"] else "n/a",
                       "tdrl / raw": f"{ratio:.2f}x"}
            write_record(
                "Environments", BY_HAND_TABLE, f"{what}, {env_id}", figures,
                peer="raw gymnasium 1.4, same actions (reset when done); TorchRL 0.14.1 GymEnv",
                ratio=text, command=command,
                machine=f"shared 2-core CPU box ({cpu_model()}), load {load:.1f}, one torch thread",
                note=args.note or None,
            )


# ---------------------------------------------------------------------------- 2. parallel
def _cheetah():
    from tdrl.core import GymEnv

    return GymEnv("HalfCheetah-v5")


def _raw_cheetah():
    import gymnasium as gym

    return gym.make("HalfCheetah-v5")


def bench_parallel(n: int, steps: int, repeats: int) -> None:
    import gymnasium as gym

    from tdrl.core import ParallelEnv

    acts = np.random.default_rng(0).uniform(-1, 1, (steps, n, 6)).astype(np.float32)
    tacts = torch.from_numpy(acts)
    ours = ParallelEnv(n, _cheetah)
    peer = gym.vector.AsyncVectorEnv([_raw_cheetah] * n)
    trl = None
    if HAS_TORCHRL:
        from torchrl.envs import GymEnv as TorchRLGymEnv
        from torchrl.envs import ParallelEnv as TorchRLParallelEnv

        trl = TorchRLParallelEnv(n, lambda: TorchRLGymEnv("HalfCheetah-v5"))

    def run_ours(env) -> float:
        td = env.reset()
        t = time.perf_counter()
        for i in range(steps):
            td["action"] = tacts[i]
            _, td = env.step_and_maybe_reset(td)
        return time.perf_counter() - t

    def run_peer() -> float:
        peer.reset(seed=0)
        t = time.perf_counter()
        for i in range(steps):
            peer.step(acts[i])
        return time.perf_counter() - t

    res = {"tdrl": [], "async": [], "torchrl": []}
    for _ in range(repeats):
        res["tdrl"].append(run_ours(ours))
        res["async"].append(run_peer())
        if trl is not None:
            res["torchrl"].append(run_ours(trl))
    fps = {k: n * steps / statistics.median(v) if v else None for k, v in res.items()}
    parts = [f"{'ParallelEnv x' + str(n) + ' HalfCheetah-v5':<34} tdrl {fps['tdrl']:9.0f} frames/s"]
    parts.append(f"AsyncVectorEnv {fps['async']:9.0f} frames/s (tdrl/async = "
                 f"{fps['tdrl'] / fps['async']:5.2f}x)")
    if fps["torchrl"]:
        parts.append(f"TorchRL ParallelEnv {fps['torchrl']:9.0f} frames/s (tdrl/TorchRL = "
                     f"{fps['tdrl'] / fps['torchrl']:5.2f}x)")
    print(" | ".join(parts), flush=True)
    ours.close()
    peer.close()
    if trl is not None:
        trl.close()


# ---------------------------------------------------------------------------- 3. pendulum
def bench_pendulum(batch: int, steps: int, single_steps: int, repeats: int) -> None:
    from tdrl.core import PendulumEnv

    big = PendulumEnv((batch,), max_episode_steps=None)
    one = PendulumEnv((), max_episode_steps=None)

    def run(env, n) -> float:
        td = env.reset()
        td["action"] = torch.zeros(*env.batch_size, 1)
        t = time.perf_counter()
        for _ in range(n):
            td = env.step(td)["next"].exclude("reward")
            td["action"] = torch.zeros(*env.batch_size, 1)
        return time.perf_counter() - t

    b_times, s_times = [], []
    for _ in range(repeats):
        b_times.append(run(big, steps))
        s_times.append(run(one, single_steps))
    batched = batch * steps / statistics.median(b_times)
    single = single_steps / statistics.median(s_times)
    print(f"{'PendulumEnv batch ' + str(batch):<34} tdrl {batched:12.0f} env-steps/s | "
          f"batch 1 x {batch} loops {single:9.0f} env-steps/s (batched/looped = "
          f"{batched / single:6.1f}x)", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--parallel-steps", type=int, default=300)
    p.add_argument("--only", choices=["wrapper", "parallel", "pendulum"], default=None)
    p.add_argument("--env", default=None, help="by-hand benchmark on this env id only")
    p.add_argument("--record", action="store_true", help="write the by-hand rows to benchmarks/results")
    p.add_argument("--note", default="", help="a sentence stored with the recorded rows")
    args = p.parse_args()
    print(f"torch {torch.__version__}, 1 thread; TorchRL installed: {HAS_TORCHRL}; "
          f"median of {args.repeats} interleaved repeats", flush=True)
    if args.only in (None, "wrapper"):
        results = {env_id: bench_wrapper(env_id, args.steps, args.repeats)
                   for env_id in ([args.env] if args.env else ["HalfCheetah-v5", "Pendulum-v1", "CartPole-v1"])}
        if args.record:
            _record_by_hand(results, args)
    if args.only in (None, "parallel"):
        bench_parallel(8, args.parallel_steps, max(3, args.repeats // 2))
    if args.only in (None, "pendulum"):
        bench_pendulum(4096, 100, 2000, args.repeats)


if __name__ == "__main__":
    main()
