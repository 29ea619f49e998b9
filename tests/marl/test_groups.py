"""Several agent groups in the builders and training loops (PettingZoo by-prefix groups), and
multi-dim observations flattened per agent (tic-tac-toe boards)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tdrl.core.envs import SerialEnv
from tdrl.marl.algorithms import env_groups, group_dims, make_groups, make_mappo, make_qmix
from tdrl.marl.envs import PettingZooEnv, VmasEnv
from tdrl.marl.objectives import MAPPOConfig, QMIXConfig
from tdrl.marl.loops import GroupPolicies, TrainConfig, train_off_policy, train_on_policy


def _adversary(n_envs: int = 2) -> SerialEnv:
    return SerialEnv(n_envs, lambda: PettingZooEnv("simple_adversary_v3", group_map="prefix", max_cycles=10, seed=0))


def _snapshot(module: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


def _changed(before, module) -> bool:
    return any(not torch.equal(a, b) for a, b in zip(before, module.parameters()))


def test_mappo_trains_every_group_of_a_prefix_grouped_env():
    torch.manual_seed(0)
    env = _adversary()
    assert env_groups(env) == ["adversary", "agent"]
    parts = make_groups("mappo", env, MAPPOConfig(), num_cells=(16,))
    assert group_dims(env, "adversary")[:2] == (1, 8) and group_dims(env, "agent")[:2] == (2, 10)
    before = {g: (_snapshot(p.policy), _snapshot(p.critic)) for g, p in parts.items()}
    cfg = TrainConfig(frames_per_batch=40, n_iters=2, num_epochs=2, minibatch_size=20, lr=1e-3,
                      eval_interval=1, max_steps=10)
    eval_env = _adversary(1)
    hist = train_on_policy(env, parts, cfg, eval_env=eval_env)
    for g, p in parts.items():  # each group's actor and critic were updated
        assert _changed(before[g][0], p.policy) and _changed(before[g][1], p.critic), g
    last = hist[-1]
    assert last["frames"] == 80 and torch.isfinite(torch.tensor(last["loss"]))
    per_group = [last["train_return/adversary"], last["train_return/agent"]]
    assert last["train_return"] == pytest.approx(sum(per_group) / 2)
    evals = [last["eval_return/adversary"], last["eval_return/agent"]]
    assert last["eval_return"] == pytest.approx(sum(evals) / 2)
    # the joint policy writes every group's action with its own spec's shape
    td = GroupPolicies({g: p.policy for g, p in parts.items()})(env.reset())
    assert td["adversary", "action"].shape == (2, 1) and td["agent", "action"].shape == (2, 2)


def test_qmix_trains_every_group_with_its_own_mixer():
    torch.manual_seed(0)
    env = _adversary()
    parts = make_groups("qmix", env, QMIXConfig(), num_cells=(16,))
    mixers = {g: p.loss.mixer for g, p in parts.items()}
    assert mixers["adversary"].n_agents == 1 and mixers["agent"].n_agents == 2
    before = {g: _snapshot(p.loss) for g, p in parts.items()}
    cfg = TrainConfig(frames_per_batch=40, n_iters=2, minibatch_size=16, n_optimizer_steps=3, lr=1e-3,
                      eval_interval=0, max_steps=10)
    hist = train_off_policy(env, parts, cfg)
    for g, p in parts.items():
        assert _changed(before[g], p.loss), g
    assert "train_return/agent" in hist[-1] and torch.isfinite(torch.tensor(hist[-1]["loss"]))


def test_one_group_as_a_mapping_trains_exactly_like_the_bundle():
    def run(as_mapping: bool):
        torch.manual_seed(0)
        env = VmasEnv("navigation", num_envs=4, max_steps=10, seed=0, n_agents=2)
        parts = make_mappo(env, MAPPOConfig(), num_cells=(8,))
        cfg = TrainConfig(frames_per_batch=40, n_iters=2, num_epochs=2, minibatch_size=20, eval_interval=0)
        hist = train_on_policy(env, {"agents": parts} if as_mapping else parts, cfg)
        return hist, _snapshot(parts.loss)

    (h1, p1), (h2, p2) = run(False), run(True)
    assert [r["loss"] for r in h1] == [r["loss"] for r in h2]
    assert all(torch.equal(a, b) for a, b in zip(p1, p2))


def test_multi_dim_observations_are_flattened_per_agent():
    torch.manual_seed(0)
    env = SerialEnv(2, lambda: PettingZooEnv("tictactoe_v3", seed=0))
    assert env.observation_spec["agents", "observation"].shape == (2, 2, 3, 3, 2)
    assert group_dims(env)[:2] == (2, 18)
    parts = make_mappo(env, MAPPOConfig(), num_cells=(16,))
    td = env.reset()
    out = parts.policy(td.clone())
    assert out["agents", "action"].shape == (2, 2)
    # the actor is the MLP on the flattened boards: same logits as flattening by hand
    net = parts.policy.module[0].module
    mlp = net[-1]
    assert isinstance(net[0], nn.Flatten)
    torch.testing.assert_close(out["agents", "logits"], mlp(td["agents", "observation"].flatten(-3)))
    value = parts.critic(td.clone())["agents", "state_value"]
    assert value.shape == (2, 2, 1)
    before = _snapshot(parts.loss)
    cfg = TrainConfig(frames_per_batch=20, n_iters=1, num_epochs=1, minibatch_size=10, eval_interval=0)
    train_on_policy(env, parts, cfg)
    assert _changed(before, parts.loss)
    # QMIX mixes on the (n_agents, 3, 3, 2) boards of both players
    qparts = make_qmix(env, QMIXConfig(), num_cells=(16,))
    assert qparts.loss.mixer.state_shape == (2, 3, 3, 2)
    loss = qparts.loss(env.rollout(3, qparts.policy, break_when_any_done=False).reshape(-1))
    assert torch.isfinite(loss["loss_qvalue"])


def test_make_groups_names_bad_algorithms_and_groups():
    env = VmasEnv("navigation", num_envs=2, n_agents=2)
    with pytest.raises(ValueError, match="Unknown algorithm 'ppo'.*mappo"):
        make_groups("ppo", env)
    with pytest.raises(KeyError, match="no group 'robots'.*'agents'"):
        make_groups("mappo", env, groups=["robots"])
    assert list(make_groups(make_mappo, env, num_cells=(8,))) == ["agents"]


def test_off_policy_buffer_size_beyond_the_run_does_not_change_training():
    """A 1M-frame default buffer on a 40-frame run (capped at the run's 40 frames inside
    ``train_off_policy``) trains exactly like a buffer of the run's size."""

    def run(buffer_size: int):
        torch.manual_seed(0)
        env = _adversary()
        parts = make_groups("qmix", env, QMIXConfig(), num_cells=(8,))
        cfg = TrainConfig(frames_per_batch=20, n_iters=2, minibatch_size=8, n_optimizer_steps=2,
                          eval_interval=0, max_steps=10, buffer_size=buffer_size)
        hist = train_off_policy(env, parts, cfg)
        return [h["loss"] for h in hist], [_snapshot(p.loss) for p in parts.values()]

    (loss_big, params_big), (loss_exact, params_exact) = run(1_000_000), run(40)
    assert loss_big == loss_exact
    for a, b in zip(params_big, params_exact):
        assert all(torch.equal(x, y) for x, y in zip(a, b))
