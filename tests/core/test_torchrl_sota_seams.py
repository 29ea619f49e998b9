"""Regression tests for the seams TorchRL's SOTA DQN and SAC scripts crossed when ported
(apps/examples/torchrl_dqn, torchrl_sac): each failed in the port before its fix."""

from __future__ import annotations

import logging

import pytest
import torch
from tensordict import TensorDict

from tdrl.core.collectors import Collector
from tdrl.core.envs import GymEnv
from tdrl.core.modules import MLP, EGreedyModule, QValueActor
from tdrl.core.objectives import DQNLoss
from tdrl.core.replay import LazyTensorStorage, TensorDictReplayBuffer
from tdrl.core.specs import Composite, OneHot
from tdrl.core.train import get_available_device, get_logger, timeit


def test_env_specs_groups_input_and_output_specs():
    env = GymEnv("CartPole-v1")
    action = env.specs["input_spec", "full_action_spec", "action"]
    assert isinstance(action, OneHot) and action.space.n == 2
    assert env.specs["output_spec", "full_observation_spec", "observation"].shape == (4,)
    assert set(env.output_spec.keys()) == {"full_observation_spec", "full_reward_spec", "full_done_spec"}
    assert set(env.input_spec.keys()) == {"full_state_spec", "full_action_spec"}


def test_qvalue_actor_spec_feeds_egreedy_module_one_hot():
    env = GymEnv("CartPole-v1")
    actor = QValueActor(module=MLP(in_features=4, out_features=2, num_cells=[8]),
                        spec=Composite(action=env.action_spec), in_keys=["observation"])
    assert isinstance(actor.spec, Composite) and isinstance(actor.spec["action"], OneHot)
    greedy = EGreedyModule(spec=actor.spec, eps_init=1.0, eps_end=1.0, annealing_num_steps=10, device="cpu")
    assert greedy.one_hot and greedy.n_actions == 2
    td = greedy(actor(env.reset()))
    assert td["action"].shape == (2,) and int(td["action"].sum()) == 1


def test_dqn_make_value_estimator_sets_gamma_and_refuses_others():
    loss = DQNLoss(value_network=QValueActor(MLP(in_features=4, out_features=2, num_cells=[8])))
    assert loss.make_value_estimator(gamma=0.5, device="cpu") is loss and loss.gamma == 0.5
    with pytest.raises(ValueError, match="one-step"):
        loss.make_value_estimator("TDLambda", gamma=0.9)
    with pytest.raises(ValueError, match="lmbda"):
        loss.make_value_estimator(gamma=0.9, lmbda=0.95)


def test_replay_buffer_takes_pin_memory_and_collector_compile_false():
    rb = TensorDictReplayBuffer(pin_memory=False, storage=LazyTensorStorage(max_size=8, device="cpu"), batch_size=2)
    rb.extend(TensorDict(x=torch.arange(4.0), batch_size=[4]))
    assert rb.sample()["x"].shape == (2,)
    env = GymEnv("CartPole-v1")
    collector = Collector(create_env_fn=env, policy=None, frames_per_batch=4, total_frames=4,
                          compile_policy=False, cudagraph_policy=False)
    assert next(iter(collector)).numel() == 4
    with pytest.raises(ValueError, match="torch.compile"):
        Collector(env, None, frames_per_batch=4, total_frames=4, compile_policy={"mode": "default"})


def test_get_logger_takes_wandb_kwargs_for_csv(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    logger = get_logger("csv", logger_name="dqn", experiment_name="x", wandb_kwargs={"project": "p"})
    logger.log_metrics({"a": 1.0}, step=1)
    assert list(tmp_path.rglob("*.csv"))


def test_timeit_table_and_device(caplog):
    timeit.erase()
    for _ in range(3):
        with timeit("block"):
            sum(range(1000))
    row = timeit.table["block"]
    assert row[2] == 3 and row[1] > 0 and row[0] == pytest.approx(row[1] / 3)
    assert set(timeit.todict(prefix="time")) == {"time/block"}
    with caplog.at_level(logging.INFO, logger="tdrl.timeit"):
        timeit.calls_seen = 0
        for _ in range(4):
            timeit.printevery(2, 4, erase=True)
    assert "block" in caplog.text and timeit.table == {}
    assert get_available_device().type == ("cuda" if torch.cuda.is_available() else get_available_device().type)


# ---------------------------------------------------------------- the SAC script's seams


def sac_loss(**kw):
    from tensordict.nn import NormalParamExtractor, TensorDictModule

    from tdrl.core.modules import ProbabilisticActor, TanhNormal, ValueOperator
    from tdrl.core.objectives import SACLoss

    net = torch.nn.Sequential(MLP(in_features=3, out_features=2, num_cells=[8]), NormalParamExtractor())
    actor = ProbabilisticActor(TensorDictModule(net, in_keys=["observation"], out_keys=["loc", "scale"]),
                               in_keys=["loc", "scale"], distribution_class=TanhNormal,
                               distribution_kwargs={"low": -2.0, "high": 2.0})
    qvalue = ValueOperator(MLP(in_features=4, out_features=1, num_cells=[8]), in_keys=["action", "observation"])
    return SACLoss(actor_network=actor, qvalue_network=qvalue, num_qvalue_nets=2, **kw)


def test_sac_loss_parameter_views_and_delay_actor_false():
    loss = sac_loss(delay_actor=False, delay_qvalue=True)
    actor_params = list(loss.actor_network_params.flatten_keys().values())
    critic_params = list(loss.qvalue_network_params.flatten_keys().values())
    assert {id(p) for p in actor_params} == {id(p) for p in loss.actor.parameters()}
    assert {id(p) for p in critic_params} == {id(p) for p in loss.qvalue.parameters()}
    assert loss.log_alpha is loss.temperature.log_alpha
    with pytest.raises(ValueError, match="delay_actor=True"):
        sac_loss(delay_actor=True)  # tdrl's SAC has no target actor: TorchRL's True is not what it does


def test_group_optimizers_steps_every_group_with_its_settings():
    from tdrl.core.objectives import group_optimizers

    a, b = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2))
    opt = group_optimizers(torch.optim.SGD([a], lr=0.1), torch.optim.SGD([b], lr=1.0))
    (a.sum() + b.sum()).backward()
    opt.step()
    assert torch.allclose(a, torch.full((2,), 0.9)) and torch.allclose(b, torch.zeros(2))
    with pytest.raises(ValueError, match="one class"):
        group_optimizers(torch.optim.SGD([a], lr=0.1), torch.optim.Adam([b]))


def test_set_gym_backend_and_parallel_env_serial_for_single():
    from tdrl.core.envs import EnvCreator, ParallelEnv, SerialEnv, set_gym_backend

    with set_gym_backend("gymnasium"):
        env = GymEnv("Pendulum-v1")
    assert env.observation_spec["observation"].shape == (3,)
    with pytest.raises(ValueError, match="Gymnasium only"):
        set_gym_backend("gym")
    single = ParallelEnv(1, EnvCreator(lambda: GymEnv("Pendulum-v1")), serial_for_single=True)
    assert isinstance(single, SerialEnv) and single.batch_size == (1,)
    assert single.rollout(3).shape == (1, 3)


def test_replay_buffer_takes_prefetch_and_refuses_shared():
    rb = TensorDictReplayBuffer(pin_memory=False, prefetch=3, shared=False,
                                storage=LazyTensorStorage(8), batch_size=2)
    rb.extend(TensorDict(x=torch.arange(4.0), batch_size=[4]))
    assert rb.sample().batch_size == (2,)
    with pytest.raises(ValueError, match="shared"):
        TensorDictReplayBuffer(shared=True, storage=LazyTensorStorage(8))
