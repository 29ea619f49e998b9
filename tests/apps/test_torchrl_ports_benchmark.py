"""benchmarks/torchrl_ports.py (TorchRL's SOTA scripts beside tdrl's ports): its arguments, its
refusals of a missing TorchRL interpreter or scripts folder, the overrides both sides run with, and
the readers of both loggers' CSVs. Nothing of TorchRL runs here."""

from __future__ import annotations

import importlib
import sys

import pytest
from omegaconf import OmegaConf

from _load import REPO

bench = importlib.import_module("benchmarks.torchrl_ports")


def test_a_missing_torchrl_python_is_refused_with_what_to_give(tmp_path):
    with pytest.raises(SystemExit, match="no such interpreter.*torchrl 0.14"):
        bench.main(["--torchrl-python", str(tmp_path / "nope" / "python"), "--torchrl-scripts", str(tmp_path)])


def test_no_scripts_folder_is_refused_with_how_to_fetch_it():
    with pytest.raises(SystemExit, match="--torchrl-scripts is required.*git clone https://github.com/pytorch/rl"):
        bench.main(["--torchrl-python", sys.executable])


def test_a_folder_without_the_named_scripts_is_refused_naming_them(tmp_path):
    (tmp_path / "dqn").mkdir()
    (tmp_path / "dqn" / "dqn_cartpole.py").write_text("")
    with pytest.raises(SystemExit) as exc:
        bench.main(["--torchrl-python", sys.executable, "--torchrl-scripts", str(tmp_path),
                    "--scripts", "dqn", "sac", "ppo_mujoco"])
    msg = str(exc.value)
    assert "missing sac/sac.py, ppo/ppo_mujoco.py." in msg and "dqn_cartpole" not in msg.split("missing")[1]


def test_an_unknown_script_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as exc:
        bench.main(["--scripts", "td3"])
    assert exc.value.code == 2 and "invalid choice: 'td3'" in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(bench.SCRIPTS))
def test_every_override_names_a_key_of_the_ports_config(name):
    """The overrides (and the seed key) exist in the port's YAML, which keeps TorchRL's keys."""
    spec = bench.SCRIPTS[name]
    port = REPO / spec.port
    (yaml,) = [p for p in port.parent.glob("config*.yaml")]
    cfg = OmegaConf.load(yaml)
    keys = [o.split("=", 1)[0] for o in spec.overrides] + ([spec.seed_key] if spec.seed_key else [])
    missing = [k for k in keys + ["logger.backend"] if OmegaConf.select(cfg, k, default="<absent>") == "<absent>"]
    assert not missing, missing


def test_both_loggers_csvs_are_read_to_frames_and_returns(tmp_path):
    ours = tmp_path / "tdrl" / "dqn" / "DQN_x"
    ours.mkdir(parents=True)
    (ours / "metrics.csv").write_text("step,train/reward,eval/reward\n1000,12.0,\n5000,20.0,31.5\n10000,,140.25\n")
    assert bench.read_evals(tmp_path / "tdrl") == [(5000, 31.5), (10000, 140.25)]
    theirs = tmp_path / "torchrl" / "dqn" / "DQN_y" / "scalars" / "eval"
    theirs.mkdir(parents=True)
    (theirs / "reward.csv").write_text("6000,10.0\n11000,156.66\n")
    assert bench.read_evals(tmp_path / "torchrl") == [(6000, 10.0), (11000, 156.66)]
    assert bench.read_evals(tmp_path / "empty") == []


def test_the_error_shown_is_the_tracebacks_last_named_error():
    stderr = ("  6%|6  | 500/8000\nTraceback (most recent call last):\n  File \"x.py\", line 1\n"
              "TypeError: float() argument must be a string or a real number, not 'list'\n\n"
              "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.\n")
    assert bench.last_error(stderr) == "TypeError: float() argument must be a string or a real number, not 'list'"
    assert bench.last_error("killed\n") == "killed" and bench.last_error("") == "(no output)"


def test_a_script_runs_from_its_folder_with_its_sibling_modules_and_the_seed(tmp_path):
    """``run_side`` executes a script as ``python script.py`` would (TorchRL's SOTA scripts import
    their sibling ``utils`` module), from any working directory, with torch seeded."""
    folder = tmp_path / "sota"
    folder.mkdir()
    (folder / "helper_mod.py").write_text("VALUE = 7\n")
    (folder / "main_script.py").write_text(
        "import pathlib, torch\nfrom helper_mod import VALUE\n"
        "(pathlib.Path(__file__).parent / 'out.txt').write_text(f'{VALUE} {torch.rand(1).item():.6f}')\n")
    evals, _, err = bench.run_side(sys.executable, folder / "main_script.py", [], 3, tmp_path / "run", "",
                                   bench.side_env(None), 60)
    import torch

    torch.manual_seed(3)
    assert err is None and evals == []
    assert (folder / "out.txt").read_text() == f"7 {torch.rand(1).item():.6f}"
