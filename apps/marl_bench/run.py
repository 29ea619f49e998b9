"""MARL benchmark: algorithms x tasks x seeds on VMAS -> results.md, evaluations.csv, PNG curves.

Every field of :class:`tdrl.marl.runner.BenchConfig` (BenchMARL's experiment settings and
task configs) is a ``key=value`` setting, beside the run-folder settings every app shares:

    python apps/marl_bench/run.py --config-name tiny              # CI budget, tens of seconds
    python apps/marl_bench/run.py algorithms=[mappo,qmix] tasks=[navigation] seeds=[0,1,2] \\
        n_iters=50 compare_sequential=true out=runs/nav
    python apps/marl_bench/run.py -m algorithm=mappo,qmix task=vmas/navigation seed=0,1   # BenchMARL's spelling
    python apps/marl_bench/run.py algorithm=mappo task=pettingzoo/simple_tag experiment.lr=3e-4 algorithm.share_param_critic=false
    python apps/marl_bench/run.py tasks=[navigation] device=cuda  # VMAS + training on a GPU
    python apps/marl_bench/run.py algorithm=iql task=vmas/balance checkpoint_iters=10 out=runs/iql
    python apps/marl_bench/run.py algorithm=iql task=vmas/balance \
        evaluate_from=runs/iql/checkpoints/iql_balance_seed0/step_60000.pt video=iql_balance.gif

Outputs in ``out`` (each sweep job in its own sub-folder): ``config.yaml``, ``results.md``
(mean ± std over seeds of the final deterministic evaluation return, frames/s, wall time),
``evaluations.csv`` / ``.jsonl`` (every evaluation, written as it is made),
``curves_<task>.png``, ``failures.jsonl`` (pairs that raised), ``pairs.jsonl`` (finished pairs:
what ``resume=true`` reads back, training only the pairs not finished), ``summary.jsonl`` and
``marl_eval.json``, the only ``*.json`` in the folder (and in a sweep's: ``sweep.jsonl``), so
BenchMARL's ``get_raw_dict_from_multirun_folder`` reads a run or sweep folder as it is.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

from tdrl.core.train import NOT_A_SETTING, ConfigError, Run, RunConfig, changed_settings, hydra_app
from tdrl.marl import BenchmarkFailed
from tdrl.marl.benchmarl_names import translate_overrides
from tdrl.marl.evaluation import evaluate_checkpoint
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
    evaluate_from: str = ""
    """A checkpoint (``<run>/checkpoints/<algo>_<task>_seed<k>/step_<n>.pt``, written with
    checkpoint_iters=N): evaluate it for ``eval_envs`` deterministic episodes with this
    algorithm, task and network settings instead of training; no run folder is made."""
    video: str = ""
    """With evaluate_from: also render one evaluation episode to this file (.gif; .mp4 with
    imageio-ffmpeg). VMAS tasks only (they render on the CPU)."""
    out: str = "runs/marl_bench"
    """Run folder (a new numbered one beside it if it holds an earlier run)."""
    out_dir: str = dataclasses.field(default="marl_bench_out", metadata={NOT_A_SETTING: "use out=DIR (the run folder)"})
    eval_every: int = dataclasses.field(default=0, metadata={
        NOT_A_SETTING: "use eval_interval=N (iterations between evaluations)"})
    checkpoint_every: int = dataclasses.field(default=0, metadata={
        NOT_A_SETTING: "use checkpoint_iters=N (each run's learner every N iterations, resumed inside its pair)"})
    time_limit_s: float = dataclasses.field(default=0.0, metadata={
        NOT_A_SETTING: "the benchmark has no time limit; its budget is n_iters"})

    def __post_init__(self) -> None:
        RunConfig.__post_init__(self)
        if self.algorithm:
            self.algorithms = (self.algorithm,)
        if self.task:
            self.tasks = (self.task,)
        if self.seeds is None:
            self.seeds = (self.seed,)
        if self.evaluate_from and (len(self.algorithms) != 1 or len(self.tasks) != 1):
            raise ConfigError(f"evaluate_from evaluates one run: name one algorithm=... and one task=... (got "
                              f"algorithms {list(self.algorithms)}, tasks {list(self.tasks)}).")
        if self.video and not self.evaluate_from:
            raise ConfigError("video=... renders a checkpoint's evaluation episode: give evaluate_from=<checkpoint> "
                              "too.")
        try:
            BenchConfig.__post_init__(self)
        except ValueError as err:
            raise ConfigError(str(err)) from err


def bench_config(cfg: Config, out: Path) -> BenchConfig:
    """The runner's settings (already checked and, with ``tiny``, already shrunk)."""
    values = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(BenchConfig)}
    return BenchConfig(**{**values, "out_dir": str(out), "tiny": False})


_MAY_CHANGE_ON_RESUME = ("resume", "out", "out_dir", "progress", "threads", "tensorboard", "wandb",
                         "time_limit_s", "checkpoint_every", "checkpoint_iters", "algorithm", "task", "algorithms", "tasks")
"""Keys a resume may change: run-folder and display settings, and which pairs to run (finished
pairs are read back, new ones trained); any other change would mix settings in one table."""


def evaluate_only(cfg: Config) -> dict:
    """``evaluate_from=<checkpoint>``: evaluate (and with ``video=`` render) without training."""
    values = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(BenchConfig)}
    result = evaluate_checkpoint(BenchConfig(**{**values, "tiny": False}), cfg.algorithms[0], cfg.tasks[0],
                                 cfg.evaluate_from, seed=cfg.seeds[0], video=cfg.video or None)
    print(json.dumps(result))
    return result


def main_job(cfg: Config) -> dict:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if cfg.evaluate_from:
        return evaluate_only(cfg)
    run = Run(cfg, "marl_bench", summary_file="summary.jsonl")  # marl_eval.json: the one *.json here
    if run.resuming:
        changed = changed_settings(run.out, cfg, ignore=_MAY_CHANGE_ON_RESUME)
        if changed:
            what = ", ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in changed.items())
            sys.stderr.write(f"error: resume=true into {run.out}, whose run used other settings ({what}). "
                             "A resume continues the same benchmark: drop these keys, or start a new run "
                             "(resume=false picks a fresh folder beside it).\n")
            raise SystemExit(2)
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


main = hydra_app(Config, main_job, name="marl_bench", recipes=Path(__file__).parent / "recipes",
                 translate=translate_overrides)  # BenchMARL's experiment.* / algorithm.* spellings

if __name__ == "__main__":
    main()
