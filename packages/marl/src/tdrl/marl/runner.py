"""The benchmark runner: algorithms x tasks x seeds from one config.

``run_benchmark(BenchConfig(...))`` trains every combination, evaluates the deterministic
policy every ``eval_interval`` iterations and writes, under ``out_dir``:

* ``results.md`` -- one row per (algorithm, task): mean and standard deviation over seeds of
  the final evaluation return, frames/s and wall time (and, with ``compare_sequential``,
  the speed-up of vectorised seeds over seeds run one after another);
* ``evaluations.csv`` and ``evaluations.jsonl`` -- every evaluation (algorithm, task, seed,
  iteration, frames, time), appended as it is made;
* ``marl_eval.json`` -- the same evaluations (every episode's return) in marl-eval's layout,
  as BenchMARL writes it (:func:`marl_eval_json`);
* ``failures.jsonl`` -- the pairs that raised, with the error and its traceback;
* ``curves_<task>.png`` -- evaluation return against frames, one line per algorithm
  (mean over seeds, min-max band).

``results.md`` is rewritten after every pair, so a crash loses only the running pair; a pair
that fails is recorded and the others run, and :class:`BenchmarkFailed` is raised at the end.

Tasks are BenchMARL's VMAS task configs (:mod:`tdrl.marl.tasks`: every scenario parameter and
the episode length of its YAML); QMIX, VDN and IQL run their discrete-action variants, the
other algorithms the continuous ones (``ALGORITHMS[name].continuous``).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
import math
import statistics
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from tdrl.core import InitTracker, TransformedEnv
from tdrl.core.train import Checkpointer, SeedAxis

from ._optional import available, missing_message
from .algorithms import ALGORITHMS, make_groups
from .tasks import TASK_NAMES, check_task_actions, make_task_env, resolve_task, task_spec
from .loops import TrainConfig, train_off_policy, train_on_policy
from .vectorised import make_vectorised_groups

__all__ = ["TASKS", "TINY", "BenchConfig", "algorithm_config", "task_env", "BenchmarkFailed", "marl_eval_json", "run_benchmark", "write_results"]

log = logging.getLogger(__name__)

TASKS: dict[str, dict] = {name: task_spec(name) for name in TASK_NAMES}
"""BenchMARL's VMAS and PettingZoo tasks: ``key -> env, scenario, max_steps, kwargs, group_map,
source`` (:mod:`tdrl.marl.tasks`: BenchMARL's task YAMLs). Keys are the bare name for VMAS and
``pettingzoo/<name>``; ``BenchConfig.tasks`` also takes ``vmas/<name>`` (:func:`~tdrl.marl.tasks.resolve_task`)."""


TINY: dict[str, object] = {
    "num_envs": 8, "frames_per_batch": 80, "n_iters": 2, "num_epochs": 1, "minibatch_size": 40,
    "num_cells": (16,), "off_policy_frames_per_batch": 80, "n_optimizer_steps": 2, "off_policy_batch_size": 32,
    "eval_envs": 2, "eval_interval": 1, "max_steps": 10,
}
"""``BenchConfig(tiny=True)``'s sizes: 8 envs, 2 iterations of 80 frames, 10-step episodes, one
16-unit layer (applied to the fields left at their defaults)."""


class BenchmarkFailed(RuntimeError):
    """Some (algorithm, task) pairs failed; the others ran and their results are written.

    Attributes:
        result: what :func:`run_benchmark` would have returned (``"failures"`` lists the
            failed pairs with their errors).
    """

    def __init__(self, message: str, result: dict) -> None:
        super().__init__(message)
        self.result = result


@dataclass
class BenchConfig:
    """One benchmark: every field can be overridden from the command line.

    Args:
        algorithms: names from :data:`tdrl.marl.algorithms.ALGORITHMS`.
        tasks: BenchMARL's task names (:data:`TASKS`; ``vmas/<name>``, ``pettingzoo/<name>`` or the
            bare name, turned into the :data:`TASKS` key).
        seeds: one training run per seed.
        num_envs: vectorised envs per seed.
        frames_per_batch, n_iters, num_epochs, minibatch_size, lr, max_grad_norm: on-policy
            budget (frames per iteration, iterations, PPO epochs, minibatch, Adam).
        off_policy_frames_per_batch, n_optimizer_steps, off_policy_batch_size, buffer_size:
            off-policy budget per iteration (QMIX / VDN, MADDPG / IDDPG, MASAC / ISAC, IQL).
        num_cells: hidden sizes of every network.
        gamma: discount.
        eval_envs: evaluation episodes (one per eval sub-env); eval_interval: iterations.
        max_steps: override every task's episode length (None: the task's).
        vectorise_seeds: train the seeds of every algorithm whose ``ALGORITHMS[name].vectorisable``
            (today all nine) as one vmap-ed model (the others train their seeds one after another).
        compare_sequential: also run those seeds one after another and report the speed-up.
        out_dir: where results go.
        tiny: a CI-sized budget (tens of seconds): :data:`TINY`'s sizes for every field left
            at its default (a value you set, e.g. ``n_iters=100``, is kept).
        device: where the VMAS worlds, the networks and the training run (``"cpu"``, ``"cuda"``).
        resume: continue a run into ``out_dir``: the (algorithm, task) pairs it finished
            (``pairs.jsonl``) are read back with their evaluations and not trained again; a
            pair that was running when it stopped continues from its newest checkpoint with
            ``checkpoint_iters`` (else it is trained again from its start).
        checkpoint_iters: every this many iterations (and after the last) save each run's
            learner (networks, targets, exploration schedule, optimiser, replay buffer, RNG
            states; :mod:`tdrl.marl.loops.restore`) to ``<out_dir>/checkpoints/<algo>_<task>_seed<k>/``
            (``..._seeds`` for vectorised seeds); 0: none. The envs are not saved: a resumed run
            resets them. The checkpoints stay after the pair, for evaluation and rendering
            (:func:`~tdrl.marl.loops.load_parts`, :func:`~tdrl.marl.loops.render_episode`).
        recurrent: recurrent actors and critics for MAPPO / IPPO, recurrent Q networks for QMIX /
            VDN (``MAPPOConfig.recurrent``, ``QMIXConfig.recurrent``; the envs get core's
            ``InitTracker``); the other algorithms are refused. With ``vectorise_seeds`` the seeds
            train as one model here too (each seed's cells stacked, one batched GEMM per step).
        rnn: ``"gru"`` or ``"lstm"`` with ``recurrent`` (BenchMARL's ``model=layers/gru`` /
            ``layers/lstm``).
        rnn_hidden: the cells' hidden size (BenchMARL's ``layers/gru.yaml`` / ``lstm.yaml``: 128).
        share_param_critic: one critic for all agents of a group (MAPPO / IPPO; BenchMARL's
            ``algorithm.share_param_critic``, default True); False is refused with QMIX / VDN,
            which have no critic.
    """

    algorithms: tuple[str, ...] = ("mappo", "ippo", "qmix", "vdn")
    tasks: tuple[str, ...] = ("balance", "navigation", "transport", "wheel", "sampling")
    seeds: tuple[int, ...] = (0, 1, 2)
    num_envs: int = 60
    frames_per_batch: int = 6000
    n_iters: int = 500
    num_epochs: int = 45
    minibatch_size: int = 400
    lr: float = 5e-5
    max_grad_norm: float = 5.0
    off_policy_frames_per_batch: int = 6000
    n_optimizer_steps: int = 1000
    off_policy_batch_size: int = 128
    buffer_size: int = 1_000_000
    num_cells: tuple[int, ...] = (256, 256)
    gamma: float = 0.99
    eval_envs: int = 10
    eval_interval: int = 20
    max_steps: int | None = None
    vectorise_seeds: bool = True
    compare_sequential: bool = False
    out_dir: str = "marl_bench_out"
    tiny: bool = False
    device: str = "cpu"
    resume: bool = False
    checkpoint_iters: int = 0
    recurrent: bool = False
    rnn: str = "gru"
    rnn_hidden: int = 128
    share_param_critic: bool = True

    def __post_init__(self) -> None:
        bad = [x for x in self.algorithms if x not in ALGORITHMS]
        if bad:
            raise ValueError(f"Unknown algorithms {bad}; valid algorithms: {', '.join(sorted(ALGORITHMS))}.")
        self.tasks = tuple(t if t in TASKS else resolve_task(t) for t in self.tasks)  # names the bad one
        for algo in self.algorithms:  # every pair's action kind, before any training
            for task in self.tasks:
                check_task_actions(TASKS[task], ALGORITHMS[algo].continuous, algo)
        if not self.seeds:
            raise ValueError("BenchConfig.seeds needs at least one seed.")
        if not self.share_param_critic:
            off = [a for a in self.algorithms if not _has_field(ALGORITHMS[a].config_class, "share_param_critic")]
            if off:
                raise ValueError(f"share_param_critic=False sets the critics of mappo / ippo / maddpg / iddpg / "
                                 f"masac / isac; {off} have no "
                                 "critic: remove them from algorithms or leave share_param_critic at True.")
        if self.rnn not in ("gru", "lstm"):
            raise ValueError(f"BenchConfig.rnn must be 'gru' or 'lstm', got {self.rnn!r}.")
        if self.rnn != "gru" and not self.recurrent:
            raise ValueError(f"rnn={self.rnn!r} chooses the cell of recurrent networks: set recurrent=True too.")
        if self.recurrent:
            off = [a for a in self.algorithms if not _has_field(ALGORITHMS[a].config_class, "recurrent")]
            if off:
                raise ValueError(f"recurrent=True builds GRU / LSTM networks for mappo / ippo / qmix / vdn only; "
                                 f"remove {off} from algorithms.")
        dev = torch.device(self.device)
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"BenchConfig.device={self.device!r}, but CUDA is not available here; use 'cpu'.")
        if self.tiny:  # only what the user left at its default: their keys win
            defaults = {f.name: f.default for f in dataclasses.fields(BenchConfig)}
            for name, value in TINY.items():
                if getattr(self, name) == defaults[name]:
                    setattr(self, name, value)

    def train_config(self, on_policy: bool, max_steps: int) -> TrainConfig:
        return TrainConfig(
            frames_per_batch=self.frames_per_batch if on_policy else self.off_policy_frames_per_batch,
            n_iters=self.n_iters, num_epochs=self.num_epochs,
            minibatch_size=self.minibatch_size if on_policy else self.off_policy_batch_size,
            lr=self.lr, max_grad_norm=self.max_grad_norm, buffer_size=self.buffer_size,
            n_optimizer_steps=self.n_optimizer_steps, eval_interval=self.eval_interval,
            max_steps=max_steps,
        )


def _has_field(cls: type, name: str) -> bool:
    return any(f.name == name for f in dataclasses.fields(cls))


def task_env(task: str, num_envs: int, continuous: bool, seed: int, max_steps: int, device: str = "cpu",
         recurrent: bool = False):
    """The task's env (:func:`~tdrl.marl.tasks.make_task_env`); with ``recurrent``, behind an
    ``InitTracker`` (``is_init``)."""
    env = make_task_env(TASKS[task], num_envs, continuous, seed, max_steps, device)
    return TransformedEnv(env, InitTracker()) if recurrent else env


def algorithm_config(cfg: BenchConfig, algo: str):
    """The config dataclass ``algo`` trains with under ``cfg`` (gamma, critic sharing, GRU, exploration)."""
    conf_cls = ALGORITHMS[algo].config_class
    kwargs = {"gamma": cfg.gamma}
    fields = {f.name for f in dataclasses.fields(conf_cls)}
    if "share_param_critic" in fields:
        kwargs["share_param_critic"] = cfg.share_param_critic
    # BenchMARL's exploration_anneal_frames: null -> a third of the frames of the run (MADDPG /
    # IDDPG's noise, IQL's epsilon; QMIX / VDN keep their own eps_anneal_frames default)
    third = max(1, cfg.n_iters * cfg.off_policy_frames_per_batch // 3)
    for name in ("sigma_anneal_frames", "eps_anneal_frames"):
        if name in fields and algo not in ("qmix", "vdn"):
            kwargs[name] = third
    if cfg.recurrent:
        kwargs.update(recurrent=True, rnn=cfg.rnn, rnn_hidden=cfg.rnn_hidden)
    return conf_cls(**kwargs)


def _rows(algo, task, seed, history, seed_index=None):
    out = []
    for rec in history:
        ret = rec["eval_return"]
        if seed_index is not None and "eval_return_seeds" in rec:
            ret = rec["eval_return_seeds"][seed_index]
        train = rec["train_return"]
        if seed_index is not None and "train_return_seeds" in rec:
            train = rec["train_return_seeds"][seed_index]
        if not math.isnan(ret):
            row = {"algorithm": algo, "task": task, "seed": seed, "iter": rec["iter"], "frames": rec["frames"],
                   "time_s": round(rec["time_s"], 3), "eval_return": ret, "train_return": train}
            for key in [k for k in rec if k.startswith("eval_episode_returns")]:  # and .../<group>
                episodes = rec[key]
                if seed_index is not None and "eval_return_seeds" in rec:  # seed-major blocks
                    k = len(episodes) // len(rec["eval_return_seeds"])
                    episodes = episodes[seed_index * k:(seed_index + 1) * k]
                row[key] = episodes
            row.setdefault("eval_episode_returns", [])
            out.append(row)
    return out


def _run_seeds(cfg: BenchConfig, algo: str, task: str, vectorised: bool,
               on_rows: Callable[[list[dict]], None] | None = None) -> tuple[list[dict], float, int]:
    """Train every seed of (algo, task); returns (evaluation rows, wall seconds, frames).

    ``on_rows`` receives each iteration's evaluation rows (one per seed) as soon as they exist.
    """
    on_policy, continuous = ALGORITHMS[algo].on_policy, ALGORITHMS[algo].continuous
    vectorised = vectorised and ALGORITHMS[algo].vectorisable and len(cfg.seeds) > 1
    max_steps = cfg.max_steps or TASKS[task]["max_steps"]
    tcfg = cfg.train_config(on_policy, max_steps)
    conf = algorithm_config(cfg, algo)
    rows, frames = [], 0

    def emit(new: list[dict]) -> None:
        rows.extend(new)
        if on_rows is not None and new:
            on_rows(new)

    def checkpoint(name: str) -> dict:
        """The loops' checkpoint arguments for one run of this pair."""
        if not cfg.checkpoint_iters:
            return {}
        folder = Path(cfg.out_dir) / "checkpoints" / f"{algo}_{task.replace('/', '_')}_{name}"
        return {"checkpoint": Checkpointer(folder, keep=2), "checkpoint_every": cfg.checkpoint_iters,
                "resume": cfg.resume}

    def restored(hist: list[dict], logged: set) -> list[dict]:
        """The records a resumed run read back from its checkpoint (not passed to ``log``)."""
        return [r for r in hist if r["iter"] not in logged]

    t0 = time.perf_counter()
    train = train_on_policy if on_policy else train_off_policy
    # every seed at once (one vectorised model), or one after another: each a SeedAxis, one body
    axes = [SeedAxis(cfg.seeds)] if vectorised else [SeedAxis([seed]) for seed in cfg.seeds]
    for axis in axes:
        first = axis.seeds[0]
        torch.manual_seed(first)
        # VMAS draws every sub-env from one generator: the env takes the first seed of the axis
        env = task_env(task, axis.n * cfg.num_envs, continuous, first, max_steps, cfg.device, cfg.recurrent)
        eval_env = task_env(task, axis.n * cfg.eval_envs, continuous, 10_000 + first, max_steps, cfg.device,
                            cfg.recurrent)
        parts = make_vectorised_groups(algo, env, axis.seeds, conf, num_cells=cfg.num_cells)  # every group
        logged: set = set()

        def log_axis(recs: list[dict], axis: SeedAxis = axis, logged: set = logged) -> None:
            logged.update(r["iter"] for r in recs)
            emit([r for rec in recs for i, seed in enumerate(axis.seeds) for r in _rows(algo, task, seed, [rec], i)])

        name = "seeds" if axis.stacked else f"seed{first}"
        hist = train(env, parts, tcfg, eval_env=eval_env, n_seeds=axis, log=lambda rec, f=log_axis: f([rec]),
                     **checkpoint(name))
        log_axis(restored(hist, logged))
        frames += hist[-1]["frames"] * axis.n
    return rows, time.perf_counter() - t0, frames


def _summary(cfg: BenchConfig, algo: str, task: str, rows: list[dict], wall: float, frames: int) -> dict:
    finals = [max((r for r in rows if r["seed"] == s), key=lambda r: r["iter"])["eval_return"]
              for s in cfg.seeds if any(r["seed"] == s for r in rows)]
    return {
        "algorithm": algo, "task": task, "seeds": len(cfg.seeds),
        "final_return_mean": statistics.fmean(finals) if finals else float("nan"),
        "final_return_std": statistics.pstdev(finals) if len(finals) > 1 else 0.0,
        "frames_per_s": frames / wall, "wall_s": wall,
        "vectorised": bool(cfg.vectorise_seeds and len(cfg.seeds) > 1 and ALGORITHMS[algo].vectorisable),
    }


def run_benchmark(cfg: BenchConfig, on_pair: Callable[[int], None] | None = None) -> dict:
    """Train every (algorithm, task, seed); write the outputs as they come; return the results.

    Each evaluation is appended to ``evaluations.csv`` and ``evaluations.jsonl`` when it is
    made, and ``results.md`` and ``pairs.jsonl`` are written after every (algorithm, task)
    pair, so a crash loses only the pair that was running (``resume=True`` continues from
    the finished pairs). A pair that raises is logged, listed in
    ``results.md`` and ``failures.jsonl`` with its error, and the other pairs still run.

    Args:
        cfg: the benchmark.
        on_pair: called with the number of finished pairs after each one is written (the app
            checkpoints its run folder there, so that ``resume=true`` finds it).

    Returns:
        ``{"summary", "evaluations", "speedups", "failures"}`` (``failures`` empty).

    Raises:
        BenchmarkFailed: after every pair ran and every output is written, when any pair
            failed; its message names the failed pairs, its ``result`` holds the rest.
    """
    torch.set_num_threads(1)
    writer = _ResultWriter(cfg)
    result = writer.result
    for task in cfg.tasks:
        for algo in cfg.algorithms:
            if (algo, task) in writer.finished:
                log.info("%s on %s: finished by the run being resumed, not trained again", algo, task)
                continue
            try:
                rows, wall, frames = _run_seeds(cfg, algo, task, cfg.vectorise_seeds, writer.add_evaluations)
                summary, speedup = _summary(cfg, algo, task, rows, wall, frames), None
                log.info("%s on %s: %s", algo, task, summary)
                if cfg.compare_sequential and summary["vectorised"]:
                    _, seq_wall, _ = _run_seeds(cfg, algo, task, vectorised=False)
                    speedup = {"algorithm": algo, "task": task, "seeds": len(cfg.seeds),
                               "sequential_s": seq_wall, "vectorised_s": wall, "speedup": seq_wall / wall}
                    result["speedups"].append(speedup)
                result["summary"].append(summary)
                writer.add_pair(algo, task, summary, speedup)
                if on_pair is not None:
                    on_pair(len(result["summary"]))
            except Exception as err:  # one broken pair must not lose the others
                log.exception("%s on %s failed; continuing with the other pairs", algo, task)
                writer.add_failure(algo, task, err)
            writer.write_markdown()
    writer.write_plots()
    if result["failures"]:
        names = ", ".join(f"{f['algorithm']} on {f['task']} ({f['error']})" for f in result["failures"])
        n_pairs = len(cfg.tasks) * len(cfg.algorithms)
        raise BenchmarkFailed(
            f"{len(result['failures'])} of {n_pairs} (algorithm, task) pairs failed: {names}. The other "
            f"pairs' results are in {writer.out}/results.md; tracebacks in {writer.out}/failures.jsonl.",
            result,
        )
    return result


_FIELDS = ["algorithm", "task", "seed", "iter", "frames", "time_s", "eval_return", "train_return"]


def marl_eval_json(evaluations: list[dict], environment: str | None = None) -> dict:
    """The evaluations in marl-eval's layout (what BenchMARL's ``JsonWriter`` writes).

    ``{environment: {task: {algorithm: {"seed_<s>": {"step_<k>": {"step_count": frames,
    "return": [episode returns], "<group>_return": [...], ...}, ..., "absolute_metrics":
    {"return": [best]}}}}}}``, with ``k`` counting the run's evaluations
    (https://github.com/instadeepai/marl-eval#usage-) and one ``<group>_return`` per agent
    group, as BenchMARL's ``Logger.log_evaluation`` writes them.

    Args:
        evaluations: the runner's evaluation rows.
        environment: ``None``: each task's own (``vmas`` / ``pettingzoo``, from a task key
            ``pettingzoo/<name>``; a bare key is VMAS); else every row under this name.
    """
    data: dict = {}
    for r in sorted(evaluations, key=lambda r: (r["task"], r["algorithm"], r["seed"], r["iter"])):
        env, _, task = r["task"].rpartition("/")
        env = environment or env or "vmas"
        run = data.setdefault(env, {}).setdefault(task, {}).setdefault(r["algorithm"], {}).setdefault(
            f"seed_{r['seed']}", {"absolute_metrics": {}})
        returns = list(r.get("eval_episode_returns") or [r["eval_return"]])
        step = {"step_count": r["frames"], "return": returns}
        step.update({f"{k.split('/', 1)[1]}_return": list(v) for k, v in r.items()
                     if k.startswith("eval_episode_returns/")})
        run[f"step_{len(run) - 1}"] = step
        best = max([*returns, *run["absolute_metrics"].get("return", [])])
        run["absolute_metrics"]["return"] = [best]
    return data


def _write_marl_eval(out: Path, evaluations: list[dict]) -> None:
    (out / "marl_eval.json").write_text(json.dumps(marl_eval_json(evaluations), indent=1))


def _json_line(row: dict) -> str:
    """One JSON line; NaN (no episode ended) becomes null, which strict JSON readers accept."""
    return json.dumps({k: None if isinstance(v, float) and math.isnan(v) else v for k, v in row.items()}) + "\n"


def _write_csv(path: Path, rows: list[dict], mode: str) -> None:
    """``evaluations.csv``: a header and ``rows`` (``mode="w"``) or ``rows`` appended (``"a"``);
    the one place that knows its columns (:data:`_FIELDS`)."""
    with open(path, mode, newline="") as f:
        writer = csv.DictWriter(f, fieldnames=_FIELDS, extrasaction="ignore")
        if mode == "w":
            writer.writeheader()
        writer.writerows(rows)


def _read_records(path: Path, keys: tuple[str, ...]) -> list[dict]:
    """The JSON lines of ``path`` that parse and hold ``keys``; a torn line (a run killed while
    appending) or a foreign one is skipped with a warning naming the file and line, so that
    pair is trained again instead of the resume crashing."""
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as err:
            log.warning("%s line %d is not JSON (%s; a run killed while writing it?): skipped, its pair "
                        "is trained again.", path, n, err.msg)
            continue
        if not isinstance(rec, dict) or not all(k in rec for k in keys):
            log.warning("%s line %d lacks %s: skipped.", path, n, list(keys))
            continue
        out.append(rec)
    return out


class _ResultWriter:
    """The run's outputs under ``cfg.out_dir``, started afresh and appended to as results come."""

    def __init__(self, cfg: BenchConfig) -> None:
        self.cfg = cfg
        self.out = Path(cfg.out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.result: dict = {"summary": [], "evaluations": [], "speedups": [], "failures": []}
        self.finished: set[tuple[str, str]] = set()  # (algorithm, task) pairs read back
        kept: list[dict] = []
        if cfg.resume and (self.out / "pairs.jsonl").is_file():
            pairs = _read_records(self.out / "pairs.jsonl", ("algorithm", "task", "summary"))
            (self.out / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in pairs))  # no torn tail
            for rec in pairs:
                self.finished.add((rec["algorithm"], rec["task"]))
                self.result["summary"].append(rec["summary"])
                if rec.get("speedup"):
                    self.result["speedups"].append(rec["speedup"])
            old = self.out / "evaluations.jsonl"
            rows = _read_records(old, ("algorithm", "task")) if old.is_file() else ()
            kept = [r for r in rows if (r["algorithm"], r["task"]) in self.finished]
        else:
            (self.out / "pairs.jsonl").write_text("")
        _write_csv(self.out / "evaluations.csv", [], "w")
        for name in ("evaluations.jsonl", "failures.jsonl"):
            (self.out / name).write_text("")
        if kept:  # the finished pairs' evaluations, without the interrupted pair's
            self.add_evaluations(kept)
        self.write_markdown()

    def add_pair(self, algo: str, task: str, summary: dict, speedup: dict | None) -> None:
        """A finished pair, appended to ``pairs.jsonl`` (what ``resume`` reads back)."""
        with open(self.out / "pairs.jsonl", "a") as f:
            f.write(json.dumps({"algorithm": algo, "task": task, "summary": summary,
                                "speedup": speedup}) + "\n")

    def add_evaluations(self, rows: list[dict]) -> None:
        self.result["evaluations"].extend(rows)
        _write_csv(self.out / "evaluations.csv", rows, "a")
        with open(self.out / "evaluations.jsonl", "a") as f:
            f.writelines(_json_line(r) for r in rows)
        _write_marl_eval(self.out, self.result["evaluations"])

    def add_failure(self, algo: str, task: str, err: BaseException) -> None:
        failure = {"algorithm": algo, "task": task, "error": f"{type(err).__name__}: {err}"}
        self.result["failures"].append(failure)
        with open(self.out / "failures.jsonl", "a") as f:
            tb = "".join(traceback.format_exception(type(err), err, err.__traceback__))
            f.write(json.dumps({**failure, "traceback": tb}) + "\n")

    def write_markdown(self) -> None:
        (self.out / "results.md").write_text(_markdown(self.cfg, self.result))

    def write_plots(self) -> None:
        _write_plots(self.cfg, self.out, self.result["evaluations"])


def _markdown(cfg: BenchConfig, result: dict) -> str:
    lines = ["# MARL benchmark", "",
             f"Config: `{dataclasses.asdict(cfg)}`", "",
             "| algorithm | task | seeds | final eval return (mean ± std) | frames/s | wall time (s) |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in result["summary"]:
        lines.append(f"| {r['algorithm']} | {r['task']} | {r['seeds']} | "
                     f"{r['final_return_mean']:.3f} ± {r['final_return_std']:.3f} | "
                     f"{r['frames_per_s']:.0f} | {r['wall_s']:.1f} |")
    if result["speedups"]:
        lines += ["", "Seeds as one vectorised model vs one after another:", "",
                  "| algorithm | task | seeds | sequential (s) | vectorised (s) | speed-up |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for r in result["speedups"]:
            lines.append(f"| {r['algorithm']} | {r['task']} | {r['seeds']} | {r['sequential_s']:.1f} | "
                         f"{r['vectorised_s']:.1f} | {r['speedup']:.2f}x |")
    if result.get("failures"):
        lines += ["", "Failed (tracebacks in `failures.jsonl`):", "", "| algorithm | task | error |",
                  "| --- | --- | --- |"]
        for r in result["failures"]:
            error = r["error"].replace("|", "\\|").replace("\n", " ")
            lines.append(f"| {r['algorithm']} | {r['task']} | {error} |")
    done = len(result["summary"]) + len(result.get("failures", []))
    total = len(cfg.tasks) * len(cfg.algorithms)
    if done < total:
        lines += ["", f"In progress: {done} of {total} (algorithm, task) pairs finished."]
    return "\n".join(lines) + "\n"


def _plot(out: Path, task: str, evaluations: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for algo in sorted({r["algorithm"] for r in evaluations if r["task"] == task}):
        rows = [r for r in evaluations if r["task"] == task and r["algorithm"] == algo]
        frames = sorted({r["frames"] for r in rows})
        vals = [[r["eval_return"] for r in rows if r["frames"] == f] for f in frames]
        ax.plot(frames, [statistics.fmean(v) for v in vals], label=algo)
        ax.fill_between(frames, [min(v) for v in vals], [max(v) for v in vals], alpha=0.2)
    ax.set(title=task if "/" in task else f"vmas/{task}", xlabel="frames", ylabel="evaluation return")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / f"curves_{task.replace('/', '_')}.png", dpi=100)
    plt.close(fig)


def _write_plots(cfg: BenchConfig, out: Path, evaluations: list[dict]) -> None:
    if not available("matplotlib"):  # the tables are written; only the plots need it
        log.warning("%s; curves_<task>.png skipped",
                    missing_message("matplotlib", extra="apps", what="the benchmark's plots"))
        return
    for task in cfg.tasks:
        if any(r["task"] == task for r in evaluations):
            _plot(out, task, evaluations)


def write_results(cfg: BenchConfig, result: dict) -> Path:
    """Write ``results.md``, ``evaluations.csv``, ``evaluations.jsonl`` and ``curves_<task>.png``
    to ``cfg.out_dir`` from a finished ``result`` (:func:`run_benchmark` writes them as it goes)."""
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.md").write_text(_markdown(cfg, result))
    _write_csv(out / "evaluations.csv", result["evaluations"], "w")
    (out / "evaluations.jsonl").write_text("".join(_json_line(r) for r in result["evaluations"]))
    _write_marl_eval(out, result["evaluations"])
    _write_plots(cfg, out, result["evaluations"])
    return out
