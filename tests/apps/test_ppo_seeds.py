"""apps/ppo with n_seeds: several seeds as one vectorised model. A seed's run does not depend
on the other seeds' data, per-seed metrics are written, and configs that would mix the seeds
are refused."""

from __future__ import annotations

import json

import pytest
import torch

from _load import load_app, read_rows  # noqa: E402


@pytest.fixture(scope="module")
def ppo():
    return load_app("ppo")


def _seed0_params(path) -> dict[str, torch.Tensor]:
    state = torch.load(path / "model.pt", weights_only=True)
    return {f"{net}.{k}": v[0] for net in ("actor", "critic") for k, v in state[net].items()}


@pytest.mark.parametrize("env_id,extra", [("CartPole-v1", []), ("Pendulum-v1", ["norm_obs=false"])])
def test_a_seed_does_not_depend_on_the_other_seeds(ppo, tmp_path, env_id, extra):
    """Seeds [0, 1] and [0, 5] in one process: seed 0's per-iteration returns, evaluation and
    final weights are the same in both runs (nothing is pooled across seeds: advantage
    normalisation, reward scaling, clipping and Adam are per seed; one generator draws for both
    blocks in the same positions), while the second seed's differ."""
    runs = {}
    for other in (1, 5):
        out = tmp_path / f"with{other}"
        cfg = ppo.main.load([f"env_id={env_id}", f"out={out}", "gae_backend=torch", "n_seeds=2", *extra],
                            recipe="tiny")
        summary = ppo.train(cfg, seeds=[0, other])
        assert summary["seeds"] == [0, other] and len(summary["eval_return_seeds"]) == 2
        runs[other] = (summary, read_rows(out / "metrics.csv"), _seed0_params(out), out)
    (s1, rows1, p1, out1), (s5, rows5, p5, out5) = runs[1], runs[5]
    col = "train_return/seed_0"
    assert [r[col] for r in rows1 if r.get(col)] == [r[col] for r in rows5 if r.get(col)]
    assert any(r.get(col) for r in rows1) or env_id == "Pendulum-v1"  # 200-step episodes: none end here
    assert s1["eval_return_seeds"][0] == s5["eval_return_seeds"][0]
    for name, value in p1.items():
        torch.testing.assert_close(value, p5[name], rtol=0, atol=1e-6, msg=name)
    other1 = torch.load(out1 / "model.pt", weights_only=True)["critic"]
    other5 = torch.load(out5 / "model.pt", weights_only=True)["critic"]
    assert any(not torch.allclose(other1[k][1], other5[k][1]) for k in other1)  # the second seed differs
    # the means over seeds are logged beside the per-seed values
    saved = json.loads((out1 / "summary.json").read_text())
    assert saved["eval_return"] == pytest.approx(sum(saved["eval_return_seeds"]) / 2)
    assert "eval_return/seed_1" in rows1[-1]
    if env_id == "CartPole-v1":  # eval_only rebuilds the stacked actor from the last checkpoint
        cfg = ppo.main.load([f"out={out5}", "n_seeds=2", "seed=0", "eval_only=true"], recipe="tiny")
        assert ppo.run_app(cfg)["eval_return_seeds"][0] == s5["eval_return_seeds"][0]


def test_seeds_follow_the_seed_so_sweeps_compose(ppo):
    cfg = ppo.main.load(["seed=3", "n_seeds=2"], recipe="tiny")
    assert ppo.run_seeds(cfg) == [3, 4]  # -m seed=0,2 n_seeds=2 runs seeds 0-1 and 2-3
    assert ppo.run_seeds(ppo.main.load([], recipe="tiny")) == [0]


def test_configs_that_would_mix_seeds_are_refused(ppo, tmp_path):
    with pytest.raises(ValueError, match="norm_obs=true: the running observation statistics would be shared"):
        ppo.main.load(["n_seeds=2", "norm_obs=true"])
    with pytest.raises(ValueError, match="n_seeds=0"):
        ppo.main.load(["n_seeds=0"])
    with pytest.raises(ValueError, match="one generator for every sub-env would be shared by the 2 seeds"):
        ppo.main.load(["n_seeds=2", "env_id=tdrl/Pendulum", "norm_obs=false"])
    cfg = ppo.main.load(["env_id=Pendulum-v1", f"out={tmp_path}", "n_seeds=2"], recipe="tiny")
    with pytest.raises(ValueError, match="set norm_obs=false"):  # continuous: norm_obs defaults on
        ppo.train(cfg)


def test_one_seed_is_the_plain_single_run_bit_for_bit(ppo, tmp_path):
    """n_seeds=1 through SeedAxis equals the single-seed PPO loop written without it (the app's
    path before seeds became a dimension): PPOLoss normalising the advantages, torch's
    clip_grad_norm_, the collector seeding the env; same metrics and the same final weights."""
    from tdrl.core.collectors import Collector
    from tdrl.core.objectives import PPOLoss, total_loss

    cfg = ppo.main.load([f"out={tmp_path}", "gae_backend=torch", "seed=2", "total_frames=384"], recipe="tiny")
    summary = ppo.train(cfg)
    rows = read_rows(tmp_path / "metrics.csv")
    app = torch.load(tmp_path / "model.pt", weights_only=True)

    torch.manual_seed(cfg.seed)
    env = ppo.make_env(cfg, cfg.num_envs, None)
    actor, critic = ppo.make_actor_critic(env, cfg)
    loss_fn = PPOLoss(actor, critic, clip_epsilon=cfg.clip_epsilon, entropy_coef=cfg.entropy_coef,
                      critic_coef=cfg.critic_coef, normalize_advantage=True)
    optim = torch.optim.Adam(loss_fn.parameters(), lr=cfg.lr, eps=1e-5)
    fpb = cfg.num_envs * cfg.num_steps
    n_iters = cfg.total_frames // fpb
    collector = Collector(env, actor, frames_per_batch=fpb, total_frames=n_iters * fpb, seed=cfg.seed)
    losses = []
    for it, batch in enumerate(collector):
        for g in optim.param_groups:
            g["lr"] = cfg.lr * (1.0 - it / n_iters)
        ppo.compute_advantage(batch, critic, cfg)
        flat, stats = batch.reshape(-1), []
        for _ in range(cfg.epochs):
            perm = torch.randperm(flat.shape[0])
            for start in range(0, flat.shape[0], cfg.minibatch_size):
                out = loss_fn(flat[perm[start:start + cfg.minibatch_size]])
                optim.zero_grad(set_to_none=True)
                total_loss(out).backward()
                torch.nn.utils.clip_grad_norm_(loss_fn.parameters(), cfg.max_grad_norm)
                optim.step()
                stats.append(out.detach())
        losses.append(float(torch.stack(stats).mean()["loss_objective"]))
    collector.shutdown()
    assert len(losses) == 3 and [float(r["loss_objective"]) for r in rows[:3]] == losses
    for net, mod in (("actor", actor), ("critic", critic)):
        for name, value in mod.state_dict().items():
            assert torch.equal(app[net][name], value), f"{net}.{name}"
    single_eval = ppo.evaluate(actor, cfg, None, cfg.eval_episodes, 20_000, ppo.SeedAxis([cfg.seed]))
    assert summary["eval_return"] == single_eval[0] and "seeds" not in summary
