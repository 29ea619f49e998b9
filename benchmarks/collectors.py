"""Collector speed on Pendulum-v1: tdrl vs TorchRL 0.14 vs a hand-written gymnasium loop.

Run with the peers' venv (it has TorchRL and tdrl installed):

    flock /tmp/tdrl-cpu.lock .venv-bench/bin/python -m benchmarks.collectors

Cases (issue 3): one Gymnasium ``Pendulum-v1`` env, and 8 envs batched (Gymnasium's sync
vector env), driven by the same small MLP policy (3 -> 64 -> 64 -> 1, tanh) wrapped in a
``TensorDictModule``. The hand-written loop calls the same network on
``torch.as_tensor(obs)`` and resets on termination/truncation: the practical limit. An
extra row shows tdrl's batched torch ``PendulumEnv`` (no Gymnasium at all).

Figures are frames per CPU second of this process (``time.process_time``, less inflated
by other jobs on the shared machine), median over ``--repeats`` rounds; in each round
every contender collects ``--batches`` batches, interleaved. One torch thread.
"""

from __future__ import annotations

import argparse
import statistics
import time

import gymnasium as gym
import torch
from tensordict.nn import TensorDictModule

from tdrl.core.collectors import Collector
from tdrl.core.envs import GymEnv, PendulumEnv

torch.set_num_threads(1)


def make_net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64),
                               torch.nn.Tanh(), torch.nn.Linear(64, 1))


def fps(run, frames: int) -> float:
    start = time.process_time()
    run()
    return frames / (time.process_time() - start)


def iterate(collector, batches: int):
    it = iter(collector)

    def run():
        for _ in range(batches):
            next(it)

    return run


def gym_loop(net, num_envs: int | None, steps: int):
    """The same policy in a plain gymnasium loop (vector env when num_envs is given)."""
    env = (gym.make("Pendulum-v1") if num_envs is None
           else gym.make_vec("Pendulum-v1", num_envs=num_envs, vectorization_mode="sync"))
    state = {"obs": env.reset(seed=0)[0]}

    def run():
        obs = state["obs"]
        with torch.no_grad():
            for _ in range(steps):
                action = net(torch.as_tensor(obs)).numpy()
                obs, reward, term, trunc, _ = env.step(action)
                if num_envs is None and (term or trunc):
                    obs, _ = env.reset()
        state["obs"] = obs

    return run


def torchrl_collector(net, num_envs: int | None, frames_per_batch: int):
    try:
        from torchrl.collectors import Collector as TRLCollector
        from torchrl.envs import GymEnv as TRLGymEnv
    except ImportError as err:
        return None, f"TorchRL not importable ({err}); run with .venv-bench/bin/python"
    kwargs = {} if num_envs is None else {"num_envs": num_envs}
    env = TRLGymEnv("Pendulum-v1", **kwargs)
    policy = TensorDictModule(net, ["observation"], ["action"])
    return TRLCollector(env, policy, frames_per_batch=frames_per_batch, total_frames=-1), None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--batches", type=int, default=3)
    args = ap.parse_args()
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, gymnasium "
          f"{gym.__version__}; frames per CPU second, median of {args.repeats} rounds")
    net = make_net()
    policy = TensorDictModule(net, ["observation"], ["action"])
    for num_envs, fpb in ((None, 1000), (8, 1024)):
        steps = fpb // (num_envs or 1)
        frames = fpb * args.batches
        name = "1 env" if num_envs is None else f"{num_envs} envs"
        kwargs = {} if num_envs is None else {"num_envs": num_envs}
        ours = Collector(GymEnv("Pendulum-v1", **kwargs), policy, frames_per_batch=fpb)
        torch_env = Collector(PendulumEnv(batch_size=() if num_envs is None else (num_envs,)),
                              policy, frames_per_batch=fpb)
        peer, why = torchrl_collector(net, num_envs, fpb)
        runs = {"tdrl": iterate(ours, args.batches),
                "gym loop": gym_loop(net, num_envs, steps * args.batches),
                "tdrl torch Pendulum": iterate(torch_env, args.batches)}
        if peer is not None:
            runs["TorchRL"] = iterate(peer, args.batches)
        for run in runs.values():  # warm-up
            run()
        res = {k: [] for k in runs}
        for _ in range(args.repeats):
            for k, run in runs.items():
                res[k].append(fps(run, frames))
        med = {k: statistics.median(v) for k, v in res.items()}
        line = f"Pendulum-v1 {name:<7} tdrl {med['tdrl']:8.0f} f/s"
        if "TorchRL" in med:
            line += f" | TorchRL {med['TorchRL']:8.0f} f/s (x{med['tdrl'] / med['TorchRL']:.2f})"
        else:
            line += f" | TorchRL n/a ({why})"
        line += f" | gym loop {med['gym loop']:8.0f} f/s (x{med['tdrl'] / med['gym loop']:.2f})"
        print(line)
        print(f"  tdrl torch PendulumEnv {name}: {med['tdrl torch Pendulum']:8.0f} f/s")
        if peer is not None:
            peer.shutdown()
        ours.shutdown()


if __name__ == "__main__":
    main()
