"""MAPPO training frames/s on a VMAS task (default navigation): tdrl.marl vs BenchMARL 1.5, in one run.

Both sides train MAPPO (shared TanhNormal actor, centralised shared critic, MLP 256x256 Tanh,
clip 0.2, lambda 0.9, gamma 0.99, Adam lr 5e-5 eps 1e-6, grad-norm clip 5) on the VMAS
``--task`` with BenchMARL's task settings on both sides (``tdrl.marl.tasks``: the scenario
kwargs and episode length of BenchMARL's YAML, e.g. navigation: 3 agents, 100 steps, lidar
0.35, collisions) and the same budget: ``--envs`` vectorised envs, ``--frames`` frames per batch, ``--epochs``
passes over each batch in minibatches of ``--minibatch`` frames, ``--iters`` iterations.
Frames/s = frames / wall time of the training loop (collection + advantage + updates; env
and model construction excluded on both sides); frames/CPU-s uses the process CPU time of
the same loop (both sides run one thread, so on an idle machine the two agree; under load
from other jobs CPU time is the steadier figure). The return is the mean episode return
(sum over an episode of the agents' mean reward) of the episodes that end in the last batch.

BenchMARL runs in its own venv (``bash benchmarks/setup_benchmarl.sh``) as a subprocess of
this script (``--side benchmarl``), because it pins torchrl<0.12. Where that venv cannot be built
(the offline device machine, ``benchmarks/gpu_marl.sh``), ``TDRL_BENCHMARL_PYTHON`` (a path or a
command on PATH) launches that side instead, with ``TDRL_BENCHMARL_PYTHONPATH`` as its whole
PYTHONPATH (by default the side gets none, so this tree's tdrl / tensordict never reach it).

    flock /tmp/tdrl-cpu.lock python -m benchmarks.marl            # both sides, median of --repeats
    flock /tmp/tdrl-cpu.lock python -m benchmarks.marl --profile --frames 12000 --iters 1
                                   # where the time goes, per phase, both sides (cProfile)
    python -m benchmarks.marl --device cuda   # on a GPU machine: VMAS, networks, sampling and
                                   # training on the GPU for both sides (BenchMARL's sampling,
                                   # train and buffer devices)

On CUDA the loop's wall time ends with a ``torch.cuda.synchronize()``; frames/CPU-s then
measures the host thread only (kernel launches and Python), not the GPU.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import shutil
import statistics
import subprocess
import sys
import pstats
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.records import module_command, subprocess_env

ROOT = Path(__file__).resolve().parents[1]


def _benchmarl_python() -> Path:
    """The BenchMARL side's interpreter: ``TDRL_BENCHMARL_PYTHON`` (resolved on PATH) if set,
    else ``.venv-benchmarl``'s python; may not exist (the callers say how to make it)."""
    override = os.environ.get("TDRL_BENCHMARL_PYTHON")
    if not override:
        return ROOT / ".venv-benchmarl" / "bin" / "python"
    return Path(shutil.which(override) or override)


BENCHMARL_PY = _benchmarl_python()
MISSING_BENCHMARL = ("is missing: run `flock /tmp/tdrl-cpu.lock bash benchmarks/setup_benchmarl.sh` "
                     "(or point TDRL_BENCHMARL_PYTHON at a python with BenchMARL 1.5.2).")


def benchmarl_env() -> dict:
    """The environment of a BenchMARL-side subprocess: one thread, warnings off, and PYTHONPATH
    = the repository root (for ``-m benchmarks.<name>``; tdrl itself is not under it) and
    ``TDRL_BENCHMARL_PYTHONPATH``, never this process's path."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    env["PYTHONPATH"] = os.environ.get("TDRL_BENCHMARL_PYTHONPATH", "")
    return subprocess_env(env)


def benchmarl_task(name: str) -> dict:
    """BenchMARL's task values from ``tdrl/marl/tasks.py``, read by path (the BenchMARL venv
    has no tdrl installed; the module is plain data)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "_tdrl_marl_tasks", ROOT / "packages" / "marl" / "src" / "tdrl" / "marl" / "tasks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.vmas_task(name)


try:  # only inside .venv-benchmarl; module level so that BenchMARL can pickle it
    from benchmarl.experiment.callback import Callback as Callback
except ImportError:
    Callback = object


class _LastReturn(Callback):
    """BenchMARL callback: mean return of the episodes that end in the latest batch."""

    value = float("nan")

    def on_batch_collected(self, batch):
        done = batch.get(("next", "done")).reshape(-1)
        ep = batch.get(("next", "agents", "episode_reward")).mean(-2).reshape(-1)
        if bool(done.any()):
            _LastReturn.value = float(ep[done].mean())


# phase -> (file suffix, function) pairs whose cumulative cProfile time makes it up
_PHASES = {
    "tdrl": {
        "total (training loop)": [("tdrl/marl/loops/on_policy.py", "train_on_policy")],
        "collection": [("tdrl/core/collectors/single.py", "rollout")],  # core's Collector
        "  VMAS simulator step": [("vmas/simulator/environment/environment.py", "step")],
        "GAE (+ critic values)": [("objectives/advantage.py", "forward")],
        "loss forward (actor + critic)": [("tdrl/marl/objectives/ppo.py", "forward")],
        "backward": [("torch/_tensor.py", "backward")],
        "grad clip + Adam": [("torch/optim/adam.py", "step"), ("torch/nn/utils/clip_grad.py", "clip_grad_norm_")],
    },
    "benchmarl": {
        "total (training loop)": [("benchmarl/experiment/experiment.py", "_collection_loop")],
        "collection": [("torchrl/collectors/_single.py", "rollout")],
        "  VMAS simulator step": [("vmas/simulator/environment/environment.py", "step")],
        "GAE (+ critic values)": [("benchmarl/algorithms/mappo.py", "process_batch")],
        "loss forward (actor + critic)": [("torchrl/objectives/ppo.py", "forward")],
        "backward": [("torch/_tensor.py", "backward")],
        "grad clip + Adam": [("torch/optim/adam.py", "step"), ("torch/nn/utils/clip_grad.py", "clip_grad_norm_")],
    },
}


def _phases(prof: cProfile.Profile, side: str) -> dict:
    """Seconds per phase from a cProfile run (max over matching entries, summed over pairs)."""
    stats = pstats.Stats(prof).stats  # {(file, line, func): (cc, nc, tt, ct, callers)}
    out = {}
    for phase, pairs in _PHASES[side].items():
        out[phase] = sum(max((v[3] for (f, _, fn), v in stats.items() if f.endswith(suffix) and fn == func),
                             default=0.0) for suffix, func in pairs)
    named = sum(v for k, v in out.items() if not k.startswith(("total", "  ")))
    out["other (bookkeeping, logging, stacking)"] = out["total (training loop)"] - named
    return out


class SimulatorClock:
    """Seconds spent inside VMAS's simulator (``Environment.step`` / ``reset`` / ``reset_at`` /
    ``get_from_scenario``, the calls both tdrl's and TorchRL's VmasEnv make; outermost calls
    only), so that a side's own time is its wall time minus ``seconds``. Use as a context
    manager around the training loop; the methods are restored on exit."""

    NAMES = ("step", "reset", "reset_at", "get_from_scenario")

    def __init__(self) -> None:
        self.seconds, self._depth, self._saved = 0.0, 0, {}

    def _wrap(self, fn):
        def timed(*args, **kwargs):
            if self._depth:
                return fn(*args, **kwargs)
            self._depth += 1
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t
                self._depth -= 1
        return timed

    def __enter__(self) -> "SimulatorClock":
        from vmas.simulator.environment import Environment

        for name in self.NAMES:
            self._saved[name] = getattr(Environment, name)
            setattr(Environment, name, self._wrap(self._saved[name]))
        return self

    def __exit__(self, *exc) -> None:
        from vmas.simulator.environment import Environment

        for name, fn in self._saved.items():
            setattr(Environment, name, fn)


def sync_device(device: str) -> None:
    """Wait for queued GPU work, so that wall times cover it."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def check_device(device: str) -> None:
    """A usable ``--device``: ``cpu``, or ``cuda[:i]`` on a machine with that GPU."""
    try:
        dev = torch.device(device)
    except RuntimeError:
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        sys.exit(f"--device must be cpu or cuda[:index], got {device!r}.")
    if dev.type == "cuda" and not torch.cuda.is_available():
        sys.exit(f"--device {device}: CUDA is not available in this torch build / on this machine "
                 f"(torch {torch.__version__}); use --device cpu.")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        sys.exit(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s).")


def run_tdrl(args, seed: int) -> dict:
    from tdrl.marl.algorithms import make_mappo
    from tdrl.marl.envs import VmasEnv
    from tdrl.marl.objectives import MAPPOConfig
    from tdrl.marl.loops import TrainConfig, train_on_policy

    torch.manual_seed(seed)
    task = benchmarl_task(args.task)
    env = VmasEnv(task["scenario"], num_envs=args.envs, max_steps=task["max_steps"], seed=seed,
                  device=args.device, **task["kwargs"])
    # critic_coef 2: tdrl's "l2" is 0.5 (x - y)^2, TorchRL's (x - y)^2 (BenchMARL's critic_coef is 1)
    parts = make_mappo(env, MAPPOConfig(gamma=0.99, lmbda=0.9, critic_coef=2.0), num_cells=(256, 256))
    cfg = TrainConfig(frames_per_batch=args.frames, n_iters=args.iters, num_epochs=args.epochs,
                      minibatch_size=args.minibatch, lr=5e-5, adam_eps=1e-6, max_grad_norm=5.0,
                      eval_interval=0)
    prof = cProfile.Profile() if args.profile else None
    t0, c0 = time.perf_counter(), time.process_time()
    if prof is not None:
        prof.enable()
    hist = train_on_policy(env, parts, cfg)
    sync_device(args.device)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    out = {"frames": hist[-1]["frames"], "wall_s": wall, "cpu_s": cpu, "return": hist[-1]["train_return"]}
    if prof is not None:
        prof.disable()
        out["phases"] = _phases(prof, "tdrl")
    return out


def run_benchmarl(args, seed: int) -> dict:
    """Runs inside .venv-benchmarl: BenchMARL's Experiment with the same budget."""
    from benchmarl.algorithms import MappoConfig
    from benchmarl.environments import VmasTask
    from benchmarl.experiment import Experiment, ExperimentConfig
    from benchmarl.models.mlp import MlpConfig

    cfg = ExperimentConfig.get_from_yaml()
    cfg.sampling_device = cfg.train_device = cfg.buffer_device = args.device
    cfg.on_policy_collected_frames_per_batch = args.frames
    cfg.on_policy_n_envs_per_worker = args.envs
    cfg.on_policy_n_minibatch_iters = args.epochs
    cfg.on_policy_minibatch_size = args.minibatch
    cfg.max_n_iters, cfg.max_n_frames = args.iters, None
    cfg.evaluation, cfg.render, cfg.loggers, cfg.create_json = False, False, [], False
    cfg.checkpoint_interval, cfg.checkpoint_at_end = 0, False
    cfg.save_folder = tempfile.mkdtemp(prefix="benchmarl_")
    values = benchmarl_task(args.task)
    task = VmasTask[args.task.upper()].get_from_yaml()
    task.config.update({"max_steps": values["max_steps"], **values["kwargs"]})
    exp = Experiment(task=task, algorithm_config=MappoConfig.get_from_yaml(),
                     model_config=MlpConfig.get_from_yaml(), critic_model_config=MlpConfig.get_from_yaml(),
                     seed=seed, config=cfg, callbacks=[_LastReturn()])
    prof = cProfile.Profile() if args.profile else None
    t0, c0 = time.perf_counter(), time.process_time()
    if prof is not None:
        prof.enable()
    exp.run()
    sync_device(args.device)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    out = {"frames": exp.total_frames, "wall_s": wall, "cpu_s": cpu, "return": _LastReturn.value}
    if prof is not None:
        prof.disable()
        out["phases"] = _phases(prof, "benchmarl")
    return out


def _benchmarl_subprocess(args, seed: int) -> dict:
    cmd = module_command(BENCHMARL_PY, __spec__.name, "--side", "benchmarl", "--seed", seed,
                         "--envs", args.envs, "--frames", args.frames, "--epochs", args.epochs,
                         "--minibatch", args.minibatch, "--iters", args.iters, "--device", args.device,
                         "--task", args.task)
    cmd += ["--profile"] if args.profile else []
    out = subprocess.run(cmd, capture_output=True, text=True, env=benchmarl_env(), cwd=tempfile.gettempdir())
    if out.returncode != 0:
        raise RuntimeError(f"BenchMARL side failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--side", choices=["both", "tdrl", "benchmarl"], default="both")
    p.add_argument("--task", default="navigation",
                   help="a BenchMARL VMAS task (tdrl.marl.tasks): balance, navigation, sampling, transport, wheel")
    p.add_argument("--envs", type=int, default=600)
    p.add_argument("--frames", type=int, default=60_000)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--minibatch", type=int, default=6000)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile", action="store_true", help="one run per side under cProfile: time per phase")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:index]: VMAS, networks and training, both sides")
    args = p.parse_args(argv)
    check_device(args.device)
    try:
        n_agents = benchmarl_task(args.task)["kwargs"]["n_agents"]
    except KeyError as err:
        sys.exit(f"--task: {err.args[0]}")
    torch.set_num_threads(1)
    if args.side == "benchmarl":
        print(json.dumps(run_benchmarl(args, args.seed)))
        return
    if args.side == "tdrl":
        print(json.dumps(run_tdrl(args, args.seed)))
        return
    if not BENCHMARL_PY.exists():
        sys.exit(f"{BENCHMARL_PY} {MISSING_BENCHMARL}")
    if args.profile:
        _print_profile(args)
        return
    ours, theirs = [], []
    for r in range(args.repeats):  # interleave the sides so that load changes hit both
        ours.append(run_tdrl(args, args.seed + r))
        theirs.append(_benchmarl_subprocess(args, args.seed + r))
        print(f"repeat {r}: tdrl {ours[-1]}  benchmarl {theirs[-1]}", flush=True)
    fps = lambda runs, k="wall_s": statistics.median(x["frames"] / x[k] for x in runs)  # noqa: E731
    ret = lambda runs: statistics.median(x["return"] for x in runs)  # noqa: E731
    print(f"\nMAPPO, VMAS {args.task}, {args.envs} envs x {n_agents} agents, {args.frames} frames/batch, "
          f"{args.epochs} epochs x minibatch {args.minibatch}, {args.iters} iters, median of {args.repeats}, "
          f"device {args.device}")
    print(f"{'':12s}{'frames/s':>12s}{'frames/CPU-s':>14s}{'return (last batch)':>22s}")
    print(f"{'tdrl':12s}{fps(ours):12.0f}{fps(ours, 'cpu_s'):14.0f}{ret(ours):22.3f}")
    print(f"{'BenchMARL':12s}{fps(theirs):12.0f}{fps(theirs, 'cpu_s'):14.0f}{ret(theirs):22.3f}")
    print(f"speed-up tdrl / BenchMARL: {fps(ours) / fps(theirs):.2f}x wall clock, "
          f"{fps(ours, 'cpu_s') / fps(theirs, 'cpu_s'):.2f}x CPU time (less sensitive to other load)")


def _print_profile(args) -> None:
    run_tdrl(args, args.seed)  # warm-up (first-call costs), not profiled
    ours = run_tdrl(args, args.seed)
    theirs = _benchmarl_subprocess(args, args.seed)
    mb = args.frames // args.minibatch * args.epochs * args.iters
    print(f"\nPer-phase seconds (cProfile cumulative), {args.envs} envs, {args.frames} frames/batch, "
          f"{args.iters} iter(s), {mb} minibatches of {args.minibatch} frames")
    print(f"{'phase':40s}{'tdrl':>10s}{'BenchMARL':>12s}")
    for k in ours["phases"]:
        print(f"{k:40s}{ours['phases'][k]:10.3f}{theirs['phases'][k]:12.3f}")
    print(f"{'wall (unprofiled clock, same run)':40s}{ours['wall_s']:10.3f}{theirs['wall_s']:12.3f}")


if __name__ == "__main__":
    main()
