"""PPO and A2C: golden values, gradient steps on a bandit, bad input."""

from __future__ import annotations

import math

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn

from tdrl.core.modules import (
    MLP,
    IndependentNormal,
    MaskedCategorical,
    NormalParamExtractor,
    ProbabilisticActor,
    TanhNormal,
    ValueOperator,
)
from tdrl.core.objectives import A2CLoss, PPOLoss, total_loss


class Logits(nn.Module):
    """State-independent logits: a 3-armed bandit policy."""

    def __init__(self, logits):
        super().__init__()
        self.logits = nn.Parameter(torch.tensor(logits))

    def forward(self, obs):
        return self.logits.expand(*obs.shape[:-1], self.logits.shape[-1])


def bandit_actor(logits=(0.0, 0.0, 0.0)):
    net = TensorDictModule(Logits(list(logits)), in_keys=["observation"], out_keys=["logits"])
    return ProbabilisticActor(net, MaskedCategorical, in_keys=["logits"])


def bandit_batch(actor, n=64, seed=0):
    torch.manual_seed(seed)
    td = TensorDict(observation=torch.zeros(n, 1), batch_size=[n])
    with torch.no_grad():
        actor(td)
    reward = (td["action"] == 2).float().unsqueeze(-1)  # arm 2 pays 1
    td["advantage"] = reward - reward.mean()
    td["value_target"] = reward
    td["state_value"] = torch.zeros(n, 1)
    return td


def test_ppo_golden_clipped_objective():
    actor = bandit_actor()
    td = TensorDict(
        observation=torch.zeros(3, 1),
        action=torch.tensor([0, 1, 2]),
        action_log_prob=torch.log(torch.tensor([0.5, 1 / 3, 0.25])),  # ratios 2/3, 1, 4/3
        advantage=torch.tensor([[1.0], [2.0], [-1.0]]),
        batch_size=[3],
    )
    out = PPOLoss(actor, None, clip_epsilon=0.2, entropy_coef=0.0)(td)
    r = torch.tensor([2 / 3, 1.0, 4 / 3])
    a = torch.tensor([1.0, 2.0, -1.0])
    expected = -torch.minimum(r * a, r.clamp(0.8, 1.2) * a).mean()
    # by hand: min(2/3, 0.8) = 2/3; 2; min(-4/3, -1.2) = -4/3 -> -(2/3 + 2 - 4/3) / 3
    assert math.isclose(expected.item(), -(2 / 3 + 2 - 4 / 3) / 3, rel_tol=1e-6)
    torch.testing.assert_close(out["loss_objective"], expected)
    torch.testing.assert_close(out["clip_fraction"], torch.tensor(2 / 3))
    kl = ((r - 1) - r.log()).mean()
    torch.testing.assert_close(out["kl_approx"], kl)


def test_ppo_kl_penalty_and_adaptive_coef():
    actor = bandit_actor((1.0, 0.0, 0.0))
    td = bandit_batch(bandit_actor(), n=32)
    loss = PPOLoss(actor, None, clip_epsilon=None, kl_coef=0.5, entropy_coef=0.0)
    out = loss(td)
    torch.testing.assert_close(out["loss_kl"], 0.5 * out["kl_approx"])
    assert out["kl_approx"] > 0
    adaptive = PPOLoss(actor, None, clip_epsilon=None, kl_target=1e-6, entropy_coef=0.0)
    adaptive(td)
    assert adaptive.kl_coef.item() == 2.0  # KL far above target: coefficient doubled


def test_ppo_value_clipping_golden():
    critic = ValueOperator(nn.Linear(1, 1))
    nn.init.zeros_(critic.module.weight)
    nn.init.constant_(critic.module.bias, 1.0)  # V(s) = 1
    td = bandit_batch(bandit_actor(), n=4)
    td["state_value"] = torch.zeros(4, 1)  # old value 0
    td["value_target"] = torch.full((4, 1), 2.0)
    loss = PPOLoss(bandit_actor(), critic, clip_value=0.5, critic_coef=1.0, entropy_coef=0.0)
    out = loss(td)
    # unclipped: 0.5 * (1 - 2)^2 = 0.5; clipped value 0.5: 0.5 * 1.5^2 = 1.125 -> max
    torch.testing.assert_close(out["loss_critic"], torch.tensor(1.125))
    torch.testing.assert_close(out["value_clip_fraction"], torch.tensor(1.0))


def test_a2c_golden():
    actor = bandit_actor()
    td = TensorDict(
        observation=torch.zeros(2, 1),
        action=torch.tensor([0, 2]),
        advantage=torch.tensor([[1.0], [3.0]]),
        batch_size=[2],
    )
    out = A2CLoss(actor, None, entropy_coef=0.1)(td)
    lp = math.log(1 / 3)
    torch.testing.assert_close(out["loss_objective"], torch.tensor(-(lp * 1 + lp * 3) / 2))
    torch.testing.assert_close(out["loss_entropy"], torch.tensor(-0.1 * math.log(3)))


@pytest.mark.parametrize("loss_cls", [PPOLoss, A2CLoss])
def test_gradient_steps_increase_best_arm_and_fit_critic(loss_cls):
    actor = bandit_actor()
    critic = ValueOperator(MLP(1, 1, num_cells=(8,)))
    td = bandit_batch(actor, n=128)
    td["value_target"] = td["value_target"] + 2.0  # far from the initial V ~ 0
    loss = loss_cls(actor, critic, entropy_coef=0.0)
    opt = torch.optim.Adam(loss.parameters(), lr=0.05)
    first = loss(td)
    for _ in range(10):
        out = loss(td)
        opt.zero_grad()
        total_loss(out).backward()
        opt.step()
    probs = torch.softmax(actor.module[0].module.logits.detach(), -1)
    assert probs[2] > 0.45  # started at 1/3
    assert loss(td)["loss_critic"] < first["loss_critic"]
    assert loss(td)["loss_objective"] < first["loss_objective"]


def test_ppo_continuous_tanh_normal_entropy_estimate_and_grad():
    net = TensorDictModule(
        nn.Sequential(MLP(3, 4, num_cells=(16,)), NormalParamExtractor()),
        in_keys=["observation"], out_keys=["loc", "scale"],
    )
    for dist_cls in (TanhNormal, IndependentNormal):
        actor = ProbabilisticActor(net, dist_cls)
        td = TensorDict(observation=torch.randn(16, 3), batch_size=[16])
        with torch.no_grad():
            actor(td)
        td["advantage"] = torch.randn(16, 1)
        loss = PPOLoss(actor, None, entropy_coef=0.01)
        out = loss(td)
        assert torch.isfinite(out["entropy"])
        total_loss(out).backward()
        assert all(p.grad is not None for p in net.parameters())
        # a fresh batch from the same policy has ratio 1
        torch.testing.assert_close(out["ratio_mean"], torch.tensor(1.0))


def test_missing_key_names_key_and_found_keys():
    td = bandit_batch(bandit_actor(), n=4).exclude("advantage")
    with pytest.raises(KeyError, match=r"'advantage'.*Keys found.*'action_log_prob'"):
        PPOLoss(bandit_actor(), None)(td)
    loss = PPOLoss(bandit_actor(), None).set_keys(advantage="adv")
    td["adv"] = torch.ones(4, 1)
    assert torch.isfinite(loss(td)["loss_objective"])
    with pytest.raises(KeyError, match="unknown names"):
        loss.set_keys(advantge="x")


def test_check_finite_names_the_term():
    td = bandit_batch(bandit_actor(), n=4)
    td["value_target"] = torch.full((4, 1), float("nan"))
    critic = ValueOperator(MLP(1, 1, num_cells=(4,)))
    PPOLoss(bandit_actor(), critic)(td)  # no check: NaN passes silently
    with pytest.raises(FloatingPointError, match="loss_critic"):
        PPOLoss(bandit_actor(), critic, check_finite=True)(td)


def test_k3_estimate_by_hand_and_against_the_closed_form_kl():
    from tdrl.core.objectives.common import k3_estimate

    ln2 = math.log(2.0)
    got = k3_estimate(torch.tensor([0.0, ln2, -ln2], dtype=torch.float64))
    expected = torch.tensor([0.0, 2 - 1 - ln2, 0.5 - 1 + ln2], dtype=torch.float64)
    torch.testing.assert_close(got, expected)
    # unbiased: samples of p = N(0, 1), log q - log p with q = N(0.5, 1); KL(p || q) = 0.125
    x = torch.randn(400_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    p, q = torch.distributions.Normal(0.0, 1.0), torch.distributions.Normal(0.5, 1.0)
    assert abs(float(k3_estimate(q.log_prob(x) - p.log_prob(x)).mean()) - 0.125) < 3e-3


def test_masked_mean_by_hand():
    from tdrl.core.objectives.common import masked_mean

    x = torch.tensor([[1.0, 2.0], [3.0, 40.0]])
    assert float(masked_mean(x, torch.tensor([[True, True], [True, False]]))) == 2.0
    # a [B] mask broadcasts over the trailing dim; None is the plain mean; empty gives 0
    assert float(masked_mean(x, torch.tensor([False, True]))) == 21.5
    assert float(masked_mean(x, None)) == 11.5
    assert float(masked_mean(x, torch.zeros(2, 2, dtype=torch.bool))) == 0.0
