"""benchmarks/marl_table.py: the tdrl and BenchMARL configs it builds agree on every shared field
(with the two documented formula mappings), its BenchMARL values equal BenchMARL's YAML (when
.venv-benchmarl exists), and the tdrl parts it builds carry them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from torch import nn

_ROOT = Path(__file__).resolve().parents[2]
_BENCH = _ROOT / "benchmarks" / "marl_table.py"
_BUDGET = dict(envs=60, frames_per_batch=6000, iters=10, epochs=4, minibatch=1000, optimizer_steps=100,
               train_batch=128, eval_episodes=10)


def _load():
    return importlib.import_module("benchmarks.marl_table")


bench = _load()


def _disagreements(algorithm: str, budget) -> list[str]:
    """Every shared field whose tdrl and BenchMARL values differ (empty: matched)."""
    over = bench.benchmarl_overrides(algorithm, budget)
    exp, alg, model = over["experiment"], over["algorithm"], over["model"]
    conf = bench.tdrl_configs(algorithm, budget, max_steps=100)
    a, t = conf["algorithm"], conf["train"]
    algorithm, cell = bench.split_algorithm(algorithm)
    pairs = [("gamma", a.gamma, exp["gamma"]), ("lr", t.lr, exp["lr"]), ("adam_eps", t.adam_eps, exp["adam_eps"]),
             ("n_iters", t.n_iters, exp["max_n_iters"]),
             ("num_cells", list(conf["num_cells"]), model["num_cells" if cell is None else "mlp_num_cells"]),
             ("continuous", conf["continuous"], exp["prefer_continuous_actions"]),
             ("recurrent", getattr(a, "recurrent", False), cell is not None)]
    if cell is not None:  # BenchMARL's layers/gru | lstm: the cell, its size, one layer, then the MLP
        pairs += [("cell", a.rnn, over["cell"]), ("hidden", a.rnn_hidden, model["hidden_size"]),
                  ("layers", 1, model["n_layers"])]
    if algorithm not in bench.ON_POLICY:
        pairs += [
            ("frames", t.frames_per_batch, exp["off_policy_collected_frames_per_batch"]),
            ("envs", budget.envs, exp["off_policy_n_envs_per_worker"]),
            ("steps", t.n_optimizer_steps, exp["off_policy_n_optimizer_steps"]),
            ("batch", t.minibatch_size, exp["off_policy_train_batch_size"]),
            ("buffer", t.buffer_size, exp["off_policy_memory_size"]),
            ("tau", a.tau if exp["soft_target_update"] else None, exp["polyak_tau"]),
        ]
    if algorithm in ("maddpg", "iddpg", "masac", "isac", "iql"):  # TorchRL's (x-y)^2 as "mse": the same clip
        pairs += [("clip", t.max_grad_norm, exp["clip_grad_val"]),
                  ("loss (TorchRL's l2 is tdrl's mse)", a.loss_function, {"l2": "mse"}[alg["loss_function"]]),
                  ("target net", True, alg.get("delay_value", alg.get("delay_qvalue")))]
    if algorithm == "iql":
        pairs += [("eps_init", a.eps_init, exp["exploration_eps_init"]), ("eps_end", a.eps_end, exp["exploration_eps_end"]),
                  ("eps_anneal", a.eps_anneal_frames, exp["exploration_anneal_frames"]),
                  ("shared", a.share_params, exp["share_policy_params"])]
    if algorithm in ("maddpg", "iddpg", "masac", "isac"):
        pairs += [("shared actor", a.share_param_actor, exp["share_policy_params"]),
                  ("shared critic", a.share_param_critic, alg["share_param_critic"]),
                  ("centralised critic", a.centralised_critic, algorithm in ("maddpg", "masac"))]
    if algorithm in ("maddpg", "iddpg"):
        pairs += [("sigma_init", a.sigma_init, exp["exploration_eps_init"]), ("sigma_end", a.sigma_end, exp["exploration_eps_end"]),
                  ("sigma_anneal", a.sigma_anneal_frames, exp["exploration_anneal_frames"])]
    if algorithm in ("masac", "isac"):
        pairs += [("critics", a.num_qvalue_nets, alg["num_qvalue_nets"]), ("alpha_init", a.alpha_init, alg["alpha_init"]),
                  ("min_alpha", a.min_alpha, alg["min_alpha"]), ("max_alpha", a.max_alpha, alg["max_alpha"]),
                  ("fixed_alpha", a.fixed_alpha, alg["fixed_alpha"]), ("target_entropy", a.target_entropy, alg["target_entropy"])]
    if algorithm == "qmix":
        pairs += [
            ("clip (tdrl's loss is 0.5x TorchRL's)", 2 * t.max_grad_norm, exp["clip_grad_val"]),
            ("eps_init", a.eps_init, exp["exploration_eps_init"]), ("eps_end", a.eps_end, exp["exploration_eps_end"]),
            ("eps_anneal", a.eps_anneal_frames, exp["exploration_anneal_frames"]),
            ("mixer", a.mixing_embed_dim, alg["mixing_embed_dim"]), ("loss", a.loss_function, alg["loss_function"]),
            ("target net", True, alg["delay_value"]), ("shared", a.share_params, exp["share_policy_params"]),
            ("hypernets (TorchRL's one layer)", a.hypernet_hidden, None),
        ]
    if algorithm in bench.ON_POLICY:
        pairs += [
            ("frames", t.frames_per_batch, exp["on_policy_collected_frames_per_batch"]),
            ("envs", budget.envs, exp["on_policy_n_envs_per_worker"]),
            ("epochs", t.num_epochs, exp["on_policy_n_minibatch_iters"]),
            ("minibatch", t.minibatch_size, exp["on_policy_minibatch_size"]),
            ("clip", t.max_grad_norm, exp["clip_grad_val"]),
            ("lmbda", a.lmbda, alg["lmbda"]), ("clip_epsilon", a.clip_epsilon, alg["clip_epsilon"]),
            ("entropy", a.entropy_coef, alg["entropy_coef"]),
            ("critic_coef (tdrl's l2 is 0.5x TorchRL's)", a.critic_coef, 2 * alg["critic_coef"]),
            ("critic loss", a.loss_critic_type, alg["loss_critic_type"]),
            ("shared actor", a.share_param_actor, exp["share_policy_params"]),
            ("shared critic", a.share_param_critic, alg["share_param_critic"]),
            ("advantage per batch", a.normalize_advantage or False, alg["minibatch_advantage"]),
            ("centralised critic", a.centralised_critic, algorithm == "mappo"),
        ]
    return [f"{name}: tdrl {x!r} vs BenchMARL {y!r}" for name, x, y in pairs if x != y]


@pytest.mark.parametrize("algorithm", ["mappo", "ippo", "qmix", "maddpg", "iddpg", "masac", "isac", "iql",
                                       "mappo_gru", "ippo_lstm", "qmix_gru", "qmix_lstm"])
def test_both_sides_get_the_same_config(algorithm):
    budget = bench.Budget(**_BUDGET)
    assert _disagreements(algorithm, budget) == []
    assert budget.anneal_frames == 20_000  # BenchMARL's rule: a third of 60k frames


def test_a_mismatched_field_is_caught(monkeypatch):
    budget = bench.Budget(**_BUDGET)
    real = bench.benchmarl_overrides

    def skewed(algorithm, b):
        out = real(algorithm, b)
        out["algorithm"]["lmbda"] = 0.95
        out["experiment"]["on_policy_minibatch_size"] = 400
        return out

    monkeypatch.setattr(bench, "benchmarl_overrides", skewed)
    assert _disagreements("mappo", budget) == ["minibatch: tdrl 1000 vs BenchMARL 400",
                                               "lmbda: tdrl 0.9 vs BenchMARL 0.95"]


def test_bad_budget_and_algorithm_are_refused():
    with pytest.raises(ValueError, match="minibatch .* must divide frames_per_batch"):
        bench.Budget(**{**_BUDGET, "minibatch": 700})
    with pytest.raises(ValueError, match="Budget.iters must be >= 1"):
        bench.Budget(**{**_BUDGET, "iters": 0})
    with pytest.raises(ValueError, match="Unknown algorithm 'vdn'"):
        bench.benchmarl_overrides("vdn", bench.Budget(**_BUDGET))


def test_tdrl_parts_carry_the_matched_config():
    pytest.importorskip("vmas")
    from tdrl.marl.algorithms import make_mappo, make_qmix
    from tdrl.marl.envs import VmasEnv

    t = bench.benchmarl_task("navigation")
    budget = bench.Budget(**_BUDGET)
    q = bench.tdrl_configs("qmix", budget, t["max_steps"])
    env = VmasEnv(t["scenario"], num_envs=2, continuous_actions=False, max_steps=t["max_steps"], seed=0, **t["kwargs"])
    parts = make_qmix(env, q["algorithm"], num_cells=q["num_cells"])
    assert isinstance(parts.loss.mixer.hyper_w1, nn.Linear) and parts.loss.mixer.embed_dim == 32
    assert parts.explore.eps == 0.8 and parts.explore.num_steps == 20_000
    m = bench.tdrl_configs("mappo", budget, t["max_steps"])
    env = VmasEnv(t["scenario"], num_envs=2, max_steps=t["max_steps"], seed=0, **t["kwargs"])
    ppo = make_mappo(env, m["algorithm"], num_cells=m["num_cells"])
    assert ppo.loss.config.critic_coef == 2.0 and ppo.loss.config.lmbda == 0.9


def _benchmarl_conf() -> Path | None:
    found = sorted((_ROOT / ".venv-benchmarl").glob("lib/python*/site-packages/benchmarl/conf"))
    return found[0] if found else None


@pytest.mark.skipif(_benchmarl_conf() is None, reason="no .venv-benchmarl (benchmarks/setup_benchmarl.sh)")
def test_benchmarl_values_are_benchmarls_yaml():
    yaml = pytest.importorskip("yaml")
    conf = _benchmarl_conf()
    read = lambda rel: yaml.safe_load((conf / rel).read_text())  # noqa: E731
    experiment = read("experiment/base_experiment.yaml")
    assert {k: experiment[k] for k in bench.EXPERIMENT} == bench.EXPERIMENT
    for name in ("mappo", "ippo"):
        yml = read(f"algorithm/{name}.yaml")
        assert {k: yml[k] for k in bench.PPO} == bench.PPO
    for name, values in bench.OFF_POLICY_CONF.items():
        yml = read(f"algorithm/{name}.yaml")
        assert {k: yml[k] for k in values} == values, name
    mlp = read("model/layers/mlp.yaml")
    assert tuple(mlp["num_cells"]) == bench.MLP["num_cells"] and mlp["activation_class"] == "torch.nn.Tanh"
    for cell in bench.CELLS:
        yml = read(f"model/layers/{cell}.yaml")
        assert {k: yml[k] for k in bench.RNN} == bench.RNN and tuple(yml["mlp_num_cells"]) == bench.MLP["num_cells"]
        assert yml["mlp_activation_class"] == "torch.nn.Tanh"


def test_finished_seeds_are_appended_and_reused(tmp_path, monkeypatch):
    """A seed finished by one invocation is not rerun by the next one (the table is filled in
    pieces); another budget or --fresh reruns it; a corrupt line is named."""
    calls = []

    def fake(side):
        def run(task, algorithm, budget, seed, device="cpu"):
            calls.append((side, task, algorithm, seed))
            return {"frames": 600, "wall_s": 1.0 + seed, "cpu_s": 1.0, "return": float(seed)}
        return run

    monkeypatch.setattr(bench, "run_tdrl", fake("tdrl"))
    monkeypatch.setattr(bench, "benchmarl_subprocess", lambda *a: fake("benchmarl")(*a))
    monkeypatch.setattr(bench, "BENCHMARL_PY", tmp_path)  # exists: the side-by-side path runs
    runs = tmp_path / "runs.jsonl"
    argv = ["--tasks", "wheel", "--algorithms", "qmix", "--runs", str(runs), "--iters", "10"]
    bench.main([*argv, "--seeds", "0", "1"])
    assert [c[3] for c in calls] == [0, 0, 1, 1]
    assert len(runs.read_text().splitlines()) == 2
    calls.clear()
    bench.main([*argv, "--seeds", "0", "1", "2"])
    assert calls == [("tdrl", "wheel", "qmix", 2), ("benchmarl", "wheel", "qmix", 2)]
    loaded = bench.load_runs(runs)
    assert sorted(bench.json.loads(k)[2] for k in loaded) == [0, 1, 2]
    calls.clear()
    bench.main([*argv, "--seeds", "0", "--iters", "3"])  # another budget: not the same run
    bench.main([*argv, "--seeds", "0", "--fresh"])
    assert [c[3] for c in calls] == [0, 0, 0, 0]
    runs.write_text(runs.read_text() + "{not json\n")
    with pytest.raises(SystemExit, match=r"runs.jsonl:6: not a marl_table run record"):
        bench.load_runs(runs)


def test_rows_at_another_budget_are_named_apart():
    """A row measured at a non-default budget names the fields it changes, so that recording
    it does not replace the default budget's row of the same pair."""
    assert bench.row_name("navigation", "mappo", bench.Budget()) == "MAPPO navigation"
    assert bench.row_name("balance", "qmix", bench.Budget(eval_episodes=200)) == "QMIX balance, eval_episodes 200"
    assert (bench.row_name("wheel", "ippo", bench.Budget(iters=5, eval_episodes=20))
            == "IPPO wheel, iters 5, eval_episodes 20")
    # so does a row measured on a GPU: it sits beside the CPU one instead of replacing it
    assert bench.row_name("navigation", "mappo", bench.Budget(), device="cuda") == "MAPPO navigation, device cuda"


def test_time_limit_terminates_is_kept_apart(tmp_path):
    """--time-limit-terminates runs are cached and named apart from the default semantics."""
    b = bench.Budget()
    assert bench.row_name("balance", "qmix", b, True) == "QMIX balance, time limit terminates"
    assert bench._run_key("balance", "qmix", 0, b, "cpu") != bench._run_key("balance", "qmix", 0, b, "cpu", True)
    runs = tmp_path / "runs.jsonl"
    r = {"frames": 1, "wall_s": 1.0, "cpu_s": 1.0, "return": 0.0}
    bench.append_run(runs, "balance", "qmix", 0, b, "cpu", r, r)
    bench.append_run(runs, "balance", "qmix", 0, b, "cpu", r, r, True)
    assert set(bench.load_runs(runs)) == {bench._run_key("balance", "qmix", 0, b, "cpu"),
                                          bench._run_key("balance", "qmix", 0, b, "cpu", True)}
    assert "Not matched" in bench.budget_note(b) and "Not matched" not in bench.budget_note(b, True)


def test_time_limit_variant_reuses_the_benchmarl_side(tmp_path, monkeypatch):
    """A --time-limit-terminates seed reruns only the tdrl side when the default variant's
    record holds BenchMARL's run of that seed (the flag does not touch BenchMARL), and the
    reused run is the recorded one; --fresh reruns both sides."""
    calls = []

    def tdrl(task, algorithm, budget, seed, device="cpu", time_limit_terminates=False):
        calls.append(("tdrl", seed, time_limit_terminates))
        return {"frames": 600, "wall_s": 1.0, "cpu_s": 1.0, "return": 10.0 + seed}

    def peer(task, algorithm, budget, seed, device):
        calls.append(("benchmarl", seed))
        return {"frames": 600, "wall_s": 2.0, "cpu_s": 2.0, "return": -float(seed)}

    monkeypatch.setattr(bench, "run_tdrl", tdrl)
    monkeypatch.setattr(bench, "benchmarl_subprocess", peer)
    monkeypatch.setattr(bench, "BENCHMARL_PY", tmp_path)
    runs = tmp_path / "runs.jsonl"
    argv = ["--tasks", "balance", "--algorithms", "qmix", "--runs", str(runs), "--iters", "10"]
    bench.main([*argv, "--seeds", "3"])
    assert calls == [("tdrl", 3, False), ("benchmarl", 3)]
    calls.clear()
    bench.main([*argv, "--seeds", "3", "4", "--time-limit-terminates"])
    assert calls == [("tdrl", 3, True), ("tdrl", 4, True), ("benchmarl", 4)]
    b = bench.Budget(iters=10)
    loaded = bench.load_runs(runs)
    assert loaded[bench._run_key("balance", "qmix", 3, b, "cpu", True)]["benchmarl"]["return"] == -3.0
    assert bench.peer_run(loaded, "balance", "qmix", 5, b, "cpu") is None
    calls.clear()
    bench.main([*argv, "--seeds", "3", "--time-limit-terminates", "--fresh"])
    assert calls == [("tdrl", 3, True), ("benchmarl", 3)]
