"""tdrl.core.train.SeedAxis: one object owns what is seed-shaped. Several seeds stack (each
seed's slice as its single run builds it), one seed is a stack of one that keeps the plain
networks and the single-run formulas bit for bit, env blocks start as their single runs, and
batches, replay, metrics and evaluation split per seed."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn

from tdrl.core import RewardSum
from tdrl.core.envs import make_env
from tdrl.core.modules import (
    MLP,
    MaskedCategorical,
    NormalParamExtractor,
    ProbabilisticActor,
    TanhNormal,
    ValueOperator,
)
from tdrl.core.objectives import SACLoss
from tdrl.core.train import ConfigError, SeedAxis, SeedStackedModule, StackedTemperature, stacked_seed_counts


def _net(seed: int) -> nn.Module:
    return MLP(4, 2, (8,), nn.Tanh)


def _actor(seed: int):
    return ProbabilisticActor(TensorDictModule(MLP(4, 2, (8,), nn.Tanh), in_keys=["observation"],
                                               out_keys=["logits"]), MaskedCategorical, in_keys=["logits"])


def test_one_seed_keeps_the_plain_network_and_several_stack_their_single_runs():
    one = SeedAxis([7]).build(_net)
    torch.manual_seed(7)
    ref = _net(7)
    assert not stacked_seed_counts(one) and type(one) is MLP
    assert all(torch.equal(a, b) for a, b in zip(one.parameters(), ref.parameters()))
    three = SeedAxis([7, 8, 9]).build(_net)
    assert isinstance(three, SeedStackedModule) and three.n_seeds == 3
    for k, s in enumerate([7, 8, 9]):
        torch.manual_seed(s)
        want = _net(s).state_dict()
        assert all(torch.equal(v, want[n]) for n, v in three.seed_state(k).items())
    x = torch.randn(3 * 5, 4)
    torch.manual_seed(8)
    torch.testing.assert_close(three(x)[5:10], _net(8)(x[5:10]))


def test_minibatches_take_the_same_positions_of_every_seed():
    axis = SeedAxis([0, 1, 2])
    flat = TensorDict({"x": torch.arange(3 * 8.0)}, [24])  # seed k's rows: 8k .. 8k + 7
    torch.manual_seed(0)
    mbs = list(axis.minibatches(flat, 4))
    assert len(mbs) == 2 and all(mb.shape == (12,) for mb in mbs)
    pos = [axis.split(mb["x"]) - torch.tensor([[0.0], [8.0], [16.0]]) for mb in mbs]
    for p in pos:  # the same in-block positions for the three seeds
        assert torch.equal(p[0], p[1]) and torch.equal(p[1], p[2])
    assert sorted(torch.cat([p[0] for p in pos]).tolist()) == list(range(8))  # one pass covers each row once
    torch.manual_seed(0)
    one = list(SeedAxis([0]).minibatches(flat[:8], 4))
    torch.manual_seed(0)
    perm = torch.randperm(8)  # a single run's draw: one randperm of its rows per pass
    assert torch.equal(torch.cat([mb["x"] for mb in one]), perm.float())


def test_normalize_and_backward_are_per_seed_and_exact_for_one_seed():
    adv = torch.cat([torch.randn(16, 1) * 10 + 3, torch.randn(16, 1) * 0.1 - 2])
    out = SeedAxis([0, 1]).normalize(adv)
    for blk, raw in zip(out.reshape(2, 16), adv.reshape(2, 16)):
        torch.testing.assert_close(blk, (raw - raw.mean()) / raw.std())
    a = adv[:16]
    assert torch.equal(SeedAxis([0]).normalize(a), (a - a.mean()) / a.std().clamp_min(1e-8))  # PPOLoss's formula
    w = torch.ones(4, requires_grad=True)
    SeedAxis([0, 1]).backward((w * torch.tensor([1.0, 2, 3, 4])).mean())
    torch.testing.assert_close(w.grad, torch.tensor([0.5, 1.0, 1.5, 2.0]))  # x2: each seed's own mean (2 rows)


def test_clip_is_per_seed_and_torchs_for_one_seed():
    stacked = SeedAxis([0, 1]).build(_net)
    (stacked(torch.randn(10, 4)).pow(2).sum() * 100).backward()
    grads = [p.grad.clone() for p in stacked.parameters()]
    norms = SeedAxis([0, 1]).clip_grad_norm_(stacked.parameters(), 0.5)
    for k in range(2):
        want = torch.cat([g[k].reshape(-1) for g in grads]).norm()
        torch.testing.assert_close(norms[k], want)
        got = torch.cat([p.grad[k].reshape(-1) for p in stacked.parameters()]).norm()
        torch.testing.assert_close(got, torch.tensor(0.5), rtol=1e-4, atol=1e-4)
    plain, ref = _net(0), _net(0)
    ref.load_state_dict(plain.state_dict())
    x = torch.randn(5, 4)
    for m in (plain, ref):
        (m(x).pow(2).sum() * 100).backward()
    SeedAxis([0]).clip_grad_norm_(plain.parameters(), 0.5)
    nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(plain.parameters(), ref.parameters()))


def test_env_blocks_start_as_their_single_runs():
    axis = SeedAxis([3, 10], envs_per_seed=2)
    env = make_env("CartPole-v1", axis.num_envs)
    axis.seed_envs(env, offset=5)
    obs = env.reset()["observation"]
    for k, s in enumerate(axis.seeds):
        single = make_env("CartPole-v1", 2)
        SeedAxis([s]).seed_envs(single, offset=5)
        torch.testing.assert_close(obs[2 * k:2 * k + 2], single.reset()["observation"], rtol=0, atol=0)
        single.close()
    env.close()
    assert axis.env_seeds(offset=5) == [8, 9, 15, 16]


def test_replay_metrics_and_state_names():
    axis = SeedAxis([4, 6])
    td = TensorDict({"x": torch.arange(6.0)}, [6])
    items = axis.to_replay(td)
    assert items.shape == (3,) and items["x"].tolist() == [[0, 3], [1, 4], [2, 5]]
    back = axis.from_replay(items[torch.tensor([2, 0])].set("index", torch.tensor([2, 0])))
    assert back["x"].tolist() == [2, 0, 5, 3]
    one = SeedAxis([4])
    assert one.to_replay(td) is td and one.from_replay(td) is td
    assert axis.metrics("r", [1.0, 3.0]) == {"r": 2.0, "r/seed_4": 1.0, "r/seed_6": 3.0}
    assert one.metrics("r", [1.5]) == {"r": 1.5} and one.names("r") == [] and one.summary("r", [1.5]) == {}
    assert axis.summary("r", [1.0, 3.0]) == {"seeds": [4, 6], "r_seeds": [1.0, 3.0]}
    assert axis.state("sc", ["a", "b"]) == {"sc_0": "a", "sc_1": "b"} and one.state("sc", ["a"]) == {"sc": "a"}
    batch = TensorDict({"next": {"done": torch.tensor([[False, True], [True, False], [False, False], [True, True]]),
                                 "episode_reward": torch.tensor([[1.0, 2], [3, 4], [5, 6], [7, 8]])}}, [4, 2])
    assert axis.episode_returns(batch) == [[2.0, 3.0], [7.0, 8.0]]
    assert one.episode_returns(batch) == [[2.0, 3.0, 7.0, 8.0]]


def test_evaluate_gives_each_seed_its_single_run():
    def env(n):
        return make_env("CartPole-v1", n, (RewardSum(),), categorical_action_encoding=True)

    axis = SeedAxis([0, 1])
    per_seed = axis.evaluate(env, axis.build(_actor), 2, offset=100)
    singles = []
    for s in axis.seeds:
        one = SeedAxis([s])
        singles += one.evaluate(env, one.build(_actor), 2, 100)
    assert per_seed == pytest.approx(singles, abs=1e-4)


def test_stacked_sac_loss_holds_one_temperature_per_seed_and_refusals():
    def loss(seed):
        net = nn.Sequential(MLP(3, 2, (8,), nn.ReLU), NormalParamExtractor())
        actor = ProbabilisticActor(TensorDictModule(net, in_keys=["observation"], out_keys=["loc", "scale"]),
                                   TanhNormal, return_log_prob=False)
        q = ValueOperator(MLP(4, 1, (8,), nn.ReLU), in_keys=["observation", "action"], out_keys=["state_action_value"])
        return SACLoss(actor, q, alpha_init=0.5 + seed)

    stacked = SeedAxis([0, 1]).build_loss(loss)
    assert isinstance(stacked.temperature, StackedTemperature)
    torch.testing.assert_close(stacked.temperature.alpha, torch.tensor([0.5, 1.5]))
    like = torch.zeros(4, 1)
    assert stacked.temperature.alpha_for(like).reshape(-1).tolist() == pytest.approx([0.5, 0.5, 1.5, 1.5])
    assert type(SeedAxis([0]).build_loss(loss).temperature).__name__ == "EntropyTemperature"
    with pytest.raises(ConfigError, match="norm_obs.*2 seeds"):
        SeedAxis([0, 1]).refuse_shared("norm_obs", True)
    SeedAxis([0]).refuse_shared("norm_obs", True)  # one seed shares with nobody
    with pytest.raises(ValueError, match="repeat a seed"):
        SeedAxis([1, 1])
    with pytest.raises(ValueError, match="at least one seed"):
        SeedAxis([])
