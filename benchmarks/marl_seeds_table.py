"""MARL: a benchmark of several seeds, as each library runs one by default: tdrl's runner trains
the seeds as one vectorised model (``tdrl.marl.runner``, ``vectorise_seeds=True``), BenchMARL
runs them one after another (its ``Benchmark`` runs one ``Experiment`` per seed).

The same work on both sides: every seed trains ``--iters`` x ``--frames`` frames from ``--envs``
sub-envs with the matched configs of ``marl_table.py`` (BenchMARL 1.5.2's YAML values, set
explicitly on both sides), then its final policy is evaluated on ``--eval-episodes`` episodes.
tdrl runs all seeds in one process (one env of seed-major blocks, every network stacked over
the seeds, ``marl_table.run_tdrl`` with several seeds); BenchMARL runs each seed in its own
subprocess of ``.venv-benchmarl``, as ``marl_table.py`` does. Frames/s = every seed's frames /
the training loops' wall time (BenchMARL: the sum of its seeds' loops); construction and the
final evaluations are excluded on both sides. Return: mean ± std over seeds of each seed's
evaluation return. ``marl_table.py`` holds the per-seed comparison (one tdrl seed against one
BenchMARL seed); this table is what a user running a benchmark of several seeds waits for.

Each finished pair is appended to ``--runs`` (``benchmarks/results/marl_seeds_runs.ndjson``) and
reused by a later invocation (``--fresh`` reruns it), so the table is filled in pieces.

    flock /tmp/tdrl-cpu.lock python -m benchmarks.marl_seeds_table --tasks balance navigation sampling \\
        --algorithms maddpg iddpg masac isac iql --seeds 0 1 2 --envs 30 --frames 3000 --iters 5 --record
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from benchmarks.marl import BENCHMARL_PY, MISSING_BENCHMARL
from benchmarks.records import read_keyed
from benchmarks.marl_table import (BASE_ALGORITHMS, PEER, SECTION, Budget, add_table_args, benchmarl_subprocess,
                                   checked_budget, budget_note, mean_std, row_name, run_tdrl)

TABLE = ("MARL: a benchmark of several seeds, tdrl's runner (the seeds as one vectorised model) vs BenchMARL "
         "(one seed after another)")
RUNS = Path(__file__).resolve().parent / "results" / "marl_seeds_runs.ndjson"  # not a RESULTS record (*.jsonl)


def summarise(ours: dict, theirs: list[dict]) -> dict:
    """Figures of one pair: ``ours`` is tdrl's run of every seed at once, ``theirs`` BenchMARL's
    run of each seed. Returns the row's fields and ``"ratio"`` / ``"cpu ratio"`` (tdrl's frames/s
    over BenchMARL's, wall and CPU time) and ``"own ratio"`` / ``"sim share"`` (each side's time
    outside the VMAS simulator per frame, BenchMARL's over tdrl's; the simulator's share of the
    wall time)."""
    n = len(ours["returns"])
    frames = n * ours["frames"]
    total = {k: sum(r[k] for r in theirs) for k in ("frames", "wall_s", "cpu_s", "sim_s")}
    fps, peer_fps = frames / ours["wall_s"], total["frames"] / total["wall_s"]
    own, peer_own = (ours["wall_s"] - ours["sim_s"]) / frames, (total["wall_s"] - total["sim_s"]) / total["frames"]
    return {"tdrl frames/s": round(fps), f"{PEER.split()[0]} frames/s": round(peer_fps),
            "tdrl return": mean_std(ours["returns"]), f"{PEER.split()[0]} return": mean_std([r["return"] for r in theirs]),
            "seeds": n, "ratio": fps / peer_fps,
            "cpu ratio": (frames / ours["cpu_s"]) / (total["frames"] / total["cpu_s"]),
            "own ratio": peer_own / own, "sim share": (ours["sim_s"] / ours["wall_s"], total["sim_s"] / total["wall_s"])}


def _key(task: str, algorithm: str, seeds: list[int], budget: Budget, device: str) -> str:
    return json.dumps([task, algorithm, seeds, asdict(budget), device], sort_keys=True)


def load_runs(path: Path) -> dict[str, dict]:
    """Finished pairs of earlier invocations: ``{key: {"tdrl": run, "benchmarl": [run per seed], ...}}``."""
    return read_keyed(path, lambda r: _key(r["task"], r["algorithm"], r["seeds"], Budget(**r["budget"]), r["device"]),
                        "marl_seeds_table")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_table_args(p, BASE_ALGORITHMS, [0, 1, 2], RUNS, "finished pairs")
    args = p.parse_args(argv)
    if len(set(args.seeds)) != len(args.seeds) or len(args.seeds) < 2:
        sys.exit(f"--seeds: at least two distinct seeds (a benchmark of several seeds); got {args.seeds}.")
    budget = checked_budget(args)
    if not BENCHMARL_PY.exists():
        sys.exit(f"{BENCHMARL_PY} {MISSING_BENCHMARL}")
    runs = load_runs(args.runs)
    for task in args.tasks:
        for algorithm in args.algorithms:
            key = _key(task, algorithm, args.seeds, budget, args.device)
            done = None if args.fresh else runs.get(key)
            if done is None:
                ours = run_tdrl(task, algorithm, budget, args.seeds, args.device)
                print(f"{task} {algorithm} seeds {args.seeds}: tdrl {ours}", flush=True)
                theirs = [benchmarl_subprocess(task, algorithm, budget, s, args.device) for s in args.seeds]
                print(f"{task} {algorithm}: benchmarl {theirs}", flush=True)
                done = {"task": task, "algorithm": algorithm, "seeds": args.seeds, "budget": asdict(budget),
                        "device": args.device, "tdrl": ours, "benchmarl": theirs,
                        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
                args.runs.parent.mkdir(parents=True, exist_ok=True)
                with args.runs.open("a") as f:
                    f.write(json.dumps(done) + "\n")
            else:
                print(f"{task} {algorithm} seeds {args.seeds}: reused from {args.runs}", flush=True)
            s = summarise(done["tdrl"], done["benchmarl"])
            ratio, cpu_ratio, own, share = s.pop("ratio"), s.pop("cpu ratio"), s.pop("own ratio"), s.pop("sim share")
            split = f"; simulator {share[0]:.0%} / {share[1]:.0%} of the wall time, own part {own:.2f}x"
            print(f"== {algorithm.upper()} {task}, {len(args.seeds)} seeds: {s}, {ratio:.2f}x ({cpu_ratio:.2f}x CPU)"
                  f"{split}", flush=True)
            if args.record:
                from benchmarks.records import write_record

                name = f"{row_name(task, algorithm, budget, device=args.device)}, {len(args.seeds)} seeds"
                note = (f"{len(args.seeds)} seeds per pair: tdrl trains them as one vectorised model in one process "
                        f"(its runner's default), BenchMARL one after another, each in its own process; frames/s "
                        f"counts every seed's frames over the training loops' wall time. " + budget_note(budget))
                write_record(SECTION, TABLE, name, s, peer=PEER, ratio=f"{ratio:.2f}x ({cpu_ratio:.2f}x){split}",
                             note=note, machine=f"shared 2-core CPU box, one torch thread per side, device {args.device}")


if __name__ == "__main__":
    main()
