"""TorchRL's own SOTA scripts beside tdrl's ports of them, on the same seeds and budgets.

For each of ``dqn`` (``dqn/dqn_cartpole.py``, CartPole-v1), ``sac`` (``sac/sac.py``, Pendulum-v1)
and ``ppo_mujoco`` (``ppo/ppo_mujoco.py``, InvertedPendulum-v5), TorchRL's script runs in the
TorchRL interpreter (``--torchrl-python``) and tdrl's port (``apps/examples/torchrl_*``) in this
one, with the same Hydra overrides (the CI budgets of ``tests/apps/test_torchrl_sota_ports.py``
and ``test_torchrl_examples.py``), ``torch.manual_seed(seed)`` before the script and the seed in
the config where the script reads one (SAC's ``env.seed``), one torch thread, and
``logger.backend=csv``. The two sides alternate per script (TorchRL first). Printed side by side:
the evaluation return at each evaluation point and the wall time of each run (the process, imports
included), and tdrl's wall time over TorchRL's. ``--record`` writes one row per script to
``benchmarks/results/single_agent_results.jsonl``.

TorchRL's scripts are not in its wheel: ``--torchrl-scripts`` is a folder holding its
``sota-implementations`` (``dqn/``, ``sac/``, ``ppo/``), e.g. from a clone of pytorch/rl:

    git clone https://github.com/pytorch/rl /tmp/rl && python -m benchmarks.torchrl_ports --torchrl-scripts /tmp/rl/sota-implementations

Each run takes ``--lock`` (an exclusive ``flock``, default ``/tmp/tdrl-cpu.lock``; ``''``: none)
around itself, and its wall time is measured once the lock is held: do not wrap the benchmark
itself in ``flock`` on the same file (the runs would wait for it forever).

    python -m benchmarks.torchrl_ports --scripts dqn sac --seed 0 --record
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import fcntl
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

SECTION = "Single-agent results"
TABLE = "TorchRL's SOTA scripts and tdrl's ports, same seeds and budgets"
PEER = "TorchRL 0.14.1 own script"
FETCH_HINT = ("TorchRL's SOTA scripts are not in its wheel: clone them "
              "(`git clone https://github.com/pytorch/rl /tmp/rl`; the scripts of v0.14.x, e.g. commit 6e18e35b2, "
              "'[Versioning] Bump 0.14.0') and pass --torchrl-scripts /tmp/rl/sota-implementations")

# the script run as `python script.py` runs (run from its own folder, which `python -c` puts first
# on the module path, so its sibling modules import), one torch thread, torch seeded
RUNNER = ("import runpy, sys, torch; torch.set_num_threads(1); torch.manual_seed(int(sys.argv[1])); "
          "sys.argv = sys.argv[2:]; runpy.run_path(sys.argv[0], run_name='__main__')")


@dataclass(frozen=True)
class Script:
    """One SOTA script: its path in TorchRL's ``sota-implementations`` and in this repository, the
    task, the overrides both sides run with, and the config key of the seed (if it reads one)."""

    torchrl: str
    port: str
    env: str
    overrides: tuple[str, ...]
    seed_key: str | None = None


SCRIPTS = {
    "dqn": Script("dqn/dqn_cartpole.py", "apps/examples/torchrl_dqn/dqn_cartpole.py", "CartPole-v1",
                  ("collector.total_frames=20000", "collector.annealing_frames=10000",
                   "collector.init_random_frames=5000", "logger.test_interval=5000", "logger.num_test_episodes=3")),
    "sac": Script("sac/sac.py", "apps/examples/torchrl_sac/sac.py", "Pendulum-v1",
                  ("env.name=Pendulum-v1", "env.max_episode_steps=200", "collector.env_per_collector=1",
                   "collector.total_frames=8000", "collector.init_random_frames=1000",
                   # 200 (one Pendulum episode), not the test's 500: TorchRL's sac.py logs the returns of a
                   # batch's ended episodes, and its CSV logger refuses two (float() of a list)
                   "collector.frames_per_batch=200", "network.hidden_sizes=[64,64]", "optim.batch_size=128",
                   "logger.eval_iter=1000"), seed_key="env.seed"),
    "ppo_mujoco": Script("ppo/ppo_mujoco.py", "apps/examples/torchrl_ppo_mujoco/ppo_mujoco.py", "InvertedPendulum-v5",
                         ("env.env_name=InvertedPendulum-v5", "collector.total_frames=40960",
                          "logger.test_interval=8192", "logger.num_test_episodes=3")),
}


def check_inputs(torchrl_python: str, torchrl_scripts: str | None, names: list[str]) -> Path:
    """The TorchRL interpreter must exist and the scripts folder must hold each named script.

    Returns:
        The scripts folder. Raises ``SystemExit`` with what is missing and how to get it.
    """
    if not Path(torchrl_python).is_file():
        raise SystemExit(f"--torchrl-python {torchrl_python}: no such interpreter; give the python of an "
                         "environment with torchrl 0.14.x installed (e.g. /work/venvs/bench/bin/python)")
    if not torchrl_scripts:
        raise SystemExit(f"--torchrl-scripts is required. {FETCH_HINT}")
    folder = Path(torchrl_scripts)
    missing = [SCRIPTS[n].torchrl for n in names if not (folder / SCRIPTS[n].torchrl).is_file()]
    if missing:
        raise SystemExit(f"--torchrl-scripts {folder}: missing {', '.join(missing)}. {FETCH_HINT}")
    return folder


@contextlib.contextmanager
def cpu_lock(path: str):
    """An exclusive ``flock`` on ``path`` (nothing when ``path`` is empty)."""
    if not path:
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def read_evals(run_dir: Path) -> list[tuple[int, float]]:
    """``(frames, eval return)`` pairs logged by a run: tdrl's wide ``metrics.csv`` (a ``step``
    column) or TorchRL's CSV logger (``scalars/eval/reward.csv``, rows ``step,value``)."""
    for path in run_dir.rglob("metrics.csv"):
        with open(path, newline="") as f:
            return [(int(float(r["step"])), float(r["eval/reward"])) for r in csv.DictReader(f)
                    if r.get("eval/reward") not in (None, "", "nan")]
    for path in run_dir.rglob("scalars/eval/reward.csv"):
        rows = [line.split(",") for line in path.read_text().splitlines() if line.strip()]
        return [(int(float(step)), float(value)) for step, value in rows]
    return []


def run_side(python: str, script: Path, overrides: list[str], seed: int, run_dir: Path, lock: str,
             env: dict, timeout: int) -> tuple[list[tuple[int, float]], float, str | None]:
    """One script run. Returns its evaluations, its wall time (s) and an error text (None if it ran)."""
    cmd = [python, "-c", RUNNER, str(seed), str(script), *overrides, f"hydra.run.dir={run_dir}"]
    with cpu_lock(lock):
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout,
                                  cwd=script.resolve().parent)
            err = None if proc.returncode == 0 else last_error(proc.stderr)
        except subprocess.TimeoutExpired:
            err = f"no result within {timeout} s"
        secs = time.perf_counter() - t0
    return read_evals(run_dir), secs, err


def last_error(stderr: str) -> str:
    """The last line of a traceback that names an error (else the last line), shortened."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    named = [line for line in lines if "Error" in line.split(":", 1)[0] or "Exception" in line.split(":", 1)[0]]
    return ((named or lines or ["(no output)"])[-1])[:300]


def side_env(pythonpath: str | None) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", WANDB_MODE="disabled")
    env.pop("PYTHONPATH", None)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return env


def eval_frames(torchrl_evals: list[tuple[int, float]], tdrl_evals: list[tuple[int, float]]) -> str:
    """The frames of the evaluations: one list where both sides logged at the same frames,
    else each side's (so that a return is never read against the other side's frames)."""
    t, o = (" / ".join(str(f) for f, _ in e) for e in (torchrl_evals, tdrl_evals))
    return o or t if t == o or not (t and o) else f"TorchRL {t}; tdrl {o}"


def fmt_evals(evals: list[tuple[int, float]]) -> str:
    return " / ".join(f"{v:.1f}" for _, v in evals) or "-"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scripts", nargs="+", default=["dqn", "sac"], choices=sorted(SCRIPTS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--torchrl-python", default="/work/venvs/bench/bin/python",
                    help="an interpreter with torchrl 0.14.x (its scripts run there)")
    ap.add_argument("--torchrl-scripts", default=None,
                    help="a folder holding TorchRL's sota-implementations (dqn/, sac/, ppo/)")
    ap.add_argument("--lock", default="/tmp/tdrl-cpu.lock", help="flock file taken around each run ('' for none)")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per run")
    ap.add_argument("--record", action="store_true", help="write benchmarks/results/single_agent_results.jsonl")
    ap.add_argument("--results-dir", default=None, help="where --record writes (default benchmarks/results)")
    args = ap.parse_args(argv)
    folder = check_inputs(args.torchrl_python, args.torchrl_scripts, args.scripts)
    from benchmarks.records import ROOT, write_record

    ours = side_env(os.environ.get("PYTHONPATH"))
    theirs = side_env(None)  # TorchRL's script imports nothing of tdrl
    for name in args.scripts:
        spec = SCRIPTS[name]
        overrides = [*spec.overrides, "logger.backend=csv"]
        if spec.seed_key:
            overrides.append(f"{spec.seed_key}={args.seed}")
        results = {}
        with tempfile.TemporaryDirectory(prefix=f"torchrl_ports_{name}_") as tmp:
            for side, python, script, env in (("torchrl", args.torchrl_python, folder / spec.torchrl, theirs),
                                              ("tdrl", sys.executable, ROOT / spec.port, ours)):
                results[side] = run_side(python, script, overrides, args.seed, Path(tmp) / side, args.lock,
                                         env, args.timeout)
                evals, secs, err = results[side]
                print(f"[torchrl_ports] {name} {side:7s} seed {args.seed}: eval {fmt_evals(evals)} "
                      f"at frames {' / '.join(str(f) for f, _ in evals) or '-'}; {secs:.0f} s"
                      + (f"; FAILED: {err}" if err else ""), flush=True)
        (t_evals, t_secs, t_err), (o_evals, o_secs, o_err) = results["torchrl"], results["tdrl"]
        ratio = None if (t_err or o_err) else f"x{o_secs / t_secs:.2f} TorchRL's wall time"
        print(f"[torchrl_ports] {name} on {spec.env}: TorchRL {fmt_evals(t_evals)} ({t_secs:.0f} s) | "
              f"tdrl {fmt_evals(o_evals)} ({o_secs:.0f} s) | tdrl/TorchRL wall time {ratio or '-'}", flush=True)
        if not args.record:
            continue
        figures = {"task": spec.env, "seed": args.seed,
                   "eval frames": eval_frames(t_evals, o_evals),
                   "TorchRL eval return": t_err and f"did not run: {t_err}" or fmt_evals(t_evals),
                   "tdrl eval return": o_err and f"did not run: {o_err}" or fmt_evals(o_evals),
                   "TorchRL wall s": round(t_secs), "tdrl wall s": round(o_secs)}
        write_record(SECTION, TABLE, f"{name} ({spec.torchrl} vs {spec.port})", figures, peer=PEER, ratio=ratio,
                     results_dir=Path(args.results_dir) if args.results_dir else None,
                     note="Overrides of both sides: the CI budgets of tests/apps/test_torchrl_sota_ports.py and "
                          "test_torchrl_examples.py, logger.backend=csv; torch seeded before the script (SAC also "
                          "env.seed), one torch thread; TorchRL's scripts at commit 6e18e35b2 (v0.14.0 bump, "
                          "unchanged since) run on torchrl 0.14.1; wall time = the whole process, imports included. "
                          "tdrl's SAC port repeats its column exactly (its evaluation env, which sac.py never "
                          "seeds, draws its seed from torch's generator: issue 40); TorchRL's own sac.py leaves "
                          "that env to Gymnasium's OS-entropy seed, so its column moves from run to run (first "
                          "evaluation -1567.1, then -1501.6 on a rerun of the same command).")


if __name__ == "__main__":
    main()
