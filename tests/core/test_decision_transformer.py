"""Decision Transformer: returns-to-go and timesteps by hand, window sampling against a naive
construction, causal masking (an output at t does not depend on anything after t, nor on the
action at t), padding, the masked loss, and the inference loop's return-to-go bookkeeping."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdrl.core.modules import DecisionTransformer, DecisionTransformerPolicy
from tdrl.core.objectives import DTLoss, returns_to_go, sample_windows
from tdrl.core.objectives.dt import episode_timesteps


def test_returns_to_go_and_timesteps_by_hand():
    reward = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, -1.0])
    episode = torch.tensor([0, 0, 0, 1, 1, 4])
    assert returns_to_go(reward, episode).tolist() == [6.0, 5.0, 3.0, 9.0, 5.0, -1.0]
    assert returns_to_go(reward[:, None], episode).shape == (6,)
    assert episode_timesteps(episode).tolist() == [0, 1, 2, 0, 1, 0]
    with pytest.raises(ValueError, match="non-decreasing"):
        returns_to_go(reward, torch.tensor([0, 1, 0, 1, 2, 2]))


def _data():
    episode = torch.tensor([0, 0, 0, 0, 1, 1, 2])
    reward = torch.arange(7.0)
    return TensorDict(observation=torch.arange(7.0)[:, None] * 10, action=torch.arange(7.0)[:, None],
                      returns_to_go=returns_to_go(reward, episode)[:, None],
                      timestep=episode_timesteps(episode), episode=episode, batch_size=[7])


def test_windows_match_a_naive_construction():
    data, k = _data(), 3
    g = torch.Generator().manual_seed(0)
    w = sample_windows(data, k, 64, generator=g)
    starts = torch.randint(0, 7, (64,), generator=torch.Generator().manual_seed(0))
    assert w.shape == (64, k)
    for b, s in enumerate(starts.tolist()):
        steps = [i for i in range(s, min(s + k, 7)) if data["episode"][i] == data["episode"][s]]
        m = len(steps)  # right-padded
        assert w["mask"][b].tolist() == [True] * m + [False] * (k - m)
        assert w["action"][b, :m, 0].tolist() == [float(i) for i in steps]
        assert w["timestep"][b, :m].tolist() == data["timestep"][steps].tolist()
        assert w["returns_to_go"][b, :m, 0].tolist() == data["returns_to_go"][steps, 0].tolist()
        assert float(w["observation"][b, m:].abs().sum()) == 0.0


def _model(**kw):
    torch.manual_seed(0)
    return DecisionTransformer(3, 2, embed_dim=16, num_layers=2, num_heads=2, context=6, max_timestep=50,
                               action_low=-2.0, action_high=2.0, **kw).eval()


def _inputs(b=2, t=6):
    g = torch.Generator().manual_seed(1)
    return (torch.randn(b, t, 1, generator=g), torch.randn(b, t, 3, generator=g),
            torch.randn(b, t, 2, generator=g), torch.arange(t).expand(b, t).clone())


def test_causal_masking():
    model = _model()
    rtg, obs, act, ts = _inputs()
    with torch.no_grad():
        base = model(rtg, obs, act, ts)
        assert base.shape == (2, 6, 2) and bool((base.abs() <= 2.0).all())
        for t in range(5):
            r2, o2, a2 = rtg.clone(), obs.clone(), act.clone()
            r2[:, t + 1:] += 5.0
            o2[:, t + 1:] -= 3.0
            a2[:, t:] += 4.0  # the action at t comes after the prediction at t
            out = model(r2, o2, a2, ts)
            torch.testing.assert_close(out[:, : t + 1], base[:, : t + 1])
            assert not torch.allclose(out[:, t + 1:], base[:, t + 1:])  # later ones do change


def test_left_padding_equals_the_short_window():
    model = _model()
    rtg, obs, act, ts = _inputs(b=1)
    mask = torch.tensor([[False, False, True, True, True, True]])
    junk = [x.clone() for x in (rtg, obs, act)]
    for x in junk:
        x[:, :2] = 7.0
    with torch.no_grad():
        padded = model(*junk, ts, mask)
        short = model(rtg[:, 2:], obs[:, 2:], act[:, 2:], ts[:, 2:])
    torch.testing.assert_close(padded[:, 2:], short, rtol=1e-5, atol=1e-5)


def test_loss_is_the_masked_mse():
    model = _model()
    rtg, obs, act, ts = _inputs()
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[0, :3] = False
    td = TensorDict(returns_to_go=rtg, observation=obs, action=act, timestep=ts, mask=mask, batch_size=[2, 6])
    out = DTLoss(model)(td)
    with torch.no_grad():
        pred = model(rtg, obs, act, ts, mask)
    terms = [((pred[b, t] - act[b, t]) ** 2).mean() for b in range(2) for t in range(6) if mask[b, t]]
    assert out["loss_actor"].item() == pytest.approx(float(sum(terms) / len(terms)), rel=1e-5)
    assert out["loss_actor"].requires_grad


def test_inference_loop_conditions_on_a_decremented_return():
    model = _model()
    policy = DecisionTransformerPolicy(model, target_return=10.0, num_envs=2, return_scale=2.0)
    g = torch.Generator().manual_seed(3)
    obs = [torch.randn(2, 3, generator=g) for _ in range(8)]
    rewards = [torch.tensor([3.0, -1.0]) * (i + 1) for i in range(8)]
    actions = []
    for o, r in zip(obs, rewards):
        actions.append(policy.act(o))
        policy.observe(r)
    # by hand: R_0 = 10, R_{t+1} = R_t - r_t, in units of 2
    rtg = [torch.tensor([10.0, 10.0])]
    for r in rewards[:-1]:
        rtg.append(rtg[-1] - r)
    assert torch.allclose(policy.rtg[:, :, 0], torch.stack(rtg[-6:], 1) / 2.0)
    assert policy.steps[0].tolist() == [2, 3, 4, 5, 6, 7]
    # the last action = the model on the last 6 steps, the current action a placeholder
    with torch.no_grad():
        want = model(torch.stack(rtg[2:], 1)[..., None] / 2.0, torch.stack(obs[2:], 1),
                     torch.cat([torch.stack(actions[2:7], 1), torch.zeros(2, 1, 2)], 1),
                     torch.arange(2, 8).expand(2, 6))[:, -1]
    torch.testing.assert_close(actions[-1], want)
    policy.reset()
    assert policy.obs.shape == (2, 0, 3) and float(policy.next_rtg[0, 0, 0]) == 5.0


def test_timestep_embedding_starts_small_beside_the_token_embeddings():
    # GPT-2's N(0, 0.02) position-embedding init: with nn.Embedding's N(0, 1) the timestep vector
    # dominates each token at init (the learning regression this guards against)
    model = DecisionTransformer(3, 2, embed_dim=64, max_timestep=200)
    assert 0.015 < float(model.embed_time.weight.std()) < 0.025
    obs = torch.randn(256, 3)
    token = model.embed_obs(obs)
    time = model.embed_time(torch.randint(0, 200, (256,)))
    assert float(time.norm(dim=-1).mean()) < 0.5 * float(token.norm(dim=-1).mean())


def test_bad_inputs():
    model = _model()
    rtg, obs, act, ts = _inputs(t=6)
    with pytest.raises(ValueError, match="observation"):
        model(rtg, obs[..., :2], act, ts)
    with pytest.raises(ValueError, match="context"):
        model(*(torch.cat([x, x], 1) for x in (rtg, obs, act, ts)))
    with pytest.raises(ValueError, match="num_heads"):
        DecisionTransformer(3, 2, embed_dim=10, num_heads=3)
