"""QMIX / VDN seeds as one vectorised model: n stacked seeds learn exactly like n single-seed
runs given the same data (same transitions, same sampled replay slots), a seed's whole run
does not depend on the other seeds, per-seed metrics are reported, impossible inputs are refused."""

from __future__ import annotations

import pytest
import torch

from tdrl.core.objectives import SoftUpdate
from tdrl.core.replay import LazyTensorStorage, TensorDictReplayBuffer
from tdrl.core.train.seeds import SeedStackedModule, from_seed_items, to_seed_items
from tdrl.marl.algorithms import make_groups
from tdrl.marl.envs import VmasEnv
from tdrl.marl.objectives import QMIXConfig, VDNConfig
from tdrl.marl.loops import TrainConfig, collect
from tdrl.marl.loops import off_policy_optimizer, off_policy_update, train_off_policy
from tdrl.marl.vectorised import make_vectorised_groups

from _seed_checks import assert_seed_state_equal, collect_batches

SEEDS, E, T = [3, 7], 3, 4


def _nav(n_envs: int, seed: int = 0) -> VmasEnv:
    return VmasEnv("navigation", num_envs=n_envs, max_steps=10, seed=seed, n_agents=2, continuous_actions=False)


def _adversary(n_envs: int, seed: int = 0) -> VmasEnv:
    return VmasEnv("simple_adversary", num_envs=n_envs, max_steps=10, seed=seed, group_map="prefix",
                   continuous_actions=False)


CASES = {"qmix": (_nav, "qmix", QMIXConfig(gamma=0.9, tau=0.2)),
         "qmix-double-q": (_nav, "qmix", QMIXConfig(gamma=0.9, tau=0.2, double_q=True, hypernet_hidden=None)),
         "vdn": (_nav, "vdn", VDNConfig(gamma=0.9, tau=0.2)),
         "qmix-two-groups": (_adversary, "qmix", QMIXConfig(gamma=0.9, tau=0.2))}


def _assert_seed_equal(vec_loss, single_loss, k: int, tol: float) -> int:
    """Seed ``k``'s slice of every stacked network of ``vec_loss`` (Q network, mixer and their
    targets) equals the single-seed loss's network of the same name; returns how many tensors."""
    found = assert_seed_state_equal(vec_loss, single_loss, k, tol, SEEDS[k])
    return found


@pytest.mark.parametrize("case", list(CASES))
def test_stacked_updates_equal_single_seed_updates(case):
    """Two collected batches in seed-major replay items, then 4 sampled gradient steps with
    per-seed clipping and soft target updates: each seed's slice of the Q network, the mixer and
    both targets equals a single-seed run of that seed on its own block (same slots sampled)."""
    make_env, algo, conf = CASES[case]
    env = make_env(len(SEEDS) * E)
    vec = make_vectorised_groups(algo, env, SEEDS, conf, num_cells=(16,))
    batches = collect_batches(env, vec, 2, T)
    tcfg = TrainConfig(lr=1e-2, max_grad_norm=0.05)  # tight clipping: the per-seed clip is exercised

    def run(groups, data, n_seeds):
        opt, clips = off_policy_optimizer(groups, tcfg)
        targets = [SoftUpdate(p.loss, tau=p.config.tau) for p in groups.values()]
        buffer = TensorDictReplayBuffer(storage=LazyTensorStorage(100))
        for b in data:
            flat = b.reshape(-1)
            buffer.extend(flat if n_seeds == 1 else to_seed_items(flat, n_seeds))
        torch.manual_seed(1)  # the same replay slots
        for _ in range(4):
            sample = buffer.sample(8)
            off_policy_update(sample if n_seeds == 1 else from_seed_items(sample, n_seeds), groups, opt, clips,
                              targets, tcfg.max_grad_norm, n_seeds)

    before = {g: [q.detach().clone() for q in p.loss.parameters()] for g, p in vec.items()}
    run(vec, batches, len(SEEDS))
    for k, seed in enumerate(SEEDS):
        torch.manual_seed(seed)  # what a single-seed run does before building its networks
        single = make_groups(algo, make_env(E), conf, num_cells=(16,))
        run(single, [b[k * E:(k + 1) * E] for b in batches], 1)
        for g in vec:
            n = _assert_seed_equal(vec[g].loss, single[g].loss, k, tol=2e-5)
            assert n >= (8 if algo == "vdn" else 8 + 2 * 10), (g, n)  # Q net (+ mixer), online and target
    for g, p in vec.items():  # every seed of every group learned
        for a, b in zip(before[g], p.loss.parameters()):
            assert all(not torch.equal(a[s], b[s]) for s in range(len(SEEDS))), g


@pytest.mark.parametrize("algo", ["qmix", "vdn"])
def test_vectorised_initial_weights_equal_single_seed_runs(algo):
    vec = make_vectorised_groups(algo, _adversary(len(SEEDS) * 2), SEEDS, num_cells=(8,))
    for k, seed in enumerate(SEEDS):
        torch.manual_seed(seed)
        single = make_groups(algo, _adversary(2), num_cells=(8,))
        for g in vec:
            assert _assert_seed_equal(vec[g].loss, single[g].loss, k, tol=0) >= 8


def _train(seeds, **kw):
    torch.manual_seed(0)
    env, eval_env = _nav(len(seeds) * 4), _nav(len(seeds) * 2, seed=1)
    parts = make_vectorised_groups("qmix", env, seeds, QMIXConfig(eps_anneal_frames=100), num_cells=(16,))
    cfg = TrainConfig(frames_per_batch=40, n_iters=3, minibatch_size=16, n_optimizer_steps=3, lr=1e-3,
                      eval_interval=1, max_steps=10, **kw)
    return train_off_policy(env, parts, cfg, eval_env=eval_env, n_seeds=len(seeds)), parts["agents"]


def test_a_seed_does_not_depend_on_the_other_seeds():
    """Seeds [0, 1] and [0, 5] in one process: seed 0's training and evaluation returns and final
    weights (online and target) are the same in both runs, the second seed's are not; per-seed
    entries average to the plain ones; epsilon follows one seed's frames."""
    (h1, p1), (h5, p5) = _train([0, 1]), _train([0, 5])
    assert [r["frames"] for r in h1] == [40, 80, 120]
    for a, b in zip(h1, h5):
        assert a["train_return_seeds"][0] == b["train_return_seeds"][0]
        assert a["eval_return_seeds"][0] == b["eval_return_seeds"][0]
        assert a["eval_return"] == pytest.approx(sum(a["eval_return_seeds"]) / 2, rel=1e-5)
        # 10-step episodes, 10 steps per iteration: every sub-env ends one episode per iteration
        assert a["train_return"] == pytest.approx(sum(a["train_return_seeds"]) / 2, rel=1e-5)
        assert a["eval_return_seeds"][1] != b["eval_return_seeds"][1]
    assert h1[-1]["eps"] == pytest.approx(0.8 + (0.01 - 0.8) * 1.0) and h1[0]["eps"] == pytest.approx(
        0.8 + (0.01 - 0.8) * 0.4)
    s1, s5 = _seed_states(p1.loss, 0), _seed_states(p5.loss, 0)
    assert len(s1) >= 8 + 2 * 14 and all(torch.equal(v, s5[n]) for n, v in s1.items())
    o1, o5 = _seed_states(p1.loss, 1), _seed_states(p5.loss, 1)
    assert any(not torch.equal(v, o5[n]) for n, v in o1.items())


def _seed_states(stacked_loss, k: int) -> dict[str, torch.Tensor]:
    """Seed ``k``'s slice of every stacked network of a loss, ``{module.tensor: value}``."""
    return {f"{name}.{n}": v for name, mod in stacked_loss.named_modules() if isinstance(mod, SeedStackedModule)
            for n, v in mod.seed_state(k).items()}


def test_exploration_draws_differ_between_seeds():
    """One epsilon for every seed, but each sub-env of each seed draws its own coin and action:
    with epsilon 1 the seeds' random actions are not copies of each other."""
    env = _nav(len(SEEDS) * 8)
    parts = make_vectorised_groups("vdn", env, SEEDS, VDNConfig(eps_init=1.0, eps_end=1.0), num_cells=(8,))
    torch.manual_seed(0)
    batch, _ = collect(env, parts["agents"].policy, env.reset(), 5)
    actions = batch["agents", "action"]  # [2 * 8, 5, n_agents]
    assert not torch.equal(actions[:8], actions[8:])
    counts = torch.bincount(actions.flatten(), minlength=9).float()
    assert counts.min() > 0  # every discrete action drawn


def test_unsupported_seed_setups_say_why():
    env = _nav(len(SEEDS) * 2)
    parts = make_vectorised_groups("qmix", env, SEEDS, num_cells=(8,))
    cfg = TrainConfig(frames_per_batch=8, n_iters=1, minibatch_size=4, n_optimizer_steps=1, eval_interval=0)
    with pytest.raises(ValueError, match="do not split into 3 seeds"):
        make_vectorised_groups("vdn", _nav(4), [0, 1, 2])
    with pytest.raises(ValueError, match="n_seeds must be >= 1"):
        train_off_policy(env, parts, cfg, n_seeds=0)
    with pytest.raises(ValueError, match="n_seeds=3.*stacked over \\[2\\] seeds"):
        train_off_policy(_nav(6), parts, cfg, n_seeds=3)
    with pytest.raises(ValueError, match="pass n_seeds"):
        train_off_policy(env, parts, cfg)
    with pytest.raises(ValueError, match="stacked over no seeds"):
        train_off_policy(env, make_groups("qmix", env, num_cells=(8,)), cfg, n_seeds=2)
    with pytest.raises(ValueError, match="eval_env's 3 sub-envs do not split into n_seeds=2"):
        train_off_policy(env, parts, cfg, eval_env=_nav(3), n_seeds=2)
