"""Helpers a ported TorchRL script calls (issue 40): ``Transform.clone()``, ``rb[:]``,
``env.eval()`` / ``.train()`` on normalising transforms, ``RandomPolicy``, ``EnvCreator``."""

from __future__ import annotations

import pickle

import pytest
import torch
from tensordict import TensorDict

from tdrl.core import Compose, EnvCreator, GymEnv, RewardSum, SerialEnv, TransformedEnv, VecNorm
from tdrl.core.collectors import Collector
from tdrl.core.modules import RandomPolicy
from tdrl.core.replay import LazyTensorStorage, ListStorage, ReplayBuffer
from tdrl.core.specs import Bounded, Composite, OneHot

pytest.importorskip("gymnasium")


def _vecnorm_env(seed: int = 0) -> TransformedEnv:
    env = TransformedEnv(GymEnv("Pendulum-v1"), Compose(VecNorm(), RewardSum()))
    env.set_seed(seed)
    return env


# ------------------------------------------------------------------ Transform.clone


def test_transform_clone_copies_the_statistics_and_attaches_to_no_env():
    env = _vecnorm_env()
    env.rollout(20)
    norm = env.transform[0]
    copy = norm.clone()
    assert copy.container is None and norm.container is env.transform
    assert float(copy.count_0) == float(norm.count_0) == 21.0  # the reset and 20 steps
    torch.testing.assert_close(copy.mean_0, norm.mean_0)
    other = TransformedEnv(GymEnv("Pendulum-v1"), copy)
    other.rollout(5)
    assert float(copy.count_0) == 27.0 and float(norm.count_0) == 21.0  # not shared
    composed = env.transform.clone()
    assert composed.container is None
    assert all(t.container is composed for t in composed.transforms)  # rewired to the copy
    assert composed[0] is not norm and float(composed[0].count_0) == 21.0


# ------------------------------------------------------------------ rb[...]


def test_replay_buffer_indexing_returns_stored_items_in_storage_order():
    rb = ReplayBuffer(storage=LazyTensorStorage(4))
    rb.extend(TensorDict(x=torch.arange(3.0), batch_size=[3]))
    assert rb[:]["x"].tolist() == [0.0, 1.0, 2.0]  # the stored 3, not the 4 slots
    assert rb[-1]["x"].item() == 2.0 and rb[[0, 2]]["x"].tolist() == [0.0, 2.0]
    rb.extend(TensorDict(x=torch.arange(3.0, 6.0), batch_size=[3]))  # wraps: slots 0, 1 rewritten
    assert rb[:]["x"].tolist() == [4.0, 5.0, 2.0, 3.0]
    assert rb[1:3]["x"].tolist() == [5.0, 2.0]
    with pytest.raises(IndexError, match="4 items stored"):
        rb[4]
    with pytest.raises(IndexError, match="out of range"):
        rb[torch.tensor([0, 7])]
    scaled = ReplayBuffer(storage=LazyTensorStorage(4), transform=lambda td: td.set("x", td["x"] * 10))
    scaled.extend(TensorDict(x=torch.tensor([1.0, 2.0]), batch_size=[2]))
    assert scaled[:]["x"].tolist() == [10.0, 20.0]
    listed = ReplayBuffer(storage=ListStorage(4))
    listed.extend([torch.tensor(1), torch.tensor(2)])
    assert listed[:].tolist() == [1, 2] and listed[0].item() == 1


# ------------------------------------------------------------------ env.eval() / .train()


@pytest.mark.parametrize("dict_loop", [True, False])
def test_env_eval_stops_the_running_statistics_and_train_resumes_them(dict_loop, monkeypatch):
    monkeypatch.setattr(Collector, "_dict_loop", dict_loop)
    env = _vecnorm_env()
    norm = env.transform[0]
    collector = Collector(env, RandomPolicy(env.action_spec), frames_per_batch=10, total_frames=-1, seed=0)
    collector.rollout()
    assert float(norm.count_0) == 11.0 and env.training
    mean, var = norm.mean_0.clone(), norm.var_0.clone()
    assert env.eval() is env and not env.training and not norm.training
    batch = collector.rollout()
    assert float(norm.count_0) == 11.0 and torch.equal(norm.mean_0, mean)
    # still normalised, with the frozen statistics: hand-computed from the raw observation
    raw = env.base_env.reset()["observation"].double()
    expected = ((raw - mean) / (var + norm.eps).sqrt()).float()
    torch.testing.assert_close(norm._normalize(0, raw.float()), expected)
    assert batch["next", "observation"].abs().max() < 50
    env.train()
    collector.rollout()
    assert float(norm.count_0) == 21.0


# ------------------------------------------------------------------ RandomPolicy


def test_random_policy_draws_from_the_spec():
    torch.manual_seed(0)
    policy = RandomPolicy(Bounded(-2.0, 2.0, (64, 1)))
    td = policy(TensorDict(batch_size=[64]))
    assert td["action"].shape == (64, 1) and (td["action"].abs() <= 2.0).all() and td["action"].std() > 0.5
    composite = RandomPolicy(Composite(move=OneHot(3), shape=()))
    out = composite(TensorDict())
    assert out["move"].shape == (3,) and out["move"].sum().item() == 1
    env = GymEnv("CartPole-v1")
    actions = env.rollout(50, RandomPolicy(env.action_spec), break_when_any_done=False)["action"]
    assert actions.shape == (50, 2) and set(actions.argmax(-1).tolist()) == {0, 1}


# ------------------------------------------------------------------ EnvCreator


def _cartpole(env_id: str = "CartPole-v1", **kwargs) -> GymEnv:
    return GymEnv(env_id, **kwargs)


def test_env_creator_pickles_and_builds_with_its_kwargs():
    creator = EnvCreator(_cartpole, {"categorical_action_encoding": True})
    env = pickle.loads(pickle.dumps(creator))()
    assert env.action_spec.shape == () and env.action_spec.n == 2  # Categorical: the kwargs reached it
    assert isinstance(EnvCreator(_cartpole)(), GymEnv)
    serial = SerialEnv(2, creator)
    assert serial.rollout(3).batch_size == (2, 3)
    with pytest.raises(TypeError, match="not an EnvBase"):
        EnvCreator(dict)()
    with pytest.raises(TypeError, match="callable"):
        EnvCreator("CartPole-v1")
