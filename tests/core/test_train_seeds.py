"""tdrl.core.train.seeds: a seed-stacked PPO update equals the per-seed updates, per-seed
clipping and normalisation match their single-seed formulas, seed-major env blocks start
as the single-seed runs, and bad inputs are refused."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn

from tdrl.core.envs import PendulumEnv, make_env
from tdrl.core.modules import MLP, MaskedCategorical, ProbabilisticActor, ValueOperator
from tdrl.core.objectives import PPOLoss, total_loss
from tdrl.core.train import (
    SeedStackedModule,
    block_seeds,
    build_seeds,
    clip_grad_norm_per_seed,
    normalize_per_seed,
    per_seed,
    seed_sub_envs,
    stacked_seed_counts,
)

OBS, ACT, N = 4, 3, 32


def _actor_critic(seed: int):
    net = MLP(OBS, ACT, (16, 16), nn.Tanh, orthogonal_init=True)
    actor = ProbabilisticActor(TensorDictModule(net, in_keys=["observation"], out_keys=["logits"]),
                               MaskedCategorical, in_keys=["logits"])
    critic = ValueOperator(MLP(OBS, 1, (16, 16), nn.Tanh))
    return actor, critic


def _loss(actor, critic, normalize: bool) -> PPOLoss:
    return PPOLoss(actor, critic, clip_epsilon=0.2, entropy_coef=0.01, normalize_advantage=normalize)


def _batch(seed_actors, gen) -> TensorDict:
    """A seed-major batch [len(seeds) * N]: each block's actions sampled by its own seed's actor,
    advantages of a different scale per seed (so a shared normalisation would show)."""
    blocks = []
    for k, actor in enumerate(seed_actors):
        td = TensorDict({"observation": torch.randn(N, OBS, generator=gen)}, [N])
        with torch.no_grad():
            actor(td)
        td["advantage"] = torch.randn(N, 1, generator=gen) * (1 + 10 * k) + k
        td["value_target"] = torch.randn(N, 1, generator=gen) * (1 + 5 * k)
        blocks.append(td.select("observation", "action", "action_log_prob", "advantage", "value_target"))
    return torch.cat(blocks, 0)


def test_stacked_ppo_update_equals_the_per_seed_updates():
    """Three Adam steps of the stacked model (per-seed advantage normalisation, loss x n_seeds,
    per-seed clipping active) give each seed the parameters of its own single-seed updates."""
    seeds, max_norm = [0, 1], 0.05
    singles = []
    for s in seeds:
        torch.manual_seed(s)
        singles.append(_actor_critic(s))
    actor, critic = build_seeds(_actor_critic, seeds)
    assert stacked_seed_counts(actor) == {2} and stacked_seed_counts(critic) == {2}
    stacked = _loss(actor, critic, normalize=False)
    opt = torch.optim.Adam(stacked.parameters(), lr=1e-2)
    single_losses = [_loss(a, c, normalize=True) for a, c in singles]
    single_opts = [torch.optim.Adam(lf.parameters(), lr=1e-2) for lf in single_losses]
    gen = torch.Generator().manual_seed(7)
    for _ in range(3):
        batch = _batch([a for a, _ in singles], gen)
        mb = batch.clone()
        mb["advantage"] = normalize_per_seed(mb["advantage"], len(seeds))
        opt.zero_grad()
        (total_loss(stacked(mb)) * len(seeds)).backward()
        norms = clip_grad_norm_per_seed(stacked.parameters(), max_norm, len(seeds))
        assert bool((norms > max_norm).all())  # the clip is active for both seeds
        opt.step()
        for k, (lf, o) in enumerate(zip(single_losses, single_opts)):
            o.zero_grad()
            total_loss(lf(per_seed(batch, len(seeds))[k])).backward()
            single_norm = nn.utils.clip_grad_norm_(lf.parameters(), max_norm)
            torch.testing.assert_close(norms[k], single_norm, atol=1e-6, rtol=1e-4)  # each seed's own gradient
            o.step()
    for net, k in ((actor.module[0].module, 0), (actor.module[0].module, 1), (critic.module, 0), (critic.module, 1)):
        single = singles[k][0].module[0].module if net is actor.module[0].module else singles[k][1].module
        for name, value in net.seed_state(k).items():
            torch.testing.assert_close(value, single.state_dict()[name], atol=1e-5, rtol=1e-4)
    changed = actor.module[0].module.seed_state(0)
    torch.manual_seed(0)
    fresh = _actor_critic(0)[0].module[0].module.state_dict()
    assert any(not torch.allclose(changed[n], fresh[n]) for n in fresh)  # the updates moved the weights


def test_stacked_forward_equals_each_seed_and_init_equals_single_runs():
    actor, critic = build_seeds(_actor_critic, [3, 4])
    obs = torch.randn(2 * 5, OBS)
    out = critic(TensorDict({"observation": obs}, [10]))["state_value"]
    for k, s in enumerate([3, 4]):
        torch.manual_seed(s)
        single_actor, single = _actor_critic(s)
        for name, value in single.module.state_dict().items():  # seed s starts as its single run
            assert torch.equal(critic.module.seed_state(k)[name], value)
        for name, value in single_actor.module[0].module.state_dict().items():
            assert torch.equal(actor.module[0].module.seed_state(k)[name], value)
        block = TensorDict({"observation": obs[5 * k:5 * (k + 1)]}, [5])
        torch.testing.assert_close(out[5 * k:5 * (k + 1)], single(block)["state_value"])


def test_clip_per_seed_matches_clip_grad_norm_on_each_slice():
    gen = torch.Generator().manual_seed(0)
    params = [nn.Parameter(torch.zeros(3, 4, 2)), nn.Parameter(torch.zeros(3, 5))]
    grads = [torch.randn(p.shape, generator=gen) * torch.tensor([0.01, 1.0, 10.0]).reshape(3, *[1] * (p.ndim - 1))
             for p in params]
    for p, g in zip(params, grads):
        p.grad = g.clone()
    clip_grad_norm_per_seed(params, 1.0, 3)
    for k in range(3):
        ref = [nn.Parameter(torch.zeros(p.shape[1:])) for p in params]
        for r, g in zip(ref, grads):
            r.grad = g[k].clone()
        nn.utils.clip_grad_norm_(ref, 1.0)
        for p, r in zip(params, ref):
            torch.testing.assert_close(p.grad[k], r.grad)
    torch.testing.assert_close(params[0].grad[0], grads[0][0])  # a small norm is left alone
    with pytest.raises(ValueError, match="leading seed dim"):
        bad = nn.Parameter(torch.zeros(2, 2))
        bad.grad = torch.ones(2, 2)
        clip_grad_norm_per_seed([bad], 1.0, 3)


def test_normalize_per_seed_is_each_blocks_standardisation():
    adv = torch.cat([torch.randn(8, 1), 100 + 50 * torch.randn(8, 1)])
    out = normalize_per_seed(adv, 2)
    for k in range(2):
        blk = adv[8 * k:8 * (k + 1)]
        torch.testing.assert_close(out[8 * k:8 * (k + 1)], (blk - blk.mean()) / blk.std())


def test_block_seeds_start_each_block_as_its_single_run():
    assert block_seeds([0, 10], 3) == [0, 1, 2, 10, 11, 12]
    env = make_env("CartPole-v1", 6, categorical_action_encoding=True)
    seed_sub_envs(env, block_seeds([0, 10], 3))
    obs = env.reset()["observation"]
    for k, s in enumerate([0, 10]):
        single = make_env("CartPole-v1", 3, categorical_action_encoding=True)
        single.set_seed(s)
        assert torch.equal(obs[3 * k:3 * (k + 1)], single.reset()["observation"])
        single.close()
    env.close()


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="repeat a seed"):
        build_seeds(_actor_critic, [1, 1])
    with pytest.raises(ValueError, match="at least one seed"):
        build_seeds(_actor_critic, [])
    stacked = SeedStackedModule([nn.Linear(2, 2), nn.Linear(2, 2)])
    with pytest.raises(ValueError, match="multiple of n_seeds=2"):
        stacked(torch.zeros(3, 2))
    with pytest.raises(TypeError, match="same architecture"):
        build_seeds(lambda s: nn.Linear(2, 2) if s == 0 else nn.GRU(2, 2), [0, 1])
    with pytest.raises(TypeError, match="cannot seed its sub-envs"):
        seed_sub_envs(PendulumEnv(batch_size=(4,)), [0, 1, 2, 3])
    env = make_env("CartPole-v1", 2)
    with pytest.raises(ValueError, match="3 seeds for 2 sub-envs"):
        seed_sub_envs(env, [0, 1, 2])
    env.close()


class _Scaled(nn.Module):
    """A layer with its own seed-stacked path and a buffer (counts the batched calls)."""

    calls = 0

    def __init__(self, d: int) -> None:
        super().__init__()
        self.lin = nn.Linear(d, 2 * d)
        self.register_buffer("scale", torch.rand(2 * d) + 0.5)

    def forward(self, x):
        return self.lin(x) * self.scale

    def seed_stacked_forward(self, params, x):
        type(self).calls += 1
        lead = x.shape[1:-1]
        rows = x.reshape(x.shape[0], -1, x.shape[-1])
        out = torch.baddbmm(params["lin.bias"].unsqueeze(1), rows, params["lin.weight"].transpose(1, 2))
        return (out * params["scale"].unsqueeze(1)).reshape(x.shape[0], *lead, -1)


@pytest.mark.parametrize("flatten, batched", [(nn.Flatten(-2, -1), True), (nn.Flatten(2), False)])
def test_a_sequence_of_own_paths_and_trailing_steps_runs_batched(flatten, batched):
    """``nn.Sequential(flatten, own-path layer (with a buffer), Tanh, NormalParamExtractor)``
    stacked over 3 seeds equals each seed's own forward; it takes the batched path (the layer's
    ``seed_stacked_forward``) when every other step acts on trailing dims, vmap otherwise
    (a flatten from dim 2 would read the seed dim as a batch dim)."""
    from tensordict.nn import NormalParamExtractor

    nets = []
    for seed in range(3):
        torch.manual_seed(seed)
        nets.append(nn.Sequential(flatten, _Scaled(6), nn.Tanh(), NormalParamExtractor()))
    stacked = SeedStackedModule(nets)
    x = torch.randn(3 * 5, 4, 2, 3)
    _Scaled.calls = 0
    loc, scale = stacked(x)
    assert (_Scaled.calls == 1) is batched
    for k, net in enumerate(nets):
        want_loc, want_scale = net(x[k * 5:(k + 1) * 5])
        torch.testing.assert_close(loc[k * 5:(k + 1) * 5], want_loc, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(scale[k * 5:(k + 1) * 5], want_scale, rtol=1e-5, atol=1e-6)
