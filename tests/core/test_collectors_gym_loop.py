"""The Collector's dict loop for one plain GymEnv + a plain TensorDictModule gives the very
batches of the generic loop (keys, key order, values, trajectory ids, the carried root)."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule

from tdrl.core.collectors import Collector
from tdrl.core.envs import GymEnv


def _policy(seed: int = 0, out_key: str = "action") -> TensorDictModule:
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(3, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    return TensorDictModule(net, ["observation"], [out_key])


def _collect(dict_loop: bool, n_batches: int = 3, num_envs=None, **kwargs) -> tuple:
    col = Collector(GymEnv("Pendulum-v1", num_envs=num_envs),
                    kwargs.pop("policy", None) or _policy(), seed=3, **kwargs)
    col._dict_loop = dict_loop
    it = iter(col)
    return [next(it) for _ in range(n_batches)], col


def _assert_same(a: TensorDict, b: TensorDict) -> None:
    assert list(a.keys(True, True)) == list(b.keys(True, True))
    assert a.batch_size == b.batch_size
    for key in a.keys(True, True):
        x, y = a.get(key), b.get(key)
        assert x.dtype == y.dtype and x.shape == y.shape, key
        assert torch.equal(x, y), key


@pytest.mark.parametrize("kwargs", [
    {"frames_per_batch": 150},  # one truncation (step 200) inside the second batch
    {"frames_per_batch": 200},  # the truncation falls on the last step of a batch
    {"frames_per_batch": 70, "reset_at_each_iter": True},
    {"frames_per_batch": 300, "num_envs": 3},  # vector env: SAME_STEP final observations
])
def test_dict_loop_batches_equal_the_generic_loop(kwargs):
    fast, fast_col = _collect(True, **kwargs)
    slow, slow_col = _collect(False, **kwargs)
    assert fast_col._dict_plan(fast_col._td) is not None  # the dict loop did run
    for a, b in zip(fast, slow):
        _assert_same(a, b)
    _assert_same(fast_col._td, slow_col._td)  # the carried root, too
    assert fast_col._next_traj_id == slow_col._next_traj_id


def test_dict_loop_trajectory_ids_follow_episodes():
    batches, _ = _collect(True, n_batches=2, frames_per_batch=150)
    ids = torch.cat([b["collector", "traj_ids"] for b in batches])
    assert ids[:200].unique().tolist() == [0] and ids[200:].unique().tolist() == [1]
    trunc = torch.cat([b["next", "truncated"] for b in batches])[:, 0]
    assert trunc.nonzero().flatten().tolist() == [199]


def test_dict_loop_batches_are_independent_of_later_steps():
    batches, col = _collect(True, n_batches=1, frames_per_batch=64)
    snapshot = batches[0].clone()
    next(iter(col))
    _assert_same(batches[0], snapshot)


def test_setups_outside_the_dict_loop_use_the_generic_one():
    col = Collector(GymEnv("Pendulum-v1"), _policy(), frames_per_batch=8)
    col._td = col._start()
    assert col._dict_plan(col._td) is not None
    checked = Collector(GymEnv("Pendulum-v1", check_actions=True), _policy(), frames_per_batch=8)
    assert checked._dict_plan(checked._start()) is None
    infos = Collector(GymEnv("Pendulum-v1", info_keys=("x",)), _policy(), frames_per_batch=8)
    assert infos._dict_plan(infos._start()) is None
    seq = Collector(GymEnv("Pendulum-v1"), lambda td: td.set("action", td["observation"][..., :1]),
                    frames_per_batch=8)
    assert seq._dict_plan(seq._start()) is None
    other_key = Collector(GymEnv("Pendulum-v1"), _policy(out_key="loc"), frames_per_batch=8)
    assert other_key._dict_plan(other_key._start()) is None
    with_next = col._td.clone()
    with_next.set(("next", "h"), torch.zeros(1))
    assert col._dict_plan(with_next) is None


@pytest.mark.parametrize("kwargs", [{"init_random_frames": 20}, {"max_frames_per_traj": 30}])
def test_options_the_dict_loop_skips_still_match(kwargs):
    torch.manual_seed(0)
    fast, _ = _collect(True, n_batches=2, frames_per_batch=40, **kwargs)
    torch.manual_seed(0)
    slow, _ = _collect(False, n_batches=2, frames_per_batch=40, **kwargs)
    for a, b in zip(fast, slow):
        _assert_same(a, b)


def test_a_policy_output_of_another_dtype_matches_the_generic_loop():
    class Double(torch.nn.Module):
        def forward(self, obs):
            return obs[..., :1].double().clamp(-2, 2)

    policy = TensorDictModule(Double(), ["observation"], ["action"])
    fast, _ = _collect(True, n_batches=1, frames_per_batch=10, policy=policy)
    slow, _ = _collect(False, n_batches=1, frames_per_batch=10, policy=policy)
    _assert_same(fast[0], slow[0])
