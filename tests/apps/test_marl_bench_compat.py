"""apps/marl_bench as a BenchMARL user meets it: no silent settings, outputs their loader reads.

* recipe values never override the user's keys (``-cn tiny n_iters=3`` runs 3 iterations);
* ``+key=value`` for a key the config lacks, a key the app does not read (``out_dir``), a
  BenchMARL key with no tdrl meaning, and ``resume=true`` with changed settings are refused,
  naming the key, before any training;
* BenchMARL's spellings (``task=vmas/balance``, ``algorithm=mappo``, ``experiment.lr``,
  ``algorithm.share_param_critic``) mean what they mean there;
* a ``-m`` sweep's folder, read with the logic of BenchMARL's ``get_raw_dict_from_multirun_folder``
  (``benchmarl/eval_results.py`` at 179a956: every ``*.json`` under the folder whose name lacks
  ``wandb``, merged by a recursive dict update), gives marl-eval's layout with per-group returns.
"""

from __future__ import annotations

import collections.abc
import csv
import json
import os

import pytest

from _load import REPO, load_app
from tdrl.core.train import read_sweep
from tdrl.marl.benchmarl_names import REFUSED, RENAMED, BenchmarlNameError, markdown_table, translate_overrides


@pytest.fixture(scope="module")
def app():
    return load_app("marl_bench", "run.py")


SMALL = ["-cn", "tiny", "task=vmas/balance", "num_envs=2", "frames_per_batch=8", "minibatch_size=8",
         "eval_envs=1", "max_steps=4", "num_cells=[8]"]
TINY = [*SMALL, "algorithm=mappo"]


def test_the_users_keys_win_over_the_tiny_recipe(app, tmp_path):
    app.main([*TINY, "n_iters=3", f"out={tmp_path / 'r'}"])
    rows = list(csv.DictReader(open(tmp_path / "r" / "evaluations.csv")))
    assert [r["iter"] for r in rows] == ["0", "1", "2"]  # tiny alone would run 2
    cfg = app.main.load(["n_iters=100", "num_envs=3"], recipe="tiny")
    assert (cfg.n_iters, cfg.num_envs, cfg.frames_per_batch) == (100, 3, 80)  # the rest: tiny's sizes


@pytest.mark.parametrize("args, named", [
    (["+n_seeds=3", "algorithm=mappo"], r"no setting 'n_seeds'"),
    (["+foo=bar"], r"no setting 'foo'"),
    (["out_dir=elsewhere"], r"out_dir is not a setting.*use out=DIR"),
    (["eval_every=5"], r"eval_every is not a setting.*eval_interval"),
    (["experiment.max_n_frames=60000"], r"experiment.max_n_frames is not a setting here: use n_iters"),
    (["task.n_agents=5"], r"task.n_agents has no tdrl setting.*YAML values"),
    (["algorithm.share_param_critic=false", "algorithm=qmix"], r"share_param_critic=False.*qmix"),
])
def test_settings_that_would_be_ignored_are_refused_naming_the_key(app, tmp_path, capsys, args, named):
    out = tmp_path / "never"
    with pytest.raises(SystemExit) as info:
        app.main([*SMALL, *args, f"out={out}"])
    assert info.value.code == 2
    assert pytest.importorskip("re").search(named, capsys.readouterr().err)
    assert not out.exists()  # refused before the run folder


def test_help_lists_no_key_the_app_ignores(app, capsys):
    app.main(["--help"])
    text = capsys.readouterr().out
    for dead in ("out_dir:", "eval_every:", "checkpoint_every:", "time_limit_s:"):
        assert dead not in text
    assert "eval_interval:" in text and "share_param_critic:" in text


def test_resume_with_changed_settings_is_refused_naming_them(app, tmp_path, capsys):
    out = tmp_path / "r"
    app.main([*TINY, "n_iters=1", f"out={out}"])
    before = (out / "results.md").read_text()
    with pytest.raises(SystemExit) as info:
        app.main([*TINY, "n_iters=1", f"out={out}", "resume=true", "lr=0.1"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "lr: 5e-05 -> 0.1" in err and str(out) in err
    assert (out / "results.md").read_text() == before  # nothing rewritten
    again = app.main([*TINY, "n_iters=1", f"out={out}", "resume=true"])  # same settings: read back
    assert again["evaluations"] == 1


def test_benchmarl_spellings_mean_the_same(app):
    cfg = app.main.load(["task=vmas/balance", "algorithm=mappo", "experiment.lr=0.001", "seed=3",
                         "algorithm.share_param_critic=false", "experiment.on_policy_collected_frames_per_batch=600",
                         "experiment.max_n_iters=7"])
    assert (cfg.tasks, cfg.algorithms, cfg.lr, cfg.seeds) == (("balance",), ("mappo",), 0.001, (3,))
    assert (cfg.share_param_critic, cfg.frames_per_batch, cfg.n_iters) == (False, 600, 7)
    assert app.main.load(["task=pettingzoo/simple_tag"]).tasks == ("pettingzoo/simple_tag",)
    # one mapping, flags and sweeps pass through
    assert translate_overrides(["-m", "experiment.lr=1e-4,1e-3", "-cn", "tiny"]) == ["-m", "lr=1e-4,1e-3", "-cn", "tiny"]
    lstm = app.main.load(["algorithm=mappo", "model=layers/lstm", "critic_model=layers/lstm", "model.hidden_size=64"])
    assert (lstm.recurrent, lstm.rnn, lstm.rnn_hidden) == (True, "lstm", 64)
    assert app.main.load(["model=layers/mlp"]).recurrent is False
    with pytest.raises(BenchmarlNameError, match="recurrent=true rnn=gru"):
        translate_overrides(["model=layers/gru"])  # BenchMARL's critic would stay an MLP: not the same
    with pytest.raises(BenchmarlNameError, match="layers/mlp, layers/gru, layers/lstm"):
        translate_overrides(["model=layers/gnn", "critic_model=layers/gnn"])
    table = markdown_table()
    assert all(f"`{k}`" in table for k in (*RENAMED, *REFUSED))
    readme = (REPO / "packages" / "marl" / "README.md").read_text()
    assert table in readme, "packages/marl/README.md: paste tdrl.marl.benchmarl_names.markdown_table() again"


def benchmarl_multirun_loader(folder) -> dict:
    """BenchMARL's ``get_raw_dict_from_multirun_folder`` as documented: every ``*.json`` under
    the folder (names with ``wandb`` left out), merged by a recursive dict update."""
    def update(d, u):
        for k, v in u.items():
            d[k] = update(d.get(k, {}), v) if isinstance(v, collections.abc.Mapping) else v
        return d

    merged: dict = {}
    for dirpath, _, names in os.walk(folder):
        for name in names:
            if name.endswith(".json") and "wandb" not in name:
                with open(os.path.join(dirpath, name)) as f:
                    update(merged, json.load(f))
    return merged


def test_a_sweep_folder_loads_in_benchmarls_multirun_loader(app, tmp_path):
    out = tmp_path / "exp"
    app.main([*TINY, "n_iters=1", f"out={out}"])  # an earlier run in out: the sweep goes beside it
    app.main([*TINY, "n_iters=2", f"out={out}", "-m", "task=vmas/simple_tag,pettingzoo/simple_spread",
              "seed=0,1"])
    sweep = tmp_path / "exp-1"
    assert len(read_sweep(sweep)) == 4 and not (out / "task=vmas").exists()
    data = benchmarl_multirun_loader(sweep)
    assert set(data) == {"vmas", "pettingzoo"}  # nothing but marl-eval's environments at the top
    runs = {"vmas": data["vmas"]["simple_tag"]["mappo"], "pettingzoo": data["pettingzoo"]["simple_spread"]["mappo"]}
    for env, seeds in runs.items():
        assert set(seeds) == {"seed_0", "seed_1"}
        for run in seeds.values():
            assert [run[f"step_{k}"]["step_count"] for k in (0, 1)] == [8, 16]
            assert run["absolute_metrics"]["return"][0] >= max(run["step_0"]["return"] + run["step_1"]["return"])
    step = runs["vmas"]["seed_0"]["step_0"]
    assert {"adversary_return", "agent_return", "return"} <= set(step)  # simple_tag: two groups
    assert step["return"][0] == pytest.approx((step["adversary_return"][0] + step["agent_return"][0]) / 2, abs=1e-5)
    assert set(runs["pettingzoo"]["seed_1"]["step_1"]) == {"step_count", "return", "agents_return"}
