"""Regression tests for the seams a TorchRL user's first DQN / SAC / PPO script crosses
(issue 40): the action form a Q module writes against the env's spec, random warm-up frames
beside a replay buffer, DQN on int64 one-hot actions, adaptive-KL PPO, ``OneHot.encode``."""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import NormalParamExtractor, TensorDictModule, TensorDictSequential
from torch import nn

from tdrl.core.collectors import Collector
from tdrl.core.envs import GymEnv
from tdrl.core.modules import (
    MLP,
    EGreedyModule,
    IndependentNormal,
    ProbabilisticActor,
    QValueActor,
    QValueModule,
    TanhNormal,
)
from tdrl.core.objectives import DQNLoss, PPOLoss
from tdrl.core.replay import LazyTensorStorage, ReplayBuffer
from tdrl.core.specs import Bounded, Categorical, Composite, OneHot

gym = pytest.importorskip("gymnasium")


# ------------------------------------------------------------------ 1. the action form


def test_qvalue_module_writes_the_form_and_dtype_of_the_spec():
    q = torch.tensor([[1.0, 5.0, 2.0], [0.0, 1.0, 9.0]])
    out = QValueModule(spec=OneHot(3, dtype=torch.int64))(TensorDict(action_value=q, batch_size=[2]))
    assert out["action"].dtype == torch.int64 and out["action"].tolist() == [[0, 1, 0], [0, 0, 1]]
    out = QValueModule(spec=OneHot(3))(TensorDict(action_value=q, batch_size=[2]))  # bool, TorchRL's
    assert out["action"].dtype == torch.bool and out["action"].tolist() == [[False, True, False],
                                                                          [False, False, True]]
    out = QValueModule(spec=Categorical(3, dtype=torch.int32))(TensorDict(action_value=q, batch_size=[2]))
    assert out["action"].dtype == torch.int32 and out["action"].tolist() == [1, 2]
    out = QValueModule(action_space="one_hot")(TensorDict(action_value=q, batch_size=[2]))
    assert out["action"].tolist() == [[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]
    out = QValueModule(spec=Composite(action=OneHot(3)))(TensorDict(action_value=q, batch_size=[2]))
    assert out["action"].shape == (2, 3)
    out = QValueModule(action_space=OneHot(3))(TensorDict(action_value=q, batch_size=[2]))  # TorchRL allows it
    assert out["action"].shape == (2, 3)


def test_qvalue_module_refuses_contradictions_naming_the_fix():
    with pytest.raises(ValueError, match="drop action_space"):
        QValueModule(action_space="categorical", spec=OneHot(3))
    with pytest.raises(ValueError, match="'one_hot' or 'categorical'"):
        QValueModule(action_space="binary")
    with pytest.raises(TypeError, match="discrete actions"):
        QValueModule(spec=Bounded(-1.0, 1.0, (2,)))
    with pytest.raises(ValueError, match="drop one_hot"):
        QValueModule(one_hot=True, spec=Categorical(3))


def test_gym_one_hot_env_refuses_an_index_naming_the_fix():
    """The old env read an int action through argmax: every action was action 0."""
    env = GymEnv("CartPole-v1")
    assert isinstance(env.action_spec, OneHot)
    td = env.reset()
    td["action"] = torch.tensor(1)
    with pytest.raises(ValueError, match=r"categorical_action_encoding=True") as err:
        env.step(td)
    assert "QValueModule(spec=env.action_spec)" in str(err.value) and "action 0" in str(err.value)
    venv = GymEnv("CartPole-v1", num_envs=2)
    td = venv.reset()
    td["action"] = torch.tensor([1, 1])
    with pytest.raises(ValueError, match="OneHot"):
        venv.step(td)
    env.close()
    venv.close()


@pytest.mark.skipif(importlib.util.find_spec("envpool") is None, reason="needs envpool")
def test_envpool_one_hot_env_refuses_an_index_too():
    from tdrl.core.envs import EnvPoolEnv

    env = EnvPoolEnv("CartPole-v1", 2, num_threads=1, seed=0)
    td = env.reset()
    td["action"] = torch.tensor([1, 1])
    with pytest.raises(ValueError, match="categorical_action_encoding=True"):
        env.step(td)
    td["action"] = OneHot(2, (2, 2), dtype=torch.int64).encode([1, 0])  # the fix: one-hots
    assert env.step(td)["next", "observation"].shape == (2, 4)
    env.close()


def test_a_qvalue_actor_given_the_spec_steps_the_action_it_chose():
    """The one-hot written by QValueActor(spec=...) moves CartPole as Gymnasium's same action does."""
    env = GymEnv("CartPole-v1")
    env.set_seed(3)
    net = nn.Linear(4, 2)
    with torch.no_grad():  # action_value = (0, 1): always action 1 (push right)
        net.weight.zero_()
        net.bias.copy_(torch.tensor([0.0, 1.0]))
    actor = QValueActor(net, spec=env.action_spec)
    rollout = env.rollout(3, actor)
    assert rollout["action"].tolist() == [[0, 1]] * 3
    ref = gym.make("CartPole-v1")
    obs, _ = ref.reset(seed=3)
    for t in range(3):
        obs, *_ = ref.step(1)
        np.testing.assert_allclose(rollout["next", "observation"][t].numpy(), obs, rtol=1e-6)
    env.close()


def test_egreedy_given_a_one_hot_spec_explores_in_one_hot():
    spec = OneHot(3, dtype=torch.int64)
    explore = EGreedyModule(spec, eps_init=1.0, eps_end=1.0)
    assert explore.one_hot
    td = TensorDict(action=torch.tensor([[1, 0, 0]] * 64), batch_size=[64])
    out = explore(td)["action"]
    assert out.shape == (64, 3) and out.dtype == torch.int64 and out.sum(-1).tolist() == [1] * 64
    assert EGreedyModule(Categorical(3)).one_hot is False


# ------------------------------------------------------------------ 2. random warm-up frames


def _dqn_policy(env):
    qnet = QValueActor(MLP(4, 2, num_cells=(8,)), spec=env.action_spec)
    return qnet, TensorDictSequential(qnet, EGreedyModule(env.action_spec, annealing_num_steps=100))


def test_random_frames_carry_the_policy_keys_so_a_replay_buffer_takes_every_batch():
    """TorchRL's DQN tutorial: random frames, then policy frames, into one buffer."""
    torch.manual_seed(0)
    env = GymEnv("CartPole-v1")
    qnet, policy = _dqn_policy(env)
    collector = Collector(env, policy, frames_per_batch=8, total_frames=32, init_random_frames=16, seed=0)
    buffer = ReplayBuffer(storage=LazyTensorStorage(64), batch_size=16)
    batches = []
    for batch in collector:
        buffer.extend(batch.reshape(-1))  # the old collector: StorageKeyError on the third batch
        batches.append(batch)
    assert len(buffer) == 32
    keys = [sorted(map(str, b.keys(True, True))) for b in batches]
    assert all(k == keys[0] for k in keys) and "action_value" in keys[0]
    assert {b["action"].dtype for b in batches} == {torch.int64}
    for b in batches[:2]:  # random: zeros where the policy would have written
        assert not b["action_value"].any() and not b["chosen_action_value"].any()
        assert (b["action"].sum(-1) == 1).all()
    assert batches[2]["action_value"].abs().sum() > 0
    loss = DQNLoss(qnet)(buffer.sample())  # int64 one-hot actions from the env's spec
    assert torch.isfinite(loss["loss_qvalue"])
    collector.shutdown()


def test_random_frames_carry_a_sac_actor_keys_and_its_action_dtype():
    env = GymEnv("Pendulum-v1")
    net = TensorDictModule(nn.Sequential(MLP(3, 2, num_cells=(8,)), NormalParamExtractor()),
                           in_keys=["observation"], out_keys=["loc", "scale"])
    actor = ProbabilisticActor(net, TanhNormal, distribution_kwargs={"low": -2.0, "high": 2.0})
    actor = actor.double()  # writes float64 actions; the spec's are float32
    env_obs64 = TensorDictModule(lambda x: x.double(), ["observation"], ["observation"])
    policy = TensorDictSequential(env_obs64, actor)
    collector = Collector(env, policy, frames_per_batch=4, total_frames=8, init_random_frames=4, seed=0)
    buffer = ReplayBuffer(storage=LazyTensorStorage(16))
    random_batch, policy_batch = list(collector)
    for b in (random_batch, policy_batch):
        buffer.extend(b.reshape(-1))
        assert b["action"].dtype == torch.float64
    for key in ("loc", "scale", "action_log_prob"):
        assert key in random_batch.keys() and not random_batch[key].any()
        assert policy_batch[key].abs().sum() > 0
    assert (random_batch["action"].abs() <= 2.0).all()
    collector.shutdown()


def test_random_frames_draw_the_same_actions_as_a_collector_without_policy():
    """Learning the policy's keys runs it once under a forked RNG: the random stream is unchanged."""
    def actions(policy):
        torch.manual_seed(7)
        env = GymEnv("CartPole-v1")
        c = Collector(env, policy, frames_per_batch=10, total_frames=10, init_random_frames=10, seed=1)
        out = next(iter(c))["action"]
        c.shutdown()
        return out

    torch.manual_seed(0)
    _, policy = _dqn_policy(GymEnv("CartPole-v1"))
    assert torch.equal(actions(policy), actions(None))


# ------------------------------------------------------------------ 3. DQN on int64 one-hot actions


def test_dqn_loss_reads_int64_and_bool_one_hot_actions_as_their_index():
    q = torch.tensor([[1.0, 2.0], [3.0, 5.0], [7.0, 11.0]])

    class Fixed(nn.Module):
        def forward(self, obs):
            return q + 0 * obs.sum(-1, keepdim=True)

    net = TensorDictModule(Fixed(), ["observation"], ["action_value"])
    index = torch.tensor([1, 0, 1])
    td = lambda action: TensorDict(  # noqa: E731
        observation=torch.zeros(3, 1), action=action,
        next=TensorDict(observation=torch.zeros(3, 1), reward=torch.zeros(3, 1),
                        terminated=torch.ones(3, 1, dtype=torch.bool),
                        done=torch.ones(3, 1, dtype=torch.bool), batch_size=[3]),
        batch_size=[3])
    # terminated everywhere: target = reward = 0, Q(s, a) = 2, 3, 11; l2 loss = mean(q^2) / 2
    expected = (4.0 + 9.0 + 121.0) / 3 / 2
    for action in (index, nn.functional.one_hot(index, 2), nn.functional.one_hot(index, 2).bool(),
                   nn.functional.one_hot(index, 2).float()):
        out = DQNLoss(net, loss_function="l2")(td(action))
        assert out["q_mean"].item() == pytest.approx((2.0 + 3.0 + 11.0) / 3)
        assert out["loss_qvalue"].item() == pytest.approx(expected)


def test_dqn_loss_error_names_both_forms_without_contradiction():
    from tdrl.core.objectives.dqn import gather_action_value

    q = torch.zeros(128, 2)
    with pytest.raises(ValueError) as err:
        gather_action_value(q, torch.zeros(128, 3, dtype=torch.int64))
    msg = str(err.value)
    assert "shape (128, 3)" in msg and "(128,)" in msg and "(128, 2) (bool, integer or float)" in msg
    with pytest.raises(ValueError, match="dtype torch.float32"):
        gather_action_value(q, torch.zeros(128))  # a float index
    # n == 1: an integer [B, 1] is an index (0), not a one-hot of 0s
    assert gather_action_value(torch.full((4, 1), 3.0), torch.zeros(4, 1, dtype=torch.long)).tolist() == [[3.0]] * 4


# ------------------------------------------------------------------ 4. adaptive KL PPO


class _FixedLogProb(nn.Module):
    """A Normal policy with loc = theta (one parameter), scale 1."""

    def __init__(self):
        super().__init__()
        self.theta = nn.Parameter(torch.zeros(1))

    def forward(self, obs):
        return self.theta.expand(obs.shape[0], 1), torch.ones(obs.shape[0], 1)


def test_ppo_adaptive_kl_backward_works_and_the_coefficient_adapts():
    """log pi(a) - log pi_old(a) = d for every sample: ratio r = exp(d), k3 KL = r - 1 - d."""
    actor = ProbabilisticActor(TensorDictModule(_FixedLogProb(), ["observation"], ["loc", "scale"]),
                               IndependentNormal)
    action = torch.zeros(4, 1)  # at theta = 0: log pi(a) = -0.5 log(2 pi)
    log_pi = -0.5 * math.log(2 * math.pi)
    d = 0.1
    td = TensorDict(observation=torch.zeros(4, 1), action=action,
                    action_log_prob=torch.full((4,), log_pi - d), advantage=torch.zeros(4, 1),
                    value_target=torch.zeros(4, 1), batch_size=[4])
    k3 = math.exp(d) - 1 - d  # 0.0051709
    loss_fn = PPOLoss(actor, clip_epsilon=None, kl_coef=0.5, kl_target=0.001, entropy_coef=0.0)
    out = loss_fn(td)
    assert out["loss_kl"].item() == pytest.approx(0.5 * k3, rel=1e-5)
    assert out["kl_coef"].item() == 0.5
    (out["loss_objective"] + out["loss_kl"]).backward()  # the old code: in-place modification error
    assert actor.module[0].module.theta.grad is not None
    assert loss_fn.kl_coef.item() == 1.0  # k3 > 1.5 x 0.001: doubled
    loss_fn.kl_target = 0.01  # k3 < 0.01 / 1.5: halved
    out = loss_fn(td)
    out["loss_kl"].backward()
    assert out["loss_kl"].item() == pytest.approx(1.0 * k3, rel=1e-5) and loss_fn.kl_coef.item() == 0.5
    loss_fn.kl_target = k3  # within [target / 1.5, 1.5 target]: unchanged
    loss_fn(td)["loss_kl"].backward()
    assert loss_fn.kl_coef.item() == 0.5
    loss_fn.eval()  # no adaptation outside training
    loss_fn.kl_target = 1.0
    loss_fn(td)
    assert loss_fn.kl_coef.item() == 0.5


# ------------------------------------------------------------------ 5. OneHot.encode


def test_one_hot_encode_makes_a_one_hot_from_an_index():
    assert OneHot(4).encode(2).tolist() == [False, False, True, False]
    assert OneHot(4, dtype=torch.int64).encode(np.int64(0)).tolist() == [1, 0, 0, 0]
    assert OneHot(2, (3, 2)).encode(np.array([0, 1, 1])).tolist() == [[True, False], [False, True],
                                                                      [False, True]]
    assert OneHot(3).encode([0, 1, 0]).tolist() == [False, True, False]  # already one-hot: cast
    with pytest.raises(ValueError, match=r"in \[0, 4\)"):
        OneHot(4).encode(4)
    with pytest.raises(ValueError, match="integer indices"):
        OneHot(4).encode(1.5)
