"""Exploration wrappers and GRU/LSTM modules with episode resets."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import InteractionType, set_interaction_type

from tdrl.core.modules import (
    AdditiveGaussianModule,
    EGreedyModule,
    GRUModule,
    LSTMModule,
    OrnsteinUhlenbeckModule,
)


def test_egreedy_anneals_and_respects_mask():
    torch.manual_seed(0)
    mod = EGreedyModule(4, eps_init=1.0, eps_end=0.0, annealing_num_steps=100,
                        action_mask_key="action_mask")
    mask = torch.tensor([False, True, True, False]).expand(2000, 4)
    td = TensorDict(action=torch.full((2000,), 1), action_mask=mask, batch_size=[2000])
    out = mod(td.clone())["action"]
    assert set(out.unique().tolist()) == {1, 2}  # only allowed actions
    assert 0.4 < (out == 2).float().mean() < 0.6  # eps = 1: uniform over the two
    mod.step(50)
    assert mod.eps == pytest.approx(0.5)
    mod.step(1000)
    assert mod.eps == 0.0
    assert (mod(td.clone())["action"] == 1).all()


def test_egreedy_one_hot_and_deterministic_passthrough():
    mod = EGreedyModule(3, eps_init=1.0, eps_end=1.0, one_hot=True)
    td = TensorDict(action=torch.tensor([[1.0, 0.0, 0.0]]).expand(500, 3).clone(), batch_size=[500])
    out = mod(td.clone())["action"]
    assert out.sum(-1).eq(1).all() and (out.argmax(-1) != 0).any()
    with set_interaction_type(InteractionType.DETERMINISTIC):
        torch.testing.assert_close(mod(td.clone())["action"], td["action"])


def test_additive_gaussian_noise_std_and_bounds():
    torch.manual_seed(0)
    mod = AdditiveGaussianModule(sigma_init=0.5, sigma_end=0.1, annealing_num_steps=10)
    td = TensorDict(action=torch.zeros(20000, 1), batch_size=[20000])
    assert mod(td.clone())["action"].std().item() == pytest.approx(0.5, rel=0.05)
    mod.step(10)
    assert mod.sigma == pytest.approx(0.1)
    clamped = AdditiveGaussianModule(sigma_init=5.0, sigma_end=5.0, low=-1.0, high=1.0)
    a = clamped(td.clone())["action"]
    assert a.min() >= -1 and a.max() <= 1


def test_ou_noise_is_correlated_and_resets_at_is_init():
    torch.manual_seed(0)
    mod = OrnsteinUhlenbeckModule(theta=0.15, sigma_init=0.3, sigma_end=0.3, dt=1.0)
    noises = []
    for t in range(200):
        td = TensorDict(action=torch.zeros(64, 1), is_init=torch.full((64, 1), t == 0),
                        batch_size=[64])
        noises.append(mod(td)["action"])
    n = torch.stack(noises)  # [T, 64, 1]
    corr = torch.corrcoef(torch.stack([n[:-1].flatten(), n[1:].flatten()]))[0, 1]
    assert corr > 0.7  # OU with theta * dt = 0.15: lag-1 correlation 0.85
    is_init = torch.zeros(64, 1, dtype=torch.bool)
    is_init[:32] = True
    mod.init = mod.end = 0.0  # no new noise: a reset env has exactly zero noise
    out = mod(TensorDict(action=torch.zeros(64, 1), is_init=is_init, batch_size=[64]))["action"]
    assert (out[:32] == 0).all() and (out[32:] != 0).all()


@pytest.mark.parametrize("cls", [GRUModule, LSTMModule])
@pytest.mark.parametrize("num_layers", [1, 2])
def test_recurrent_step_mode_matches_sequence_mode_with_resets(cls, num_layers):
    torch.manual_seed(0)
    module = cls(3, 5, num_layers=num_layers)
    B, T = 3, 7
    x = torch.randn(B, T, 3)
    init = torch.zeros(B, T, 1, dtype=torch.bool)
    init[:, 0] = True
    init[0, 4] = True
    init[2, 2] = True
    seq = module.set_recurrent_mode(True)(TensorDict(embed=x, is_init=init, batch_size=[B, T]))
    step = TensorDict(batch_size=[B])
    outs = []
    for t in range(T):
        step["embed"], step["is_init"] = x[:, t], init[:, t]
        module(step)
        outs.append(step["features"])
        # what a collector does: the state written under "next" becomes the next root
        step = TensorDict({k: step["next", k] for k in module.state_keys}, batch_size=[B])
    torch.testing.assert_close(torch.stack(outs, 1), seq["features"])
    for k in module.state_keys:
        assert seq["next", k].shape == (B, T, num_layers, 5)


def test_gru_reset_equals_fresh_start_and_keys():
    torch.manual_seed(0)
    gru = GRUModule(2, 4)
    assert gru.out_keys == ["features", ("next", "recurrent_state")]
    x = torch.randn(1, 6, 2)
    init = torch.zeros(1, 6, 1, dtype=torch.bool)
    init[0, 3] = True
    seq = gru.set_recurrent_mode(True)
    full = seq(TensorDict(embed=x, is_init=init, batch_size=[1, 6]))["features"]
    fresh = seq(TensorDict(embed=x[:, 3:], batch_size=[1, 3]))["features"]
    torch.testing.assert_close(full[:, 3:], fresh)  # after is_init: as if from zero state
    lstm = LSTMModule(2, 4)
    assert ("next", "recurrent_state_c") in lstm.out_keys
    assert set(lstm.initial_state((5,))) == {"recurrent_state_h", "recurrent_state_c"}


def test_gru_policy_in_a_collector_carries_state_and_replays_exactly():
    """Collection in step mode == training replay in recurrent mode, across episode resets
    inside a batch and across batches (the state travels under "next")."""
    from tensordict.nn import TensorDictModule, TensorDictSequential
    from torch import nn

    from tdrl.core import InitTracker, PendulumEnv, TransformedEnv
    from tdrl.core.collectors import Collector

    torch.manual_seed(0)
    env = TransformedEnv(PendulumEnv(batch_size=[2]), InitTracker())
    gru = GRUModule(4, 8)
    policy = TensorDictSequential(
        TensorDictModule(nn.Linear(3, 4), in_keys=["observation"], out_keys=["embed"]),
        gru,
        TensorDictModule(nn.Sequential(nn.Linear(8, 1), nn.Tanh()), in_keys=["features"],
                         out_keys=["action"]),
    )
    collector = Collector(env, policy, frames_per_batch=20, total_frames=40, max_frames_per_traj=4)
    first, second = [batch.clone() for batch in collector]
    assert second["is_init"][:, 1:].any()  # episodes restart inside the batch
    torch.testing.assert_close(second["recurrent_state"][:, 0], first["next", "recurrent_state"][:, -1])
    with torch.no_grad():
        replay = gru.set_recurrent_mode(True)(
            second.select("embed", "is_init", "recurrent_state").clone()
        )
    torch.testing.assert_close(replay["features"], second["features"])
