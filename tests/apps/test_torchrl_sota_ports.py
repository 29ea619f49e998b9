"""TorchRL's SOTA DQN (sota-implementations/dqn/dqn_cartpole.py) and SAC (sota-implementations/sac)
scripts ported to tdrl with only their imports changed (apps/examples/torchrl_dqn,
apps/examples/torchrl_sac): each runs at a CI budget and learns at a stated threshold."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from _load import REPO

# the script run as `python script.py` does (its folder on sys.path), with torch seeded first
RUNNER = ("import runpy, sys, torch; torch.manual_seed(0); sys.argv = sys.argv[1:]; "
          "sys.path.insert(0, sys.argv[0].rsplit('/', 1)[0]); runpy.run_path(sys.argv[0], run_name='__main__')")


def run_port(script, tmp_path, *overrides, timeout=600):
    proc = subprocess.run([sys.executable, "-c", RUNNER, str(script), *overrides, f"hydra.run.dir={tmp_path}"],
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (csv,) = list(tmp_path.rglob("metrics.csv"))
    lines = csv.read_text().splitlines()
    header = lines[0].split(",")
    rows = [dict(zip(header, line.split(","))) for line in lines[1:]]
    return header, rows


def column(rows, name):
    return [float(r[name]) for r in rows if r.get(name) not in (None, "", "nan")]


def imports_no_torchrl(folder, *names):
    for name in names:
        tree = ast.parse((folder / name).read_text())
        assert not any((n.module or "").startswith("torchrl") for n in ast.walk(tree) if isinstance(n, ast.ImportFrom))
        assert not any(a.name.startswith("torchrl") for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names)


DQN = REPO / "apps" / "examples" / "torchrl_dqn"


def test_the_sota_dqn_script_runs_on_a_tiny_budget(tmp_path):
    """Random frames, then updates (DQNLoss, HardUpdate, EGreedyModule annealed), evaluation and
    TorchRL's metric names in the CSV."""
    imports_no_torchrl(DQN, "dqn_cartpole.py", "utils_cartpole.py")
    header, rows = run_port(DQN / "dqn_cartpole.py", tmp_path, "collector.total_frames=3000",
                            "collector.init_random_frames=1000", "loss.num_updates=5",
                            "logger.test_interval=1000", "logger.num_test_episodes=1", timeout=300)
    assert {"train/episode_reward", "train/q_loss", "train/q_values", "train/epsilon", "eval/reward",
            "time/update", "time/collecting"} <= set(header)
    eps = column(rows, "train/epsilon")
    assert eps == sorted(eps, reverse=True) and eps[-1] < 1.0  # annealed by greedy_module.step
    assert column(rows, "eval/reward")


def test_the_sota_dqn_script_learns_cartpole_at_a_ci_budget(tmp_path):
    """TorchRL's settings with 20,000 frames (5,000 random, epsilon annealed over 10,000), torch
    seeded 0: the greedy evaluation return passes 60 (a random policy lasts ~22 steps)."""
    _, rows = run_port(DQN / "dqn_cartpole.py", tmp_path, "collector.total_frames=20000",
                       "collector.annealing_frames=10000", "collector.init_random_frames=5000",
                       "logger.test_interval=5000", "logger.num_test_episodes=3")
    evals = column(rows, "eval/reward")
    assert len(evals) >= 3 and max(evals) > 60, evals


@pytest.mark.slow
def test_the_sota_dqn_script_learns_cartpole(tmp_path):
    """40,000 frames (5,000 random, epsilon annealed over 20,000), torch seeded 0: evaluation
    returns 93 / 148 / 154 at 11k / 21k / 31k frames measured here (random ~22); past 120."""
    _, rows = run_port(DQN / "dqn_cartpole.py", tmp_path, "collector.total_frames=40000",
                       "collector.annealing_frames=20000", "collector.init_random_frames=5000",
                       "logger.test_interval=10000", "logger.num_test_episodes=3")
    evals = column(rows, "eval/reward")
    assert len(evals) >= 3 and max(evals) > 120, evals


SAC = REPO / "apps" / "examples" / "torchrl_sac"
PENDULUM = ("env.name=Pendulum-v1", "env.max_episode_steps=200", "collector.env_per_collector=1")


def test_the_sota_sac_script_runs_on_a_tiny_budget(tmp_path):
    """Two envs in worker processes (ParallelEnv), random frames, then updates (SACLoss, the
    grouped Adams, SoftUpdate(eps=)), deterministic evaluation and TorchRL's metric names."""
    imports_no_torchrl(SAC, "sac.py", "utils.py")
    header, rows = run_port(SAC / "sac.py", tmp_path, *PENDULUM[:2], "collector.env_per_collector=2",
                            "collector.total_frames=2000", "collector.init_random_frames=1000",
                            "optim.utd_ratio=0.01", "logger.eval_iter=1000", timeout=300)
    assert {"train/reward", "train/q_loss", "train/actor_loss", "train/alpha_loss", "train/alpha",
            "train/entropy", "eval/reward", "time/update"} <= set(header)
    assert len(column(rows, "eval/reward")) == 2 and column(rows, "train/alpha")[-1] < 1.0  # alpha_init 1, learned


@pytest.mark.slow  # ~80 s: SAC's CI-sized learning proof is tests/core/test_learning_sac.py (~40 s)
def test_the_sota_sac_script_learns_pendulum_at_a_ci_budget(tmp_path):
    """TorchRL's settings on Pendulum-v1 with a CI budget: 8,000 frames (1,000 random), 64x64
    networks, batch 128, seed 42 (the config's): the deterministic evaluation return climbs
    past -600. The run repeats exactly since the evaluation env, which the script never seeds, takes
    its seed from torch's generator (issue 40; before, its first return moved between -1946 and
    -1266 from run to run): -1500, -1786, -1036, -1193, -1269, -1027, -625, -257 at 1k..8k frames,
    the same in three runs here (~60-130 s of CPU)."""
    _, rows = run_port(SAC / "sac.py", tmp_path, *PENDULUM, "collector.total_frames=8000",
                       "collector.init_random_frames=1000", "collector.frames_per_batch=500",
                       "network.hidden_sizes=[64,64]", "optim.batch_size=128", "logger.eval_iter=1000")
    evals = column(rows, "eval/reward")
    # learned: the best of the last three evaluations passes -600 and is 500 above the first one
    # (measured: best of the last three -257, first -1500; the margins allow another CPU's round-off)
    assert len(evals) == 8 and max(evals[-3:]) > -600 and max(evals[-3:]) > evals[0] + 500, evals


@pytest.mark.slow
@pytest.mark.timeout(1500)  # ~4 min on an idle core; the suite's 600 s default cut it on a loaded box
def test_the_sota_sac_script_learns_pendulum(tmp_path):
    """TorchRL's own SAC settings (256x256 networks, batch 256, one update per frame, alpha 1,
    polyak 0.995) on Pendulum-v1 for 15,000 frames (5,000 random), seed 42: the deterministic
    evaluation return goes -1830 / -1.3 / -0.9 at 5k / 10k / 15k frames (the same in two runs
    here since issue 40's seeding; ~2.5-4 min of CPU on one core); past -400 at the end."""
    _, rows = run_port(SAC / "sac.py", tmp_path, *PENDULUM, "collector.total_frames=15000",
                       "collector.init_random_frames=5000", "logger.eval_iter=5000", timeout=900)
    evals = column(rows, "eval/reward")
    assert len(evals) == 3 and evals[0] < -1000 and evals[-1] > -400, evals
