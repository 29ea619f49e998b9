"""MADDPG / IDDPG / MASAC / ISAC / IQL: the multi-agent parts around core's DDPG / SAC / DQN losses
(agent view, critic inputs, target networks, clip groups, BenchMARL defaults, action-kind refusals)."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdrl.core.objectives import total_loss
from tdrl.marl.algorithms import ALGORITHMS, make_groups, make_iddpg, make_iql, make_maddpg, make_masac
from tdrl.marl.envs import VmasEnv
from tdrl.marl.objectives import (
    IDDPGConfig, IQLConfig, ISACConfig, MADDPGConfig, MASACConfig, agent_view,
)
from tdrl.marl.runner import BenchConfig


@pytest.fixture(scope="module")
def cont_env():
    return VmasEnv("navigation", num_envs=3, max_steps=10, seed=0, n_agents=2)


@pytest.fixture(scope="module")
def disc_env():
    return VmasEnv("navigation", num_envs=3, max_steps=10, seed=0, n_agents=2, continuous_actions=False)


def _batch(env, policy, steps=4):
    torch.manual_seed(1)
    with torch.no_grad():  # as the collector: no graph in the stored transitions
        return env.rollout(steps, policy).reshape(-1)


def test_agent_view_expands_the_shared_terminated_flag_without_touching_the_batch():
    td = TensorDict({"agents": TensorDict({"observation": torch.zeros(2, 3, 4)}, [2, 3]),
                     "next": TensorDict({"agents": TensorDict({"observation": torch.ones(2, 3, 4),
                                                               "reward": torch.ones(2, 3, 1)}, [2, 3]),
                                         "terminated": torch.tensor([[True], [False]])}, [2])}, [2])
    view = agent_view(td, "agents")
    assert view.batch_size == (2, 3)
    assert view["next", "agents", "terminated"].shape == (2, 3, 1)
    assert view["next", "agents", "terminated"][:, :, 0].tolist() == [[True] * 3, [False] * 3]
    assert ("next", "agents", "terminated") not in td.keys(True)  # the batch itself is unchanged


def test_iql_loss_equals_the_hand_computed_per_agent_dqn_loss(disc_env):
    torch.manual_seed(0)
    parts = make_iql(disc_env, IQLConfig(gamma=0.9), num_cells=(8,))
    batch = _batch(disc_env, parts.policy)
    out = parts.loss(batch)
    qnet = parts.loss.loss.value_network.module  # MultiAgentMLP on [*B, n, obs]
    with torch.no_grad():
        q = qnet(batch["agents", "observation"])  # [B, n, A]
        a = batch["agents", "action"].long()
        q_a = q.gather(-1, a.reshape(*a.shape[:2], 1))
        next_q = qnet(batch["next", "agents", "observation"]).max(-1, keepdim=True).values  # target == online
        term = batch["next", "terminated"].reshape(-1, 1, 1).float()
        target = batch["next", "agents", "reward"] + 0.9 * (1 - term) * next_q
        expected = (0.5 * (q_a - target) ** 2).mean()
    assert float(out["loss_qvalue"].detach()) == pytest.approx(float(expected), rel=1e-5)
    assert set(out.keys()) >= {"loss_qvalue", "q_mean", "target_mean"}


@pytest.mark.parametrize("build, centralised", [(make_maddpg, True), (make_iddpg, False)])
def test_only_the_centralised_critic_sees_the_other_agents_action(cont_env, build, centralised):
    torch.manual_seed(0)
    parts = build(cont_env, num_cells=(16,))
    critic = parts.loss.loss.qvalue
    td = cont_env.reset()
    td = parts.policy(td)
    q = critic(td.clone())["agents", "state_action_value"]  # [E, n, 1]
    moved = td.clone()
    moved["agents", "action"][:, 1] = -moved["agents", "action"][:, 1] + 0.5  # change agent 1's action only
    q2 = critic(moved)["agents", "state_action_value"]
    assert torch.allclose(q[:, 0], q2[:, 0]) is not centralised  # agent 0's value
    assert not torch.allclose(q[:, 1], q2[:, 1])


def test_ddpg_targets_and_clip_groups_follow_benchmarl(cont_env):
    torch.manual_seed(0)
    parts = make_maddpg(cont_env, num_cells=(8,))
    core = parts.loss.loss
    # BenchMARL's MADDPG: TorchRL DDPGLoss(delay_value=True), delay_actor left at False
    assert [type(t).__name__ for _, t in parts.loss.target_pairs()] == ["TensorDictModule"]
    assert not hasattr(core, "target_actor")
    groups = parts.loss.clip_groups()
    assert [sum(p.numel() for p in g) for g in groups] == [
        sum(p.numel() for p in core.actor.parameters()), sum(p.numel() for p in core.qvalue.parameters())]
    batch = _batch(cont_env, parts.policy)
    out = parts.loss(batch)
    total_loss(out).backward()
    assert all(p.grad is not None for g in groups for p in g)
    assert all(p.grad is None for p in core.target_qvalue.parameters())


def test_masac_tunes_alpha_towards_minus_one_agents_action_dim(cont_env):
    torch.manual_seed(0)
    parts = make_masac(cont_env, num_cells=(8,))
    batch = _batch(cont_env, parts.policy)
    out = parts.loss(batch)
    assert parts.loss.loss.temperature.target_entropy == -2.0  # navigation: 2-d force per agent
    assert len(parts.loss.loss.qvalue) == 2 and float(out["alpha"]) == pytest.approx(1.0)
    assert [len(g) for g in parts.loss.clip_groups()][-1] == 1  # log_alpha on its own
    assert parts.explore is None  # SAC explores by sampling


def test_configs_carry_benchmarl_defaults():
    for c in (MADDPGConfig(), IDDPGConfig()):  # maddpg.yaml / iddpg.yaml + base_experiment.yaml
        assert (c.loss_function, c.share_param_critic, c.delay_actor, c.gamma, c.tau) == ("l2", True, False, 0.99, 0.005)
        assert (c.sigma_init, c.sigma_end) == (0.8, 0.01)
    assert MADDPGConfig().centralised_critic and not IDDPGConfig().centralised_critic
    for c in (MASACConfig(), ISACConfig()):  # masac.yaml / isac.yaml
        assert (c.num_qvalue_nets, c.loss_function, c.alpha_init, c.min_alpha, c.max_alpha, c.fixed_alpha,
                c.target_entropy, c.share_param_critic) == (2, "l2", 1.0, None, None, False, "auto", True)
    assert MASACConfig().centralised_critic and not ISACConfig().centralised_critic
    c = IQLConfig()  # iql.yaml
    assert (c.loss_function, c.double_dqn, c.eps_init, c.eps_end, c.tau) == ("l2", False, 0.8, 0.01, 0.005)


@pytest.mark.parametrize("algo", ["maddpg", "iddpg", "masac", "isac"])
def test_continuous_algorithms_refuse_discrete_actions(disc_env, algo):
    with pytest.raises(TypeError, match=rf"{algo.upper()} needs continuous actions.*continuous_actions=True"):
        make_groups(algo, disc_env)


def test_iql_refuses_continuous_actions(cont_env):
    with pytest.raises(TypeError, match="IQL needs discrete actions.*continuous_actions=False"):
        make_groups("iql", cont_env)


def test_runner_refuses_iql_on_a_continuous_only_task_before_training(tmp_path):
    with pytest.raises(ValueError, match="iql needs discrete actions, but pettingzoo/multiwalker"):
        BenchConfig(algorithms=("maddpg", "iql"), tasks=("balance", "pettingzoo/multiwalker"), out_dir=str(tmp_path))
    assert not any(tmp_path.iterdir())


def test_registry_names_the_new_algorithms():
    assert {"maddpg", "iddpg", "masac", "isac", "iql"} <= set(ALGORITHMS)
    assert [ALGORITHMS[a].continuous for a in ("maddpg", "iddpg", "masac", "isac", "iql")] == [True] * 4 + [False]
