"""tdrl.core.train's run harness: Hydra configs (docs as help, recipes, overrides, sweeps,
errors before work), the run folder (never destroyed, numbered reruns, resume), cadence,
plots without matplotlib, rank-0-only writes under torch.distributed, the ``tdrl`` command."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from tdrl.core.train import (
    read_sweep,
    ConfigError,
    Run,
    RunConfig,
    UpdateBudget,
    config_help,
    crossed,
    field_docs,
    hydra_app,
    load_config,
    run_folder,
)

REPO = Path(__file__).resolve().parents[2]


@dataclass
class ToyConfig(RunConfig):
    """A toy app: counts to ``steps``."""

    steps: int = 4
    """How far to count."""
    widths: tuple[int, ...] = (8, 8)
    """Layer sizes."""
    rate: float = 0.5
    """A rate in (0, 1]."""
    out: str = "runs/toy"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 < self.rate <= 1:
            raise ConfigError(f"ToyConfig.rate={self.rate} is not allowed: expected (0, 1].")


class Counter:
    def __init__(self) -> None:
        self.n = torch.zeros(())

    def state_dict(self) -> dict:
        return {"n": self.n.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.n = state["n"].clone()


def toy_task(cfg: ToyConfig) -> dict:
    run = Run(cfg, "toy", total=cfg.steps)
    counter = Counter()
    extra = run.start(counter=counter)
    start = int(extra["step"]) if extra else 0
    for step in range(start + 1, cfg.steps + 1):
        counter.n += step
        run.log(step, {"n": float(counter.n)})
        run.maybe_checkpoint(step, counter=counter)
    run.checkpoint(cfg.steps, counter=counter)
    return run.finish({"n": float(counter.n)}, plots={"curve.png": ("step", ["n"])})


def test_field_docs_and_help_come_from_the_docstrings():
    docs = field_docs(ToyConfig)
    assert docs["steps"] == "How far to count." and docs["rate"] == "A rate in (0, 1]."
    assert docs["seed"].startswith("Seed of every")  # inherited from RunConfig
    text = config_help(ToyConfig, "toy")
    assert "steps: int = 4" in text and "How far to count." in text and "A toy app" in text


def test_load_config_overrides_types_and_errors(tmp_path):
    (tmp_path / "short.yaml").write_text("defaults:\n  - toy\n  - _self_\nsteps: 2\nrate: 0.25\n")
    cfg = load_config(ToyConfig, ["widths=[3,4,5]", "seed=7"], name="toy", recipes=tmp_path)
    assert cfg.widths == (3, 4, 5) and cfg.seed == 7 and isinstance(cfg, ToyConfig)
    short = load_config(ToyConfig, ["rate=1.0"], recipe="short", name="toy", recipes=tmp_path)
    assert (short.steps, short.rate) == (2, 1.0)  # the override wins over the recipe
    with pytest.raises(ConfigError, match="rate"):
        load_config(ToyConfig, ["rate=2"], name="toy", recipes=tmp_path)
    with pytest.raises(ConfigError, match="checkpoint_every"):
        load_config(ToyConfig, ["checkpoint_every=-1"], name="toy", recipes=tmp_path)
    with pytest.raises(Exception, match="nope"):
        load_config(ToyConfig, ["nope=1"], name="toy", recipes=tmp_path)
    with pytest.raises(Exception, match="steps"):
        load_config(ToyConfig, ["steps=many"], name="toy", recipes=tmp_path)


def test_crossed_and_update_budget():
    assert [s for s in range(1, 13) if crossed(4, s - 1, s)] == [4, 8, 12]
    assert crossed(10, 8, 12) and not crossed(10, 10, 19) and not crossed(0, 0, 100)
    budget = UpdateBudget(ratio=0.75, learning_starts=4)
    steps = [budget.add(frames, 2) for frames in range(2, 14, 2)]
    assert steps == [0, 1, 2, 1, 2, 1] and budget.updates == 7  # 0.75 x 2 frames, rest carried
    again = UpdateBudget(0.75, 4)
    again.load_state_dict(budget.state_dict())
    assert again.add(14, 2) == budget.add(14, 2)


def test_run_folder_never_destroys_an_earlier_run(tmp_path):
    out = tmp_path / "run"
    first = toy_task(ToyConfig(out=str(out), checkpoint_every=2, progress=False))
    assert first["n"] == 10.0 and (out / "config.yaml").exists() and (out / "curve.png").exists()
    files = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    second = toy_task(ToyConfig(out=str(out), steps=3, progress=False))
    assert second["out"] == str(tmp_path / "run-1") and second["n"] == 6.0
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == files
    assert run_folder(out, resume=False) == (tmp_path / "run-2", False)
    assert run_folder(out, resume=True) == (out, True)
    assert run_folder(tmp_path / "fresh", resume=True) == (tmp_path / "fresh", False)


def test_resume_continues_and_logs_each_step_once(tmp_path):
    out = tmp_path / "run"
    toy_task(ToyConfig(out=str(out), steps=4, checkpoint_every=2, progress=False))
    (out / "checkpoints" / "step_4.pt").unlink()  # "interrupted" after the step-2 checkpoint
    resumed = toy_task(ToyConfig(out=str(out), steps=4, checkpoint_every=2, resume=True, progress=False))
    assert resumed["n"] == 10.0 and resumed["out"] == str(out)
    steps = [line.split(",")[0] for line in (out / "metrics.csv").read_text().splitlines()[1:]]
    assert steps == ["1", "2", "3", "4"]


def test_sweep_runs_one_folder_per_job(tmp_path, capsys):
    main = hydra_app(ToyConfig, toy_task, name="toy_sweep")
    results = main([f"out={tmp_path}", "progress=false", "-m", "steps=2,3"])
    assert [r["n"] for r in results] == [3.0, 6.0]
    sweep = read_sweep(tmp_path)
    assert [job["result"]["out"] for job in sweep] == [str(tmp_path / "steps=2"), str(tmp_path / "steps=3")]
    assert main(["--help"]) is None and "How far to count." in capsys.readouterr().out


def test_impossible_value_exits_before_work(tmp_path):
    main = hydra_app(ToyConfig, toy_task, name="toy_bad")
    with pytest.raises(SystemExit) as info:
        main([f"out={tmp_path / 'x'}", "rate=0"])
    assert info.value.code == 2 and not (tmp_path / "x").exists()


_BLOCK = textwrap.dedent("""
    import sys, importlib.abc
    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == "matplotlib" or name.startswith("matplotlib."):
                raise ModuleNotFoundError("No module named 'matplotlib'")
    sys.meta_path.insert(0, Block())
    import importlib.util
    _find = importlib.util.find_spec
    importlib.util.find_spec = lambda n, *a: None if n.split(".")[0] == "matplotlib" else _find(n, *a)
""")


def test_missing_matplotlib_still_writes_the_summary(fresh_python, tmp_path):
    """The PPO tiny recipe in a process where matplotlib cannot be imported: it trains, warns
    that the plot was skipped, and writes summary.json."""
    script = _BLOCK + textwrap.dedent(f"""
        sys.argv = ["train.py", "-cn", "tiny", "out={tmp_path}", "gae_backend=torch"]
        import runpy
        runpy.run_path({str(REPO / "apps" / "ppo" / "train.py")!r}, run_name="__main__")
    """)
    proc = fresh_python.run(script, absent=["matplotlib"], timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "matplotlib is not installed" in proc.stderr
    assert json.loads((tmp_path / "summary.json").read_text())["frames"] == 256
    assert not (tmp_path / "learning_curve.png").exists()


_RANKS = textwrap.dedent("""
    import os, sys, json, torch
    import torch.distributed as dist
    sys.path.insert(0, {tests!r})
    from test_train_harness import ToyConfig, toy_task
    from tdrl.core.train import init_from_env
    assert init_from_env()
    summary = toy_task(ToyConfig(out={out!r}, steps=3, checkpoint_every=1, progress=False))
    json.dump({{"rank": dist.get_rank(), "out": summary["out"]}}, open({out!r} + f".rank{{dist.get_rank()}}", "w"))
    import atexit
    atexit._run_exitfuncs()  # what the interpreter runs at exit: init_from_env's handler leaves the group
    assert not dist.is_initialized()
""")


def test_two_ranks_are_one_job_and_rank_zero_writes(fresh_python, tmp_path):
    """Two gloo ranks (as torchrun starts them) into a folder that holds a run: both pick the
    same new numbered folder, and only rank 0 writes there."""
    out = tmp_path / "run"
    toy_task(ToyConfig(out=str(out), steps=1, progress=False))  # an earlier run
    script = _RANKS.format(tests=str(Path(__file__).parent), out=str(out))
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29613", "WORLD_SIZE": "2"}
    jobs = [fresh_python.start(script, env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}) for r in range(2)]
    for job in jobs:
        proc = job.wait(timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
    outs = {json.loads(Path(f"{out}.rank{r}").read_text())["out"] for r in range(2)}
    assert outs == {str(tmp_path / "run-1")}
    assert json.loads((tmp_path / "run-1" / "summary.json").read_text())["n"] == 6.0
    assert sorted(p.name for p in (tmp_path / "run-1" / "checkpoints").glob("*.pt")) == ["step_2.pt", "step_3.pt"]


def test_accelerate_cpu_multi_process_launch_is_refused(monkeypatch):
    """``accelerate launch --cpu --num_processes 2`` sets MASTER_ADDR and ACCELERATE_USE_CPU but
    starts one process without WORLD_SIZE: refused with the launch lines that work; one process
    under accelerate (no MASTER_ADDR) and torchrun's variables pass."""
    from tdrl.core.train import init_from_env

    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ACCELERATE_USE_CPU", "True")
    assert init_from_env() is False  # accelerate launch --cpu app.py: one process, fine
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    with pytest.raises(RuntimeError, match="accelerate launch --multi_gpu --num_processes N"):
        init_from_env()
    monkeypatch.setenv("WORLD_SIZE", "1")  # a launcher that says how many ranks: no refusal
    assert init_from_env() is False


def test_tdrl_command_lists_and_runs_apps(fresh_python, tmp_path):
    from tdrl.core.cli import find_apps, main

    apps = find_apps()
    assert {"ppo", "dqn", "sac", "mcts", "grpo", "sft"} <= set(apps)
    # `python -m tdrl.core.cli list` from another folder (runpy is what -m runs)
    proc = fresh_python.run("import runpy, sys\nsys.argv = ['tdrl', 'list']\n"
                            "runpy.run_module('tdrl.core.cli', run_name='__main__', alter_sys=True)",
                            cwd=tmp_path, timeout=60)
    assert proc.returncode == 0 and "ppo" in proc.stdout
    with pytest.raises(SystemExit, match="unknown app"):
        main(["nosuchapp"])


def test_tdrl_command_outside_a_checkout_ends_with_a_message(tmp_path, monkeypatch, capsys):
    """An installed (not editable) tdrl run from a folder without apps/: a message, exit 2."""
    import tdrl.core.cli as cli

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TDRL_APPS", raising=False)
    monkeypatch.setattr(cli, "__file__", str(tmp_path / "site-packages" / "tdrl" / "core" / "cli.py"))
    assert cli.main(["list"]) == 2
    err = capsys.readouterr().err
    assert "No tdrl apps folder found" in err and "TDRL_APPS" in err and "Traceback" not in err
