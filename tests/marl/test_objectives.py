"""Multi-agent GAE, value normalisation and the MAPPO/QMIX/VDN losses on hand-computed values."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn

from tdrl.core.modules import ProbabilisticActor
from tdrl.core.modules.distributions import MaskedCategorical
from tdrl.marl.modules import MultiAgentMLP, QMixer
from tdrl.marl.objectives import (
    MAPPOConfig, MAPPOLoss, MultiAgentGAE, PopArt, QMIXConfig, QMIXLoss, ValueNorm, VDNConfig,
    VDNLoss, multi_agent_gae,
)


def test_multi_agent_gae_golden_shared_reward_and_per_agent_done():
    # T=2, 2 agents, gamma=0.5, lambda=1. Shared reward [1, 2]; values 0, next values [0, 4].
    reward = torch.tensor([1.0, 2.0]).reshape(2, 1)
    value = torch.zeros(2, 2, 1)
    next_value = torch.tensor([[0.0, 0.0], [4.0, 4.0]]).reshape(2, 2, 1)
    done = torch.tensor([[False, True], [False, False]]).reshape(2, 2, 1)  # agent 1 ends at t=0
    adv, target = multi_agent_gae(reward, value, next_value, done, done.clone(), 0.5, 1.0)
    # agent 0: delta = [1, 2 + 0.5 * 4] = [1, 4]; adv = [1 + 0.5 * 4, 4] = [3, 4]
    # agent 1: terminated at t=0 -> adv_0 = 1 (no bootstrap, no trace); t=1 restarts: 4
    assert adv.shape == (2, 2, 1)
    torch.testing.assert_close(adv[..., 0], torch.tensor([[3.0, 1.0], [4.0, 4.0]]))
    torch.testing.assert_close(target, adv + value)


def test_multi_agent_gae_shared_inputs_equal_expanded_per_agent():
    torch.manual_seed(0)
    B, T, n = 3, 7, 4
    r, v, nv = torch.randn(B, T, 1), torch.randn(B, T, n, 1), torch.randn(B, T, n, 1)
    d = torch.rand(B, T, 1) < 0.2
    a1, t1 = multi_agent_gae(r, v, nv, d, d, 0.9, 0.8)
    exp = lambda x: x.unsqueeze(-2).expand(B, T, n, 1)  # noqa: E731
    a2, t2 = multi_agent_gae(exp(r), v, nv, exp(d), exp(d), 0.9, 0.8)
    torch.testing.assert_close(a1, a2)
    torch.testing.assert_close(t1, t2)
    with pytest.raises(ValueError, match="expected per-agent"):
        multi_agent_gae(torch.randn(B, T, 2, 1), v, nv, d, d, 0.9, 0.8)


def test_multi_agent_gae_module_reads_global_done():
    td = TensorDict({
        "agents": {"state_value": torch.zeros(1, 2, 2, 1)},
        "next": {"agents": {"reward": torch.ones(1, 2, 2, 1), "state_value": torch.ones(1, 2, 2, 1)},
                 "done": torch.tensor([[[True], [False]]]), "terminated": torch.tensor([[[True], [False]]])},
    }, batch_size=[1, 2])
    MultiAgentGAE(gamma=0.5, lmbda=1.0)(td)
    # t=0 terminated: adv = 1; t=1: 1 + 0.5 * 1 = 1.5 for both agents
    torch.testing.assert_close(td["agents", "advantage"][0, :, :, 0], torch.tensor([[1.0, 1.0], [1.5, 1.5]]))


def test_value_norm_exact_and_ema_statistics():
    torch.manual_seed(0)
    a, b = torch.randn(100, 3, 1) * 4 + 2, torch.randn(50, 3, 1) - 1
    norm = ValueNorm()
    norm.update(a)
    norm.update(b)
    data = torch.cat([a.flatten(), b.flatten()]).double()
    mean, std = norm.stats()
    torch.testing.assert_close(mean, data.mean().reshape(1))
    torch.testing.assert_close(std, data.std(unbiased=False).reshape(1))
    torch.testing.assert_close(norm.denormalize(norm.normalize(a)), a)
    ema = ValueNorm(beta=0.9)
    ema.update(a)  # bias correction: one update gives the batch statistics exactly
    torch.testing.assert_close(ema.stats()[0], a.double().mean().reshape(1))


def test_popart_preserves_denormalised_outputs():
    torch.manual_seed(0)
    head = PopArt(5)
    h = torch.randn(20, 5)
    head.update(torch.randn(30, 1) * 3 + 1)
    before = head.denormalize(head(h))
    head.update(torch.randn(30, 1) * 10 - 5)
    torch.testing.assert_close(head.denormalize(head(h)), before, rtol=1e-5, atol=1e-5)


def _discrete_actor(n_agents=2, n_obs=3, n_actions=4):
    net = TensorDictModule(MultiAgentMLP(n_obs, n_actions, n_agents, num_cells=(8,)),
                           in_keys=[("agents", "observation")], out_keys=[("agents", "logits")])
    return ProbabilisticActor(net, MaskedCategorical, in_keys={"logits": ("agents", "logits")},
                              out_keys=[("agents", "action")])


def test_mappo_loss_golden_at_ratio_one_with_agent_mask():
    torch.manual_seed(0)
    actor = _discrete_actor()
    critic = TensorDictModule(MultiAgentMLP(3, 1, 2, centralised=True, num_cells=(8,)),
                              in_keys=[("agents", "observation")], out_keys=[("agents", "state_value")])
    td = TensorDict({"agents": {"observation": torch.randn(5, 2, 3)}}, [5])
    actor(td)  # samples action and writes the log-prob: ratio == 1
    adv = torch.randn(5, 2, 1)
    target = torch.randn(5, 2, 1)
    mask = torch.tensor([[True, False]] * 5)
    td["agents", "advantage"], td["agents", "value_target"], td["agents", "mask"] = adv, target, mask
    out = MAPPOLoss(actor, critic, MAPPOConfig(critic_coef=1.0))(td)
    torch.testing.assert_close(out["loss_objective"], -adv[:, 0].mean())
    value = critic(td.clone())["agents", "state_value"]
    torch.testing.assert_close(out["loss_critic"], (0.5 * (value - target)[:, 0] ** 2).mean())
    assert float(out["clip_fraction"]) == 0.0 and abs(float(out["ratio_mean"]) - 1) < 1e-6
    td["agents", "advantage"] = torch.randn(5, 3, 1)
    with pytest.raises(ValueError, match="group 'agents'"):
        MAPPOLoss(actor, critic)(td)


def _constant_q(n_agents=2, n_actions=2, table=((1.0, 3.0), (2.0, 0.0))):
    mlp = MultiAgentMLP(1, n_actions, n_agents, share_params=False, num_cells=())
    with torch.no_grad():
        mlp.weights[0].zero_()
        mlp.biases[0].copy_(torch.tensor(table))
    return TensorDictModule(mlp, in_keys=[("agents", "observation")], out_keys=[("agents", "action_value")])


def _q_batch(terminated: bool) -> TensorDict:
    obs = torch.zeros(1, 2, 1)
    return TensorDict({
        "agents": {"observation": obs, "action": torch.tensor([[1, 0]])},
        "next": {"agents": {"observation": obs, "reward": torch.tensor([[[1.0], [3.0]]])},
                 "terminated": torch.tensor([[terminated]])},
    }, [1])


@pytest.mark.parametrize("terminated, expected", [(False, 0.125), (True, 4.5)])
def test_vdn_loss_golden(terminated, expected):
    # chosen Q = [3, 2] -> Q_tot = 5; next greedy Q = [3, 2] -> 5; team reward = mean(1, 3) = 2
    # target = 2 + 0.5 * 5 = 4.5 (or 2 if terminated); loss = 0.5 * (5 - target)^2
    loss = VDNLoss(_constant_q(), 2, VDNConfig(gamma=0.5))
    out = loss(_q_batch(terminated))
    torch.testing.assert_close(out["loss_qvalue"], torch.tensor(expected))
    torch.testing.assert_close(out["q_tot_mean"], torch.tensor(5.0))


def test_qmix_loss_trains_q_and_mixer_and_rejects_vdn_mixer():
    torch.manual_seed(0)
    qnet = _constant_q()
    loss = QMIXLoss(qnet, QMixer((2, 1), 2, 4, 8), QMIXConfig(gamma=0.5))
    out = loss(_q_batch(False))
    out["loss_qvalue"].backward()
    assert qnet.module.biases[0].grad.abs().sum() > 0
    assert all(p.grad is not None for p in loss.mixer.parameters())
    assert all(p.grad is None for p in loss.target_mixer.parameters())
    with pytest.raises(TypeError, match="QMixer"):
        QMIXLoss(qnet, nn.Identity())


def test_mappo_surrogate_equals_core_ppo_off_policy_and_clipped():
    """MAPPO's objective is core's clipped surrogate: without a mask it equals ``PPOLoss``'s
    terms and actor gradients, at ratios away from 1 (some clipped)."""
    from tdrl.core.objectives import PPOLoss
    from tdrl.core.objectives.ppo import clipped_surrogate

    torch.manual_seed(0)
    actor = _discrete_actor()
    td = TensorDict({"agents": {"observation": torch.randn(16, 2, 3)}}, [16])
    actor(td)
    td["agents", "action_log_prob"] = td["agents", "action_log_prob"] + 0.5 * torch.randn(16, 2)
    td["agents", "advantage"] = torch.randn(16, 2, 1)
    ours = MAPPOLoss(actor, None, MAPPOConfig(clip_epsilon=0.2))
    core = PPOLoss(actor, None, clip_epsilon=0.2, entropy_coef=0.0)
    core.set_keys(action=("agents", "action"), sample_log_prob=("agents", "action_log_prob"),
                  advantage=("agents", "advantage"))
    grads = []
    for loss in (ours, core):
        actor.zero_grad()
        out = loss(td.clone())
        out["loss_objective"].backward()
        grads.append([p.grad.clone() for p in actor.parameters()])
        if loss is ours:
            first = out
    assert 0.0 < float(first["clip_fraction"]) < 1.0  # both branches of the min are exercised
    for key in ("loss_objective", "clip_fraction", "kl_approx", "ratio_mean"):
        torch.testing.assert_close(first[key], out[key])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)
    # the shared function itself, by hand: ratio 2 with A=1 clips to 1.2; with A=-1 stays -2
    s, r, _ = clipped_surrogate(torch.log(torch.tensor([2.0, 2.0])), torch.zeros(2), torch.tensor([1.0, -1.0]), 0.2)
    torch.testing.assert_close(s, torch.tensor([1.2, -2.0]))
    torch.testing.assert_close(r, torch.tensor([2.0, 2.0]))
