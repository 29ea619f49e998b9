"""The loops a TorchRL user writes first, on every env backend (issue 40): random warm-up
frames from the collector, a replay buffer, an exploration module, a loss and a gradient
step, for DQN (one-hot and index actions), SAC, TD3 and PPO on GymEnv, EnvPool and DM Control.

Each loop checks the seams rather than learning: every batch goes into one buffer (random
and policy batches alike), the actions the modules write are in the env's action spec
(``check_actions=True`` on the env refuses any other), the batches keep one set of keys and
one action dtype, and a gradient step changes the parameters.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from tensordict.nn import NormalParamExtractor, TensorDictModule, TensorDictSequential
from torch import nn

from tdrl.core.collectors import Collector
from tdrl.core.modules import (
    MLP,
    Actor,
    AdditiveGaussianModule,
    EGreedyModule,
    OneHotCategorical,
    ProbabilisticActor,
    QValueActor,
    TanhNormal,
    ValueOperator,
)
from tdrl.core.objectives import DQNLoss, PPOLoss, SACLoss, TD3Loss, total_loss
from tdrl.core.replay import LazyTensorStorage, ReplayBuffer
from tdrl.core.values import GAE

pytest.importorskip("gymnasium")


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _gym(env_id, **kw):
    from tdrl.core.envs import GymEnv

    return GymEnv(env_id, num_envs=2, check_actions=True, **kw)


def _envpool(env_id, **kw):
    from tdrl.core.envs import EnvPoolEnv

    env = EnvPoolEnv(env_id, 2, num_threads=1, seed=0, **kw)
    env.check_actions = True
    return env


def _dmc(domain, task):
    from tdrl.core.envs import DMControlEnv

    env = DMControlEnv(domain, task, num_envs=2)
    env.check_actions = True
    return env


DISCRETE = [
    pytest.param(lambda: _gym("CartPole-v1"), id="gym-onehot"),
    pytest.param(lambda: _gym("CartPole-v1", categorical_action_encoding=True), id="gym-categorical"),
    pytest.param(lambda: _envpool("CartPole-v1"), id="envpool-onehot",
                 marks=pytest.mark.skipif(not _has("envpool"), reason="needs envpool")),
    pytest.param(lambda: _envpool("CartPole-v1", categorical_action_encoding=True), id="envpool-categorical",
                 marks=pytest.mark.skipif(not _has("envpool"), reason="needs envpool")),
]
CONTINUOUS = [
    pytest.param(lambda: _gym("Pendulum-v1"), id="gym"),
    pytest.param(lambda: _envpool("Pendulum-v1"), id="envpool",
                 marks=pytest.mark.skipif(not _has("envpool"), reason="needs envpool")),
    pytest.param(lambda: _dmc("cartpole", "swingup"), id="dmc",
                 marks=pytest.mark.skipif(not _has("dm_control"), reason="needs dm_control")),
]


def _dims(env) -> tuple[int, int]:
    return env.observation_spec["observation"].shape[-1], env.action_spec.shape[-1]


def _off_policy_loop(env, policy, loss_fn, params, explore=None, frames=48, random=16) -> list:
    """Random frames, then policy frames, into one buffer; a gradient step per batch."""
    torch.manual_seed(0)
    collector = Collector(env, policy, frames_per_batch=8, total_frames=frames, init_random_frames=random, seed=0)
    buffer = ReplayBuffer(storage=LazyTensorStorage(frames), batch_size=16)
    optim = torch.optim.Adam(params, lr=1e-2)
    before = [p.detach().clone() for p in params]
    batches = []
    for batch in collector:
        assert env.action_spec.is_in(batch["action"].transpose(0, 1)), "the action is not in the spec"
        buffer.extend(batch)
        batches.append(batch)
        if explore is not None:
            explore.step(batch.numel())
        loss = total_loss(loss_fn(buffer.sample()))
        optim.zero_grad()
        loss.backward()
        optim.step()
        assert torch.isfinite(loss)
    collector.shutdown()
    assert len(buffer) == frames
    keys = {tuple(sorted(map(str, b.keys(True, True)))) for b in batches}
    assert len(keys) == 1, f"the batches' keys differ: {keys}"
    assert len({b["action"].dtype for b in batches}) == 1
    assert any(not torch.equal(a, b) for a, b in zip(before, params))
    return batches


@pytest.mark.parametrize("make_env", DISCRETE)
def test_dqn_with_random_frames_replay_and_egreedy(make_env):
    env = make_env()
    obs, _ = _dims(env)
    qnet = QValueActor(MLP(obs, env.action_spec.n, num_cells=(16,)), spec=env.action_spec)
    explore = EGreedyModule(env.action_spec, eps_init=0.5, eps_end=0.05, annealing_num_steps=48)
    batches = _off_policy_loop(env, TensorDictSequential(qnet, explore), DQNLoss(qnet, double_dqn=True),
                               list(qnet.parameters()), explore)
    assert not batches[0]["action_value"].any() and batches[-1]["action_value"].abs().sum() > 0
    env.close()


@pytest.mark.parametrize("make_env", CONTINUOUS)
def test_sac_with_random_frames_and_replay(make_env):
    env = make_env()
    obs, act = _dims(env)
    spec = env.action_spec
    net = TensorDictModule(nn.Sequential(MLP(obs, 2 * act, num_cells=(16,)), NormalParamExtractor()),
                           in_keys=["observation"], out_keys=["loc", "scale"])
    actor = ProbabilisticActor(net, TanhNormal, distribution_kwargs={"low": spec.low[0], "high": spec.high[0]})
    qvalue = ValueOperator(MLP(obs + act, 1, num_cells=(16,)), in_keys=["observation", "action"],
                           out_keys=["state_action_value"])
    loss_fn = SACLoss(actor, qvalue)
    batches = _off_policy_loop(env, actor, loss_fn, list(loss_fn.parameters()))
    assert not batches[0]["loc"].any() and batches[-1]["scale"].min() > 0
    env.close()


@pytest.mark.parametrize("make_env", CONTINUOUS)
def test_td3_with_random_frames_replay_and_gaussian_noise(make_env):
    env = make_env()
    obs, act = _dims(env)
    spec = env.action_spec
    low, high = spec.low[0], spec.high[0]
    actor = Actor(nn.Sequential(MLP(obs, act, num_cells=(16,)), nn.Tanh()))
    explore = AdditiveGaussianModule(0.3, 0.1, 48, low=low, high=high)
    qvalue = ValueOperator(MLP(obs + act, 1, num_cells=(16,)), in_keys=["observation", "action"],
                           out_keys=["state_action_value"])
    loss_fn = TD3Loss(actor, qvalue, action_low=low, action_high=high)
    _off_policy_loop(env, TensorDictSequential(actor, explore), loss_fn, list(loss_fn.parameters()), explore)
    env.close()


@pytest.mark.parametrize("make_env", [DISCRETE[0], DISCRETE[2], CONTINUOUS[0], CONTINUOUS[2]])
def test_ppo_collect_gae_and_minibatches(make_env):
    env = make_env()
    obs, _ = _dims(env)
    discrete = hasattr(env.action_spec, "n")
    # OneHotCategorical samples float one-hots, which check_actions refuses against the int64
    # OneHot spec of GymEnv / EnvPool (TorchRL does not check them at all): not checked here
    env.check_actions = not discrete
    if discrete:
        net = TensorDictModule(MLP(obs, env.action_spec.n, num_cells=(16,)), ["observation"], ["logits"])
        actor = ProbabilisticActor(net, OneHotCategorical, in_keys=["logits"])
    else:
        spec, act = env.action_spec, env.action_spec.shape[-1]
        net = TensorDictModule(nn.Sequential(MLP(obs, 2 * act, num_cells=(16,)), NormalParamExtractor()),
                               ["observation"], ["loc", "scale"])
        actor = ProbabilisticActor(net, TanhNormal, distribution_kwargs={"low": spec.low[0], "high": spec.high[0]})
    critic = ValueOperator(MLP(obs, 1, num_cells=(16,)))
    loss_fn = PPOLoss(actor, critic, kl_coef=0.1, kl_target=0.01)  # adaptive KL beside the clip
    optim = torch.optim.Adam(loss_fn.parameters(), lr=1e-2)
    before = [p.detach().clone() for p in loss_fn.parameters()]
    collector = Collector(env, actor, frames_per_batch=32, total_frames=64, seed=0)
    buffer = ReplayBuffer(storage=LazyTensorStorage(32), batch_size=8)
    advantage = GAE(gamma=0.99, lmbda=0.95, value_network=critic)
    for batch in collector:
        if discrete:  # a float one-hot: the spec's shape, not its int64 dtype (argmax reads it right)
            assert (batch["action"].sum(-1) == 1).all() and batch["action"].shape[-1] == env.action_spec.n
        else:
            assert env.action_spec.is_in(batch["action"].transpose(0, 1))
        advantage(batch)
        buffer.empty()
        buffer.extend(batch)
        for _ in range(4):
            loss = total_loss(loss_fn(buffer.sample()))
            optim.zero_grad()
            loss.backward()
            optim.step()
    collector.shutdown()
    assert any(not torch.equal(a, b) for a, b in zip(before, loss_fn.parameters()))
    env.close()
