"""MADDPG / IDDPG / MASAC / ISAC / IQL seeds as one vectorised model (core's DDPG / SAC / DQN
losses stacked by ``stack_losses``): n stacked seeds learn exactly like n single-seed runs given
the same data (same transitions, same replay slots; for SAC the same Gaussian noise on each
seed's rows), a seed's run does not depend on the other seeds, and the runner vectorises them."""

from __future__ import annotations

import pytest
import torch
import torch.distributions.normal as normal_mod

from tdrl.core.objectives import SoftUpdate
from tdrl.core.replay import LazyTensorStorage, TensorDictReplayBuffer
from tdrl.core.train.seeds import SeedStackedModule, StackedTemperature, from_seed_items, to_seed_items
from tdrl.marl.algorithms import ALGORITHMS, make_groups
from tdrl.marl.envs import VmasEnv
from tdrl.marl.loops import TrainConfig, off_policy_optimizer, off_policy_update
from tdrl.marl.loops import train_off_policy
from tdrl.marl.objectives import IDDPGConfig, IQLConfig, ISACConfig, MADDPGConfig, MASACConfig
from tdrl.marl.vectorised import make_vectorised_groups

from _seed_checks import assert_seed_state_equal, collect_batches

SEEDS, E, T, B = [3, 7], 3, 4, 8


def _nav(n_envs: int, continuous: bool = True, seed: int = 0) -> VmasEnv:
    return VmasEnv("navigation", num_envs=n_envs, max_steps=10, seed=seed, n_agents=2,
                   continuous_actions=continuous)


def _adversary(n_envs: int, continuous: bool = True, seed: int = 0) -> VmasEnv:
    return VmasEnv("simple_adversary", num_envs=n_envs, max_steps=10, seed=seed, group_map="prefix",
                   continuous_actions=continuous)


CASES = {"maddpg": (_nav, "maddpg", MADDPGConfig(gamma=0.9, tau=0.2)),
         "iddpg": (_nav, "iddpg", IDDPGConfig(gamma=0.9, tau=0.2, share_param_actor=False)),
         "masac": (_nav, "masac", MASACConfig(gamma=0.9, tau=0.2, alpha_init=0.5)),
         "isac-unshared": (_nav, "isac", ISACConfig(gamma=0.9, tau=0.2, share_param_critic=False)),
         "iql": (_nav, "iql", IQLConfig(gamma=0.9, tau=0.2)),
         "maddpg-two-groups": (_adversary, "maddpg", MADDPGConfig(gamma=0.9, tau=0.2))}


class _Noise:
    """SAC's Gaussian draws, call by call: the stacked call gets the full ``[n_seeds * B, ...]``
    draw, ``block=k`` hands a single-seed run only seed ``k``'s rows of that same draw."""

    def __init__(self, block: int | None = None) -> None:
        self.block, self.calls = block, 0

    def __call__(self, shape, dtype=None, device=None):
        g = torch.Generator().manual_seed(1000 + self.calls)
        self.calls += 1
        rows = shape[0] if self.block is None else shape[0] * len(SEEDS)
        full = torch.randn((rows, *shape[1:]), generator=g, dtype=dtype)
        return full if self.block is None else full[self.block * B:(self.block + 1) * B]


def _assert_seed_equal(vec_loss, single_loss, k: int, tol: float) -> int:
    """Seed ``k``'s slice of every stacked network of ``vec_loss`` (actor, critics, targets)
    equals the single-seed loss's network of the same name; returns how many tensors."""
    found = assert_seed_state_equal(vec_loss, single_loss, k, tol, SEEDS[k])
    temp = getattr(vec_loss.loss, "temperature", None)
    if isinstance(temp, StackedTemperature):
        torch.testing.assert_close(temp.log_alpha.detach()[k], single_loss.loss.temperature.log_alpha.detach(),
                                   rtol=tol, atol=tol)
        found += 1
    return found


@pytest.mark.parametrize("case", list(CASES))
def test_stacked_updates_equal_single_seed_updates(case, monkeypatch):
    """Two collected batches in seed-major replay items, then 3 sampled gradient steps with
    per-seed clipping and soft target updates: each seed's slice of the actor, the critics, their
    targets (and SAC's temperature) equals a single-seed run of that seed on its own block."""
    make_env, algo, conf = CASES[case]
    discrete = algo == "iql"
    env = make_env(len(SEEDS) * E, not discrete)
    vec = make_vectorised_groups(algo, env, SEEDS, conf, num_cells=(16,))
    batches = collect_batches(env, vec, 2, T)
    tcfg = TrainConfig(lr=1e-2, max_grad_norm=0.05)  # tight clipping: the per-seed clip is exercised

    def run(groups, data, n_seeds, block=None):
        opt, clips = off_policy_optimizer(groups, tcfg)
        targets = [SoftUpdate(p.loss, tau=p.config.tau) for p in groups.values()]
        buffer = TensorDictReplayBuffer(storage=LazyTensorStorage(100))
        for b in data:
            flat = b.reshape(-1)
            buffer.extend(flat if n_seeds == 1 else to_seed_items(flat, n_seeds))
        monkeypatch.setattr(normal_mod, "_standard_normal", _Noise(block))
        torch.manual_seed(1)  # the same replay slots
        for _ in range(3):
            sample = buffer.sample(B)
            off_policy_update(sample if n_seeds == 1 else from_seed_items(sample, n_seeds), groups, opt, clips,
                              targets, tcfg.max_grad_norm, n_seeds)

    before = {g: [q.detach().clone() for q in p.loss.parameters()] for g, p in vec.items()}
    run(vec, batches, len(SEEDS))
    for k, seed in enumerate(SEEDS):
        torch.manual_seed(seed)  # what a single-seed run does before building its networks
        single = make_groups(algo, make_env(E, not discrete), conf, num_cells=(16,))
        run(single, [b[k * E:(k + 1) * E] for b in batches], 1, block=k)
        for g in vec:
            n = _assert_seed_equal(vec[g].loss, single[g].loss, k, tol=2e-5)
            # actor, critic(s) and target critic(s) (DDPG 14 tensors, SAC 20 + alpha, IQL 8)
            assert n >= {"iql": 8, "masac": 21, "isac": 21}.get(algo, 14), (g, n)
    for g, p in vec.items():  # every seed of every group learned
        for a, b in zip(before[g], p.loss.parameters()):
            if b.requires_grad:
                assert all(not torch.equal(a[s], b[s]) for s in range(len(SEEDS))), g


def _train(algo: str, seeds: list[int], conf):
    torch.manual_seed(0)
    discrete = algo == "iql"
    env, eval_env = _nav(len(seeds) * 4, not discrete), _nav(len(seeds) * 2, not discrete, seed=1)
    parts = make_vectorised_groups(algo, env, seeds, conf, num_cells=(16,))
    cfg = TrainConfig(frames_per_batch=40, n_iters=3, minibatch_size=16, n_optimizer_steps=3, lr=1e-3,
                      eval_interval=1, max_steps=10)
    return train_off_policy(env, parts, cfg, eval_env=eval_env, n_seeds=len(seeds)), parts["agents"]


def _seed_states(stacked_loss, k: int) -> dict[str, torch.Tensor]:
    """Seed ``k``'s slice of every stacked network of a loss, ``{module.tensor: value}``."""
    return {f"{name}.{n}": v for name, mod in stacked_loss.named_modules() if isinstance(mod, SeedStackedModule)
            for n, v in mod.seed_state(k).items()}


@pytest.mark.parametrize("algo, conf", [("maddpg", MADDPGConfig(sigma_anneal_frames=100)),
                                        ("masac", MASACConfig()), ("iql", IQLConfig(eps_anneal_frames=100))])
def test_a_seed_does_not_depend_on_the_other_seeds(algo, conf):
    """Seeds [0, 1] and [0, 5]: seed 0's training and evaluation returns and final weights
    (online and target; SAC's temperature) are the same in both runs, the second seed's are not;
    the exploration schedule (sigma / epsilon) follows one seed's frames."""
    (h1, p1), (h5, p5) = _train(algo, [0, 1], conf), _train(algo, [0, 5], conf)
    assert [r["frames"] for r in h1] == [40, 80, 120]
    for a, b in zip(h1, h5):
        assert a["train_return_seeds"][0] == b["train_return_seeds"][0]
        assert a["eval_return_seeds"][0] == b["eval_return_seeds"][0]
        assert a["eval_return"] == pytest.approx(sum(a["eval_return_seeds"]) / 2, rel=1e-5)
        assert a["eval_return_seeds"][1] != b["eval_return_seeds"][1]
    if algo != "masac":  # 0.8 -> 0.01 over 100 frames of one seed: 40 frames in, 0.4 of the way
        assert h1[0]["eps"] == pytest.approx(0.8 + (0.01 - 0.8) * 0.4) and h1[-1]["eps"] == pytest.approx(0.01)
    s1, s5 = _seed_states(p1.loss, 0), _seed_states(p5.loss, 0)
    assert len(s1) >= 8 and all(torch.equal(v, s5[n]) for n, v in s1.items())
    o1, o5 = _seed_states(p1.loss, 1), _seed_states(p5.loss, 1)
    assert any(not torch.equal(v, o5[n]) for n, v in o1.items())
    if algo == "masac":
        alpha1, alpha5 = p1.loss.loss.temperature.log_alpha, p5.loss.loss.temperature.log_alpha
        assert alpha1.shape == (2,) and alpha1[0] == alpha5[0] and alpha1[1] != alpha5[1]


@pytest.mark.parametrize("algo", ["maddpg", "iddpg", "masac", "isac", "iql"])
def test_the_runner_vectorises_the_new_algorithms(algo, tmp_path):
    """Every new off-policy algorithm is vectorisable and the runner trains its two seeds as
    one model, reported per seed (the seeds are not copies)."""
    from tdrl.marl.runner import BenchConfig, run_benchmark

    assert ALGORITHMS[algo].vectorisable
    cfg = BenchConfig(algorithms=(algo,), tasks=("navigation",), seeds=(0, 1), out_dir=str(tmp_path), num_envs=4,
                      n_iters=2, num_cells=(16,), off_policy_frames_per_batch=20, n_optimizer_steps=2,
                      off_policy_batch_size=16, eval_envs=2, eval_interval=1, max_steps=12)
    result = run_benchmark(cfg)
    (summary,) = result["summary"]
    assert summary["vectorised"] is True and result["failures"] == []
    rows = result["evaluations"]
    assert sorted((r["seed"], r["iter"]) for r in rows) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert len({r["eval_return"] for r in rows}) > 1


def test_a_vectorised_checkpoint_restores_every_seed(tmp_path):
    """Vectorised MASAC's checkpoint holds the stacked actor, critics, targets and one temperature
    per seed; loaded into freshly built vectorised parts, every seed's state is the trained one."""
    from tdrl.core.train import Checkpointer
    from tdrl.marl.loops import load_parts

    torch.manual_seed(0)
    env = _nav(len(SEEDS) * 2)
    parts = make_vectorised_groups("masac", env, SEEDS, MASACConfig(alpha_init=0.5), num_cells=(8,))
    cfg = TrainConfig(frames_per_batch=12, n_iters=2, minibatch_size=8, n_optimizer_steps=2, eval_interval=0,
                      max_steps=6, lr=1e-2)
    train_off_policy(env, parts, cfg, n_seeds=len(SEEDS), checkpoint=Checkpointer(tmp_path))
    fresh = make_vectorised_groups("masac", _nav(len(SEEDS) * 2), SEEDS, MASACConfig(alpha_init=0.5),
                                   num_cells=(8,))
    trained, new = parts["agents"].loss, fresh["agents"].loss
    assert not torch.equal(trained.loss.temperature.log_alpha, new.loss.temperature.log_alpha)
    extra = load_parts(sorted(tmp_path.glob("step_*.pt"))[-1], fresh)
    assert extra["frames"] == 24
    for k in range(len(SEEDS)):
        want, got = _seed_states(trained, k), _seed_states(new, k)
        assert len(want) >= 20 and all(torch.equal(v, got[n]) for n, v in want.items())
    torch.testing.assert_close(new.loss.temperature.log_alpha, trained.loss.temperature.log_alpha)
    assert new.loss.temperature.log_alpha.shape == (len(SEEDS),)
