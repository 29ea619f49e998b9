"""hydra_app: no silent settings and sweeps other tools can read.

A ``+key=value`` for a key the config lacks and a value for a field marked ``NOT_A_SETTING`` are
refused naming the key; a sweep gets its own folder (never inside an earlier run or sweep);
``sweep.jsonl`` keeps every job's line when jobs append from several processes at once.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
from dataclasses import dataclass

import pytest

from tdrl.core.train import (
    NOT_A_SETTING,
    SWEEP_FILE,
    ConfigError,
    Run,
    RunConfig,
    append_sweep_line,
    config_help,
    hydra_app,
    load_config,
    read_sweep,
)


@dataclass
class Base:
    width: int = 8
    """Layer width."""
    inner_dir: str = "x"
    """A folder the base class writes to."""


@dataclass
class SweepConfig(RunConfig, Base):
    """A toy app."""

    steps: int = 2
    """How far to count."""
    inner_dir: str = dataclasses.field(default="x", metadata={NOT_A_SETTING: "use out=DIR"})
    out: str = "runs/sweep_toy"


def count(cfg: SweepConfig) -> dict:
    run = Run(cfg, "toy")
    run.start()
    return run.finish({"n": cfg.steps * cfg.width})


def test_an_appended_key_the_config_lacks_is_refused_naming_it():
    with pytest.raises(ConfigError, match=r"no setting 'n_seeds' \(from a \+key=value\?\); valid settings: .*steps"):
        load_config(SweepConfig, ["+n_seeds=3"], name="sweep_toy_a")
    main = hydra_app(SweepConfig, count, name="sweep_toy_b")
    with pytest.raises(SystemExit) as info:
        main(["+foo=bar", "out=/nonexistent/never"])
    assert info.value.code == 2


def test_an_inherited_field_the_app_ignores_is_hidden_and_refused():
    assert "inner_dir" not in config_help(SweepConfig, "toy")
    assert "width" in config_help(SweepConfig, "toy")
    with pytest.raises(ConfigError, match=r"inner_dir is not a setting of SweepConfig .*use out=DIR"):
        load_config(SweepConfig, ["inner_dir=y"], name="sweep_toy_c")
    assert load_config(SweepConfig, ["inner_dir=x"], name="sweep_toy_d").inner_dir == "x"  # the default


def test_a_sweep_gets_its_own_folder_beside_an_earlier_run(tmp_path):
    out = tmp_path / "exp"
    main = hydra_app(SweepConfig, count, name="sweep_toy_e")
    main([f"out={out}", "progress=false"])  # an earlier single run in out
    before = sorted(p.name for p in out.iterdir())
    main([f"out={out}", "progress=false", "-m", "steps=1,3"])
    assert sorted(p.name for p in out.iterdir()) == before  # nothing written inside the earlier run
    jobs = read_sweep(tmp_path / "exp-1")
    assert [j["result"]["n"] for j in jobs] == [8, 24]
    assert [j["result"]["out"] for j in jobs] == [str(tmp_path / "exp-1" / "steps=1"), str(tmp_path / "exp-1" / "steps=3")]
    main([f"out={out}", "progress=false", "-m", "steps=2"])  # a second sweep: not into the first
    assert [j["result"]["n"] for j in read_sweep(tmp_path / "exp-2")] == [16]
    assert len(read_sweep(tmp_path / "exp-1")) == 2


def _append_many(args: tuple[str, int]) -> None:
    folder, worker = args
    from pathlib import Path

    for k in range(25):
        append_sweep_line(Path(folder), [f"worker={worker}", f"k={k}"], {"blob": "x" * 5000, "k": k})


def test_sweep_lines_from_parallel_jobs_are_all_kept(tmp_path):
    """Eight processes append at once (as a joblib launcher's jobs do): 200 whole lines."""
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        pool.map(_append_many, [(str(tmp_path), w) for w in range(8)])
    jobs = read_sweep(tmp_path)
    assert len(jobs) == 200
    assert sorted(tuple(j["overrides"]) for j in jobs) == sorted(
        (f"worker={w}", f"k={k}") for w in range(8) for k in range(25))
    assert not list(tmp_path.glob("*.json"))  # JSON lines only: nothing a *.json merger would pick up
    assert (tmp_path / SWEEP_FILE).is_file()


def test_changed_settings_names_what_a_resume_would_change(tmp_path):
    from tdrl.core.train import changed_settings

    cfg = SweepConfig(out=str(tmp_path / "r"), steps=3, progress=False)
    count(cfg)
    same = SweepConfig(out=str(tmp_path / "r"), steps=3, resume=True)
    assert changed_settings(tmp_path / "r", same, ignore=("resume", "progress")) == {}
    other = SweepConfig(out=str(tmp_path / "r"), steps=5, width=4, resume=True)
    assert changed_settings(tmp_path / "r", other, ignore=("resume", "progress")) == {
        "steps": (3, 5), "width": (8, 4)}
    assert changed_settings(tmp_path / "none", other) == {}  # no earlier run: nothing to compare
