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
