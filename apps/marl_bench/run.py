"""MARL benchmark: algorithms x tasks x seeds on VMAS -> results.md, evaluations.csv, PNG curves.

Every field of :class:`tdrl.marl.runner.BenchConfig` (BenchMARL's experiment settings and
task configs) is a ``key=value`` setting, beside the run-folder settings every app shares:

    python apps/marl_bench/run.py --config-name tiny              # CI budget, tens of seconds
    python apps/marl_bench/run.py algorithms=[mappo,qmix] tasks=[navigation] seeds=[0,1,2] \\
        n_iters=50 compare_sequential=true out=runs/nav
    python apps/marl_bench/run.py -m algorithm=mappo,qmix task=navigation seed=0,1   # BenchMARL's spelling
    python apps/marl_bench/run.py tasks=[navigation] device=cuda  # VMAS + training on a GPU

Outputs in ``out`` (each sweep job in its own sub-folder): ``config.yaml``, ``results.md``
(mean ± std over seeds of the final deterministic evaluation return, frames/s, wall time),
``evaluations.csv`` / ``.jsonl`` (every evaluation, written as it is made),
``curves_<task>.png``, ``failures.jsonl`` (pairs that raised), ``pairs.jsonl`` (finished pairs:
what ``resume=true`` reads back, training only the pairs not finished) and ``summary.json``.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

from tdrl.core.train import ConfigError, Run, RunConfig, hydra_app
from tdrl.marl import BenchmarkFailed
from tdrl.marl.runner import BenchConfig, run_benchmark


@dataclass
class Config(RunConfig, BenchConfig):
    """Algorithms x tasks x seeds on VMAS with BenchMARL's task configs and budgets."""

    algorithm: str = ""
    """One algorithm (BenchMARL's algorithm=...); empty: the algorithms list."""
    task: str = ""
    """One task (BenchMARL's task=...); empty: the tasks list."""
    seeds: tuple[int, ...] | None = None
    """Seeds to run (one training run each); null: the single seed of `seed`."""
    out: str = "runs/marl_bench"
    """Run folder (a new numbered one beside it if it holds an earlier run)."""

    def __post_init__(self) -> None:
        RunConfig.__post_init__(self)
        if self.algorithm:
            self.algorithms = (self.algorithm,)
        if self.task:
            self.tasks = (self.task,)
        if self.seeds is None:
            self.seeds = (self.seed,)
        try:
            BenchConfig.__post_init__(self)
        except ValueError as err:
            raise ConfigError(str(err)) from err


def bench_config(cfg: Config, out: Path) -> BenchConfig:
    """The runner's settings (already checked and, with ``tiny``, already shrunk)."""
    values = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(BenchConfig)}
    return BenchConfig(**{**values, "out_dir": str(out), "tiny": False})


def main_job(cfg: Config) -> dict:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    run = Run(cfg, "marl_bench")
    run.start()
    failed = None
    try:
        # a checkpoint after each finished pair marks the folder resumable: resume=true
        # reads the finished pairs back (pairs.jsonl) and trains only the others
        result = run_benchmark(bench_config(cfg, run.out), on_pair=lambda n: run.checkpoint(n))
    except BenchmarkFailed as err:
        failed, result = err, err.result
    summary = run.finish({"summary": result["summary"], "speedups": result["speedups"],
                          "failures": [{k: f[k] for k in ("algorithm", "task", "error")} for f in result["failures"]],
                          "evaluations": len(result["evaluations"])})
    print((run.out / "results.md").read_text())
    print(f"Wrote {run.out}/results.md, evaluations.csv and curves_*.png ({len(result['evaluations'])} evaluations).")
    if failed is not None:
        sys.stderr.write(f"error: {failed}\n")
        raise SystemExit(1)
    return summary


main = hydra_app(Config, main_job, name="marl_bench", recipes=Path(__file__).parent / "recipes")

if __name__ == "__main__":
    main()
