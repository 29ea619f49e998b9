"""Seeds as one vectorised model vs the same seeds run one after another, same frames each.

    flock /tmp/tdrl-cpu.lock python -m benchmarks.seeds [--frames 16384] [--repeats 3] [--record]

PPO app (``apps/ppo/train.py``): ``n_seeds=3`` (one process, one env of 3 seed-major blocks,
actor and critic stacked over the seeds and evaluated with ``vmap``; ``tdrl.core.train.seeds``)
against three calls of the same app with ``seed=0``, ``1``, ``2`` one after another, each
``--frames`` frames per seed, on CartPole-v1 (the app's defaults: 8 envs x 32 steps, 20 epochs
of one 256-frame minibatch) and Pendulum-v1 (the same settings, ``norm_obs=false``; rewards are
scaled per seed). Figures are frames per second of every seed together: the whole ``train()``
call (env creation, training, final evaluation, files), and the training loop alone (the
``time_s`` of the last iteration in ``metrics.csv``). MARL: MAPPO and QMIX on VMAS navigation
through ``tdrl.marl.runner`` (``compare_sequential``: the same seeds vectorised, then one after
another; QMIX with BenchMARL's 1,000 optimiser steps of 128 transitions per 6,000-frame
iteration; ``--off-policy qmix,maddpg,iql,masac`` adds MADDPG / IDDPG / MASAC / ISAC / IQL at the
same sizes; ``--recurrent mappo,qmix`` adds recurrent MAPPO and QMIX, ``--rnn gru`` or ``lstm``,
hidden 64 in front of the same heads, their seeds' cells stacked and run as one batched GEMM per step,
``--recurrent-iters`` iterations, recurrent QMIX with ``--recurrent-qmix-steps`` optimiser steps a
batch since each replays whole 100-step trajectories). SAC app (``apps/sac/train.py``, Pendulum-v1): ``n_seeds=3`` against three calls
with ``seed=0``, ``1``, ``2``, ``--sac-frames`` frames per seed (learning from frame 500, one
gradient step per frame, hidden sizes ``--sac-hidden``). One torch thread; the median over
``--repeats`` interleaved rounds.
"""

from __future__ import annotations

import argparse
import csv
import logging
import statistics
import tempfile
import time
from pathlib import Path

import torch

torch.set_num_threads(1)
REPO = Path(__file__).resolve().parents[1]
SECTION, TABLE = "Vectorised seeds", "3 seeds in one process vs one after another, same frames per seed"
SEEDS = (0, 1, 2)


def _loop_seconds(out: Path) -> float:
    """The training loop's time: ``time_s`` of the last iteration row of ``metrics.csv``."""
    with open(out / "metrics.csv", newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r.get("iteration")]
    return float(rows[-1]["time_s"])


def ppo_case(ppo, env_id: str, extra: list[str], frames: int, tmp: Path, tag: str) -> dict:
    """One round: the vectorised run, then the sequential runs; seconds of each."""
    base = [f"env_id={env_id}", f"total_frames={frames}", "progress=false", "checkpoint_every=0", *extra]
    out = tmp / f"{tag}-vec"
    t0 = time.perf_counter()
    vec = ppo.train(ppo.main.load([*base, f"out={out}", f"seed={SEEDS[0]}", f"n_seeds={len(SEEDS)}"]))
    vec_s, vec_loop = time.perf_counter() - t0, _loop_seconds(out)
    seq_s = seq_loop = 0.0
    seq_returns = []
    for s in SEEDS:
        out = tmp / f"{tag}-seq{s}"
        t0 = time.perf_counter()
        res = ppo.train(ppo.main.load([*base, f"out={out}", f"seed={s}"]))
        seq_s += time.perf_counter() - t0
        seq_loop += _loop_seconds(out)
        seq_returns.append(res["eval_return"])
    return {"vec_s": vec_s, "seq_s": seq_s, "vec_loop": vec_loop, "seq_loop": seq_loop,
            "frames": frames * len(SEEDS), "vec_returns": vec["eval_return_seeds"], "seq_returns": seq_returns}


def _recurrent(rnn: str | None) -> dict:
    """The runner's recurrent settings (None: MLP networks)."""
    return {} if rnn is None else {"recurrent": True, "rnn": rnn, "rnn_hidden": 64}


def marl_case(tmp: Path, frames_per_batch: int, n_iters: int, rnn: str | None = None) -> dict:
    from tdrl.marl.runner import BenchConfig, run_benchmark

    cfg = BenchConfig(algorithms=("mappo",), tasks=("navigation",), seeds=SEEDS, num_envs=frames_per_batch // 100,
                      frames_per_batch=frames_per_batch, n_iters=n_iters, num_epochs=4, minibatch_size=400,
                      num_cells=(64, 64), eval_envs=2, eval_interval=n_iters, compare_sequential=True,
                      out_dir=str(tmp / "marl"), **_recurrent(rnn))
    sp = run_benchmark(cfg)["speedups"][0]
    return {"vec_s": sp["vectorised_s"], "seq_s": sp["sequential_s"],
            "frames": frames_per_batch * n_iters * len(SEEDS)}


def off_policy_case(tmp: Path, n_iters: int, algo: str = "qmix", rnn: str | None = None, steps: int = 1000) -> dict:
    """One round of an off-policy MARL algorithm through the runner: vectorised, then sequential."""
    from tdrl.marl.runner import BenchConfig, run_benchmark

    cfg = BenchConfig(algorithms=(algo,), tasks=("navigation",), seeds=SEEDS, num_envs=60,
                      off_policy_frames_per_batch=6000, n_iters=n_iters, n_optimizer_steps=steps,
                      off_policy_batch_size=128, num_cells=(64, 64), eval_envs=2, eval_interval=n_iters,
                      compare_sequential=True, out_dir=str(tmp / algo), **_recurrent(rnn))
    sp = run_benchmark(cfg)["speedups"][0]
    return {"vec_s": sp["vectorised_s"], "seq_s": sp["sequential_s"], "frames": 6000 * n_iters * len(SEEDS)}


def sac_case(sac, frames: int, hidden: str, tmp: Path, tag: str) -> dict:
    """One round of the SAC app: ``n_seeds=3``, then the three seeds one after another."""
    base = ["env_id=Pendulum-v1", f"total_frames={frames}", "learning_starts=500", "progress=false",
            "checkpoint_every=0", f"hidden={hidden}", "log_every=500", "eval_episodes=2"]
    t0 = time.perf_counter()
    vec = sac.train(sac.main.load([*base, f"out={tmp / f'{tag}-vec'}", f"seed={SEEDS[0]}", f"n_seeds={len(SEEDS)}"]))
    vec_s = time.perf_counter() - t0
    seq_s, seq_returns = 0.0, []
    for s in SEEDS:
        t0 = time.perf_counter()
        res = sac.train(sac.main.load([*base, f"out={tmp / f'{tag}-seq{s}'}", f"seed={s}"]))
        seq_s += time.perf_counter() - t0
        seq_returns.append(res["eval_return"])
    return {"vec_s": vec_s, "seq_s": seq_s, "frames": frames * len(SEEDS), "vec_returns": vec["eval_return_seeds"],
            "seq_returns": seq_returns}


def _fmt(x: float) -> str:
    return f"{x:,.0f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=16384, help="PPO frames per seed")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--marl-iters", type=int, default=3, help="MAPPO iterations of 6,000 frames per seed (0: skip)")
    ap.add_argument("--qmix-iters", type=int, default=2,
                    help="iterations of 6,000 frames per seed of each --off-policy algorithm (0: skip)")
    ap.add_argument("--off-policy", default="qmix",
                    help="off-policy MARL algorithms, comma-separated (qmix, vdn, maddpg, iddpg, masac, isac, iql); "
                         "their rounds are interleaved")
    ap.add_argument("--recurrent", default="mappo,qmix",
                    help="recurrent MARL algorithms, comma-separated (mappo, ippo, qmix, vdn; empty: none)")
    ap.add_argument("--rnn", default="gru", help="the recurrent cell: gru or lstm")
    ap.add_argument("--recurrent-iters", type=int, default=2, help="iterations of 6,000 frames per seed (0: skip)")
    ap.add_argument("--recurrent-qmix-steps", type=int, default=100,
                    help="optimiser steps per iteration of recurrent QMIX / VDN (128 frames of 100-step trajectories)")
    ap.add_argument("--sac-frames", type=int, default=1500, help="SAC app frames per seed (0: skip)")
    ap.add_argument("--sac-hidden", default="[256,256]", help="SAC hidden sizes (the app's default: [256,256])")
    ap.add_argument("--cases", default="CartPole-v1,Pendulum-v1", help="PPO tasks, comma-separated (empty: none)")
    ap.add_argument("--record", action="store_true", help="write the rows to benchmarks/results")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    from tdrl.core.cli import load_app

    ppo = load_app("ppo")
    extras = {"CartPole-v1": [], "Pendulum-v1": ["norm_obs=false"]}
    rows = []

    def emit(row: str, figures: dict, ratio: str) -> None:
        """Print a row and (with --record) store it at once, so a cut-short run keeps what it measured."""
        rows.append((row, figures, ratio))
        print(rows[-1], flush=True)
        if args.record:
            from benchmarks.records import write_record

            marl = "(tdrl.marl runner)" in row
            label = row.split(" (tdrl.marl runner)")[0] if marl else row.split()[0]
            note = (f"{label}: median of {args.repeats} rounds; the ratio is on the runner's wall time "
                    "(vectorised run vs the seeds one after another, evaluation included)." if marl else
                    f"{row.split()[0]}: median of {args.repeats} interleaved rounds; the ratio is on the whole train() "
                    "call" + (" (the training-loop ratio beside it)." if row.startswith("PPO") else "."))
            write_record(SECTION, TABLE, row, figures, peer="the same 3 seeds run one after another", ratio=ratio,
                         note=note)

    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for env_id in [c for c in args.cases.split(",") if c]:
            rounds = [ppo_case(ppo, env_id, extras[env_id], args.frames, tmp, f"{env_id}-{r}")
                      for r in range(args.repeats)]
            med = {k: statistics.median(r[k] for r in rounds) for k in ("vec_s", "seq_s", "vec_loop", "seq_loop")}
            fr = rounds[0]["frames"]
            ratio, loop_ratio = med["seq_s"] / med["vec_s"], med["seq_loop"] / med["vec_loop"]
            emit(*(f"PPO app, {env_id}, 3 seeds x {args.frames:,} frames (8 envs x 32 steps, 20 epochs)",
                         {"vectorised frames/s": _fmt(fr / med["vec_s"]), "sequential frames/s": _fmt(fr / med["seq_s"]),
                          "training loop only": f"{_fmt(fr / med['vec_loop'])} vs {_fmt(fr / med['seq_loop'])} "
                                                f"(x{loop_ratio:.2f})",
                          "eval return per seed (vectorised / sequential)":
                              f"{[round(x) for x in rounds[-1]['vec_returns']]} / "
                              f"{[round(x) for x in rounds[-1]['seq_returns']]}"},
                         f"x{ratio:.2f}"))
        if args.marl_iters:
            rounds = [marl_case(tmp / f"m{r}", 6000, args.marl_iters) for r in range(args.repeats)]
            vec_s = statistics.median(r["vec_s"] for r in rounds)
            seq_s = statistics.median(r["seq_s"] for r in rounds)
            fr = rounds[0]["frames"]
            emit(*(f"MAPPO (tdrl.marl runner), VMAS navigation, 3 seeds x {args.marl_iters} iterations of "
                         "6,000 frames (60 envs, 4 epochs, MLP 64x64)",
                         {"vectorised frames/s": _fmt(fr / vec_s), "sequential frames/s": _fmt(fr / seq_s),
                          "training loop only": "-", "eval return per seed (vectorised / sequential)": "-"},
                         f"x{seq_s / vec_s:.2f}"))
        algos = [a for a in args.off_policy.split(",") if a] if args.qmix_iters else []
        by_algo: dict[str, list[dict]] = {a: [] for a in algos}
        for r in range(args.repeats):  # interleaved: every algorithm once per round
            for a in algos:
                by_algo[a].append(off_policy_case(tmp / f"{a}{r}", args.qmix_iters, a))
        for algo, rounds in by_algo.items():
            vec_s = statistics.median(r["vec_s"] for r in rounds)
            seq_s = statistics.median(r["seq_s"] for r in rounds)
            fr = rounds[0]["frames"]
            emit(f"{algo.upper()} (tdrl.marl runner), VMAS navigation, 3 seeds x {args.qmix_iters} iterations of 6,000 frames "
                 "(60 envs, 1,000 steps of 128, MLP 64x64)",
                 {"vectorised frames/s": _fmt(fr / vec_s), "sequential frames/s": _fmt(fr / seq_s),
                  "training loop only": "-", "eval return per seed (vectorised / sequential)": "-"},
                 f"x{seq_s / vec_s:.2f}")
        rec = [a for a in args.recurrent.split(",") if a] if args.recurrent_iters else []
        by_rec: dict[str, list[dict]] = {a: [] for a in rec}
        for r in range(args.repeats):  # interleaved: every recurrent algorithm once per round
            for a in rec:
                by_rec[a].append(marl_case(tmp / f"r{a}{r}", 6000, args.recurrent_iters, args.rnn)
                                 if a in ("mappo", "ippo") else
                                 off_policy_case(tmp / f"r{a}{r}", args.recurrent_iters, a, args.rnn,
                                                 args.recurrent_qmix_steps))
        for algo, rounds in by_rec.items():
            vec_s = statistics.median(r["vec_s"] for r in rounds)
            seq_s = statistics.median(r["seq_s"] for r in rounds)
            fr = rounds[0]["frames"]
            shape = ("4 epochs of 4-trajectory minibatches" if algo in ("mappo", "ippo") else
                     f"{args.recurrent_qmix_steps} steps of 2 trajectories")
            emit(f"{algo.upper()} {args.rnn.upper()} (tdrl.marl runner), VMAS navigation, 3 seeds x "
                 f"{args.recurrent_iters} iterations of 6,000 frames (60 envs, {shape}, {args.rnn.upper()} 64 + "
                 "MLP 64x64)",
                 {"vectorised frames/s": _fmt(fr / vec_s), "sequential frames/s": _fmt(fr / seq_s),
                  "training loop only": "-", "eval return per seed (vectorised / sequential)": "-"},
                 f"x{seq_s / vec_s:.2f}")
        if args.sac_frames:
            sac = load_app("sac")
            rounds = [sac_case(sac, args.sac_frames, args.sac_hidden, tmp, f"sac{r}") for r in range(args.repeats)]
            vec_s = statistics.median(r["vec_s"] for r in rounds)
            seq_s = statistics.median(r["seq_s"] for r in rounds)
            fr = rounds[0]["frames"]
            emit(f"SAC app, Pendulum-v1, 3 seeds x {args.sac_frames:,} frames (learning from 500, 1 step a frame, "
                 f"batch 256, MLP {args.sac_hidden})",
                 {"vectorised frames/s": _fmt(fr / vec_s), "sequential frames/s": _fmt(fr / seq_s),
                  "training loop only": "-",
                  "eval return per seed (vectorised / sequential)":
                      f"{[round(x) for x in rounds[-1]['vec_returns']]} / "
                      f"{[round(x) for x in rounds[-1]['seq_returns']]}"},
                 f"x{seq_s / vec_s:.2f}")


if __name__ == "__main__":
    main()
