"""Vectorised seeds with several agent groups: n stacked seeds learn exactly like n single-seed
runs (same seeds, same batch), on PettingZoo and VMAS ``simple_adversary`` split by prefix."""

from __future__ import annotations

import pytest
import torch

from tdrl.core.envs import SerialEnv
from tdrl.marl.algorithms import make_groups
from tdrl.marl.envs import PettingZooEnv, VmasEnv
from tdrl.marl.objectives import IPPOConfig, MAPPOConfig
from tdrl.marl.loops import (
    GroupPolicies, TrainConfig, collect, on_policy_optimizer, on_policy_update, train_on_policy,
)
from tdrl.marl.vectorised import make_vectorised_groups, make_vectorised_on_policy

SEEDS, E, T = [3, 7], 2, 6


def _pz(n_envs: int) -> SerialEnv:
    return SerialEnv(n_envs, lambda: PettingZooEnv("simple_adversary_v3", group_map="prefix", max_cycles=10, seed=0))


def _vmas(n_envs: int) -> VmasEnv:
    return VmasEnv("simple_adversary", num_envs=n_envs, max_steps=10, seed=0, group_map="prefix")


# categorical entropy is closed-form; TanhNormal's is sampled (so it draws seeds' noise together)
CASES = {"pettingzoo-mappo": (_pz, "mappo", MAPPOConfig(gamma=0.9, entropy_coef=0.01)),
         "vmas-ippo": (_vmas, "ippo", IPPOConfig(gamma=0.9))}


def _stacked_params(parts) -> dict[str, torch.Tensor]:
    """``{name: [n_seeds, *shape]}`` of a vectorised group's actor and critic."""
    out = {}
    for role, mod in (("actor", parts.policy.module[0].module), ("critic", parts.critic.module)):
        out.update({f"{role}.{n}": p for n, p in zip(mod._names, mod.stacked_params)})
    return out


def _single_params(parts) -> dict[str, torch.Tensor]:
    out = {}
    for role, mod in (("actor", parts.policy.module[0].module), ("critic", parts.critic.module)):
        out.update({f"{role}.{n}": p for n, p in mod.named_parameters()})
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_vectorised_groups_update_equals_single_seed_updates(case):
    make_env, algo, conf = CASES[case]
    env = make_env(len(SEEDS) * E)
    vec = make_vectorised_groups(algo, env, SEEDS, conf, num_cells=(16,))
    assert list(vec) == ["adversary", "agent"]
    torch.manual_seed(0)
    batch, _ = collect(env, GroupPolicies({g: p.policy for g, p in vec.items()}), env.reset(), T)
    # 2 epochs x 2 minibatches, tight clipping so the per-seed clip is exercised
    tcfg = TrainConfig(num_epochs=2, minibatch_size=E * T // 2, lr=1e-3, max_grad_norm=0.05)
    opt, clips = on_policy_optimizer(vec, tcfg)
    torch.manual_seed(1)
    on_policy_update(batch, vec, opt, clips, tcfg, n_seeds=len(SEEDS))
    for s, seed in enumerate(SEEDS):
        torch.manual_seed(seed)  # what a single-seed run does before building its networks
        single = make_groups(algo, make_env(E), conf, num_cells=(16,))
        for g in vec:  # same initial weights (before any update: the stacked copy is independent)
            for name, p in _single_params(single[g]).items():
                assert p.shape == _stacked_params(vec[g])[name].shape[1:], (g, name)
        block = batch[s * E:(s + 1) * E].clone()
        opt_s, clips_s = on_policy_optimizer(single, tcfg)
        torch.manual_seed(1)  # same epoch permutations
        on_policy_update(block, single, opt_s, clips_s, tcfg)
        for g in vec:
            torch.testing.assert_close(block[g, "advantage"], batch[s * E:(s + 1) * E][g, "advantage"],
                                       rtol=1e-4, atol=1e-5)
            stacked = _stacked_params(vec[g])
            for name, p in _single_params(single[g]).items():
                torch.testing.assert_close(stacked[name][s], p, rtol=1e-4, atol=2e-5,
                                           msg=f"{case} {g} {name} seed {seed}")


def test_vectorised_initial_weights_equal_single_seed_runs():
    env = _vmas(len(SEEDS) * E)
    vec = make_vectorised_groups("mappo", env, SEEDS, num_cells=(8,))
    for s, seed in enumerate(SEEDS):
        torch.manual_seed(seed)
        single = make_groups("mappo", _vmas(E), num_cells=(8,))
        for g in vec:
            stacked = _stacked_params(vec[g])
            for name, p in _single_params(single[g]).items():
                assert torch.equal(stacked[name][s], p), (g, name, seed)


def test_vectorised_two_group_training_reports_each_seed_and_group():
    env, eval_env = _vmas(len(SEEDS) * 4), _vmas(len(SEEDS) * 2)
    parts = make_vectorised_groups("mappo", env, SEEDS, MAPPOConfig(), num_cells=(16,))
    before = {g: [p.detach().clone() for p in _stacked_params(v).values()] for g, v in parts.items()}
    cfg = TrainConfig(frames_per_batch=40, n_iters=2, num_epochs=1, minibatch_size=20, lr=1e-3,
                      eval_interval=1, max_steps=10)
    hist = train_on_policy(env, parts, cfg, eval_env=eval_env, n_seeds=len(SEEDS))
    last = hist[-1]
    assert last["frames"] == 80 and len(last["eval_return_seeds"]) == len(SEEDS)
    assert {"eval_return/adversary", "eval_return/agent", "train_return/agent"} <= set(last)
    assert last["eval_return"] == pytest.approx(sum(last["eval_return_seeds"]) / len(SEEDS), rel=1e-5)
    # 10-step episodes, 10 steps per iteration: every sub-env ends one episode per iteration
    assert last["train_return"] == pytest.approx(sum(last["train_return_seeds"]) / len(SEEDS), rel=1e-5)
    assert last["train_return_seeds"][0] != last["train_return_seeds"][1]
    for g, v in parts.items():  # every seed of every group learned
        for a, b in zip(before[g], _stacked_params(v).values()):
            assert all(not torch.equal(a[s], b[s]) for s in range(len(SEEDS))), g


def test_vectorised_unsupported_cases_say_why():
    env = _vmas(len(SEEDS) * 2)
    with pytest.raises(ValueError, match="support the algorithms.*'sac'.*one after another"):
        make_vectorised_groups("sac", env, SEEDS)
    with pytest.raises(ValueError, match="do not split into 2 seeds"):
        make_vectorised_groups("mappo", _vmas(3), SEEDS)
    with pytest.raises(ValueError, match="normalize_advantage"):
        make_vectorised_groups("mappo", env, SEEDS, MAPPOConfig(normalize_advantage=True))
    parts = make_vectorised_groups("mappo", env, SEEDS, num_cells=(8,))
    cfg = TrainConfig(frames_per_batch=8, n_iters=1, eval_interval=0)
    with pytest.raises(ValueError, match="n_seeds=3.*stacked over \\[2\\] seeds"):
        train_on_policy(_vmas(6), parts, cfg, n_seeds=3)
    with pytest.raises(ValueError, match="pass n_seeds"):
        train_on_policy(env, parts, cfg)
    with pytest.raises(ValueError, match="stacked over no seeds"):
        train_on_policy(env, make_groups("mappo", env, num_cells=(8,)), cfg, n_seeds=2)
    # agents switched off by the mask would weight each seed by its share of acting agents
    pz = _pz(len(SEEDS))
    pz_parts = make_vectorised_groups("mappo", pz, SEEDS, num_cells=(8,))
    batch, _ = collect(pz, GroupPolicies({g: p.policy for g, p in pz_parts.items()}), pz.reset(), 2)
    batch["agent", "mask"][0, 0, 1] = False
    opt, clips = on_policy_optimizer(pz_parts, cfg)
    with pytest.raises(ValueError, match="group 'agent'.*mask.*False entries"):
        on_policy_update(batch, pz_parts, opt, clips, cfg, n_seeds=len(SEEDS))


def test_one_group_builder_is_the_groups_builder():
    env = _vmas(len(SEEDS) * 2)
    one = make_vectorised_on_policy(env, SEEDS, algorithm="ippo", group="agent", num_cells=(8,))
    both = make_vectorised_groups("ippo", env, SEEDS, groups=["agent"], num_cells=(8,))["agent"]
    for a, b in zip(_stacked_params(one).values(), _stacked_params(both).values()):
        assert torch.equal(a, b)
