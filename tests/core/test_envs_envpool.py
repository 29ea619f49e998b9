"""EnvPool wrapper: the Gymnasium wrapper's rollout tests on EnvPool's CartPole and MuJoCo
tasks: specs, terminated vs truncated, auto-reset that loses and fakes nothing (replayed
against raw EnvPool and against Gymnasium's own CartPole dynamics), seeds, the collector's
dict loop, and clear errors."""

from __future__ import annotations

import sys
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict.nn import TensorDictModule

envpool = pytest.importorskip("envpool", reason='needs envpool: pip install "packages/core[envpool]"')

from tdrl.core.collectors import Collector  # noqa: E402
from tdrl.core.envs import EnvBase, EnvPoolEnv, check_env_specs  # noqa: E402
from tdrl.core.specs import Bounded, Categorical, OneHot, Unbounded  # noqa: E402


def _raw(env_id: str, seed: int, n: int = 1, **kwargs):
    with warnings.catch_warnings():  # Gymnasium on EnvPool's float64 Box bounds
        warnings.simplefilter("ignore", UserWarning)
        pool = envpool.make(env_id, env_type="gymnasium", num_envs=n, batch_size=n, seed=seed,
                            num_threads=1, **kwargs)
        pool.observation_space  # noqa: B018 - the warning fires on first use
    return pool


def test_cartpole_keys_shapes_dtypes_and_specs():
    env = EnvPoolEnv("CartPole-v1", 4, num_threads=1, seed=0)
    assert env.batch_size == (4,)
    assert isinstance(env.action_spec, OneHot) and env.action_spec.shape == (4, 2)
    assert env.action_spec.dtype == torch.int64
    obs = env.observation_spec["observation"]
    assert isinstance(obs, Bounded) and obs.shape == (4, 4) and obs.dtype == torch.float32
    r = env.rollout(5, break_when_any_done=False)
    got = {k: (tuple(r[k].shape), r[k].dtype) for k in r.keys(True, True)}
    flag = ((4, 5, 1), torch.bool)
    assert got == {
        "action": ((4, 5, 2), torch.int64), "observation": ((4, 5, 4), torch.float32),
        "done": flag, "terminated": flag, "truncated": flag,
        ("next", "observation"): ((4, 5, 4), torch.float32),
        ("next", "reward"): ((4, 5, 1), torch.float32),
        ("next", "done"): flag, ("next", "terminated"): flag, ("next", "truncated"): flag,
    }
    assert torch.equal(r["next", "reward"], torch.ones(4, 5, 1))
    check_env_specs(env, max_steps=30)
    cat = EnvPoolEnv("CartPole-v1", 2, num_threads=1, categorical_action_encoding=True)
    assert isinstance(cat.action_spec, Categorical) and cat.action_spec.shape == (2,)
    check_env_specs(cat, max_steps=30)
    assert env.set_seed(5) == 9


def test_terminated_and_truncated_are_kept_apart():
    env = EnvPoolEnv("CartPole-v1", 1, num_threads=1, seed=0, categorical_action_encoding=True,
                     max_episode_steps=3)
    flip = iter(range(100))
    r = env.rollout(10, policy=lambda td: td.set("action", torch.tensor([next(flip) % 2])))
    assert r.batch_size == (1, 3)
    assert r["next", "truncated"].flatten().tolist() == [False, False, True]
    assert not r["next", "terminated"].any()
    assert torch.equal(r["next", "done"], r["next", "truncated"])
    env = EnvPoolEnv("CartPole-v1", 1, num_threads=1, seed=0, categorical_action_encoding=True)
    r = env.rollout(100, policy=lambda td: td.set("action", torch.tensor([1])))  # falls over
    assert r["next", "terminated"][0, -1].item() and not r["next", "truncated"].any()
    assert r.batch_size[1] < 100


def _replay_sub_env(r, seed: int, **kwargs) -> None:
    """Check sub-env rollout ``r`` (T,) step by step against a fresh one-env pool seeded like
    sub-env ``i`` (``seed + i``), resetting it by hand where the episode ended."""
    raw = _raw("CartPole-v1", seed, **kwargs)
    obs, _ = raw.reset()
    for t in range(r.batch_size[0]):
        np.testing.assert_array_equal(r["observation"][t].numpy(), obs[0])
        obs, rew, term, trunc, _ = raw.step(r["action"][t].numpy().reshape(1))
        np.testing.assert_array_equal(r["next", "observation"][t].numpy(), obs[0])
        assert r["next", "reward"][t].item() == rew[0] == 1.0
        assert r["next", "terminated"][t].item() == term[0]
        assert r["next", "truncated"][t].item() == trunc[0]
        if term[0] or trunc[0]:
            obs, _ = raw.reset(np.zeros(1, np.int32))


def _gymnasium_step(obs: np.ndarray, action: int) -> np.ndarray:
    """Gymnasium's CartPole dynamics from state ``obs``: an independent check that a
    transition is real."""
    env = gym.make("CartPole-v1").unwrapped
    env.reset(seed=0)
    env.state = obs.astype(np.float64)
    return env.step(action)[0]


def test_auto_reset_loses_and_fakes_nothing():
    torch.manual_seed(0)
    env = EnvPoolEnv("CartPole-v1", 3, num_threads=2, seed=10, categorical_action_encoding=True,
                     max_episode_steps=15)
    r = env.rollout(60, break_when_any_done=False)
    assert r.batch_size == (3, 60)
    assert r["next", "terminated"].sum() >= 2 and r["next", "truncated"].sum() >= 2
    for i in range(3):
        _replay_sub_env(r[i], 10 + i, max_episode_steps=15)
    # every transition follows Gymnasium's dynamics (no reset step passed off as one)
    flat = r.reshape(-1)
    for j in range(0, 180, 7):
        want = _gymnasium_step(flat["observation"][j].numpy(), int(flat["action"][j]))
        np.testing.assert_allclose(flat["next", "observation"][j].numpy(), want, rtol=1e-4, atol=1e-5)
    # a reset row starts a fresh episode: small CartPole state, done flags cleared
    starts = r["next", "done"][:, :-1, 0]
    assert (r["observation"][:, 1:][starts].abs() <= 0.05).all()
    assert not r["done"].any()
    env.close()


def test_same_seed_same_data_and_a_new_seed_rebuilds_the_pool():
    env = EnvPoolEnv("CartPole-v1", 2, num_threads=1, categorical_action_encoding=True)
    env.set_seed(3)
    a = env.rollout(30, policy=lambda td: td.set("action", torch.tensor([0, 1])),
                    break_when_any_done=False)
    env.set_seed(3)
    b = env.rollout(30, policy=lambda td: td.set("action", torch.tensor([0, 1])),
                    break_when_any_done=False)
    assert (a == b).all()
    env.set_seed(4)  # sub-env 0 now gets seed 4, which was sub-env 1 under seed 3
    c = env.rollout(30, policy=lambda td: td.set("action", torch.tensor([1, 1])),
                    break_when_any_done=False)
    assert torch.equal(c["observation"][0, 0], a["observation"][1, 0])
    assert not torch.equal(c["observation"][1, 0], a["observation"][1, 0])


def test_a_step_over_an_unreset_finished_sub_env_is_refused():
    env = EnvPoolEnv("CartPole-v1", 2, num_threads=1, seed=0, categorical_action_encoding=True,
                     max_episode_steps=2)
    td = env.reset()
    for _ in range(2):
        td = env.step(td.set("action", torch.tensor([0, 1])))
        nxt = td["next"].exclude("reward")
        td = nxt
    with pytest.raises(RuntimeError, match=r"sub-envs \[0, 1\] finished at the last step"):
        env.step(td.set("action", torch.tensor([0, 1])))
    td["_reset"] = td["done"].clone()
    td = env.reset(td)
    env.step(td.set("action", torch.tensor([0, 1])))  # reset first: a real step


@pytest.mark.parametrize("env_id, obs_dim, act_dim", [("HalfCheetah-v5", 17, 6), ("Hopper-v5", 11, 3)])
def test_mujoco_rollout_matches_raw_envpool(env_id, obs_dim, act_dim):
    env = EnvPoolEnv(env_id, 2, num_threads=1, seed=0, max_episode_steps=10)
    spec = env.observation_spec["observation"]
    assert isinstance(spec, Unbounded) and spec.dtype == torch.float64  # as GymEnv
    assert isinstance(env.action_spec, Bounded) and env.action_spec.shape == (2, act_dim)
    torch.manual_seed(0)
    r = env.rollout(25, break_when_any_done=False)
    assert r["observation"].shape == (2, 25, obs_dim) and r["next", "reward"].dtype == torch.float32
    assert r["next", "truncated"].sum() + r["next", "terminated"].sum() >= 4
    raw = _raw(env_id, 0, n=2, max_episode_steps=10)
    obs, _ = raw.reset()
    for t in range(25):
        np.testing.assert_array_equal(r["observation"][:, t].numpy(), obs)
        obs, rew, term, trunc, _ = raw.step(r["action"][:, t].numpy())
        np.testing.assert_array_equal(r["next", "observation"][:, t].numpy(), obs)
        np.testing.assert_array_equal(r["next", "reward"][:, t, 0].numpy(), rew)
        done = term | trunc
        if done.any():
            obs_rows, info = raw.reset(np.flatnonzero(done).astype(np.int32))
            obs = obs.copy()
            obs[info["env_id"]] = obs_rows
    check_env_specs(env)
    env.close()


def test_collector_dict_loop_equals_the_generic_loop():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    policy = TensorDictModule(lambda x: torch.nn.functional.one_hot(net(x).argmax(-1), 2),
                              ["observation"], ["action"])
    out = []
    for dict_loop in (True, False):
        env = EnvPoolEnv("CartPole-v1", 3, num_threads=1, max_episode_steps=20)
        col = Collector(env, policy, frames_per_batch=90, seed=5)
        col._dict_loop = dict_loop
        assert env.dict_stepper() is not None and env.dict_resetter() is not None
        it = iter(col)
        out.append(torch.cat([next(it), next(it)], -1))
        col.shutdown()
    assert out[0].batch_size == (3, 60) and out[0]["next", "done"].sum() >= 3
    ends = out[0]["next", "done"][..., 0].sum(0)
    assert ((ends > 0) & (ends < 3)).any()  # partial resets (the numpy dict reset) were crossed
    assert (out[0] == out[1]).all()


def test_bad_input_and_a_missing_extra_are_reported(monkeypatch):
    with pytest.raises(ValueError, match="EnvPool has no task 'CartPol-v1'.*CartPole-v1"):
        EnvPoolEnv("CartPol-v1", 2)
    with pytest.raises(ValueError, match="num_envs must be an int >= 1, got 0"):
        EnvPoolEnv("CartPole-v1", 0)
    env = EnvPoolEnv("CartPole-v1", 2, num_threads=1, check_actions=True)
    td = env.reset().set("action", torch.zeros(2, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"'action' has shape \(2, 3\).*expects shape \(2, 2\)"):
        env.step(td)
    monkeypatch.setitem(sys.modules, "envpool", None)
    with pytest.raises(ModuleNotFoundError, match=r'pip install "packages/core\[envpool\]"'):
        EnvPoolEnv("CartPole-v1", 2)


def _run(env, actions, generic: bool = False) -> list:
    """``step_and_maybe_reset`` over ``actions`` (the fused path, or EnvBase's generic one):
    ``[(stepped td, next root)]``."""
    td, out = env.reset(), []
    for a in actions:
        td["action"] = a
        step = EnvBase.step_and_maybe_reset if generic else type(env).step_and_maybe_reset
        stepped, td = step(env, td)
        out.append((stepped, td))
    return out


@pytest.mark.parametrize("env_id, kwargs", [("CartPole-v1", {"max_episode_steps": 7}),
                                            ("HalfCheetah-v5", {"max_episode_steps": 5})])
def test_cpp_channel_and_fused_step_match_the_public_api_and_the_generic_path(env_id, kwargs):
    envs = []
    for direct in (True, False):
        EnvPoolEnv._direct_channel = direct
        try:
            envs.append(EnvPoolEnv(env_id, 3, num_threads=1, seed=4, **kwargs))
        finally:
            EnvPoolEnv._direct_channel = True
    assert envs[0]._chan.direct and not envs[1]._chan.direct
    generic = EnvPoolEnv(env_id, 3, num_threads=1, seed=4, **kwargs)
    torch.manual_seed(0)
    actions = [envs[0].action_spec.rand() for _ in range(20)]
    runs = [_run(envs[0], actions), _run(envs[1], actions), _run(generic, actions, generic=True)]
    done = torch.stack([stepped["next", "done"][:, 0] for stepped, _ in runs[0]])
    assert done.any(0).all() and not done.all(1).all()  # partial resets of every sub-env
    for t in range(20):
        for other in runs[1:]:
            for a, b in zip(runs[0][t], other[t]):
                assert set(a.keys(True, True)) == set(b.keys(True, True))
                for k in a.keys(True, True):
                    assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), (t, k)
    stepped, root = runs[0][-1]
    assert set(root.keys()) == {"observation", "done", "terminated", "truncated"}
    assert stepped.batch_size == root.batch_size == stepped["next"].batch_size == (3,)


def test_fused_step_outputs_do_not_alias_later_steps():
    env = EnvPoolEnv("CartPole-v1", 4, num_threads=1, seed=0, max_episode_steps=6)
    torch.manual_seed(0)
    out, copies = [], []
    td = env.reset()
    for _ in range(30):
        td["action"] = env.action_spec.rand()
        stepped, td = env.step_and_maybe_reset(td)
        out.append((stepped, td))
        copies.append((stepped.clone(), td.clone()))
    n_resets = 0
    for (stepped, root), (s0, r0) in zip(out, copies):
        # nothing changed after the fact (the next step only adds "action" and "next" to root)
        assert (stepped == s0).all() and (root.select(*r0.keys()) == r0).all()
        done = stepped["next", "done"][:, 0]
        n_resets += int(done.any())
        # the reset rows of the next root are fresh starts, the step's own "next" is kept
        assert not root["done"].any()
        assert torch.equal(root["observation"][~done], stepped["next", "observation"][~done])
        if done.any():
            assert not torch.equal(root["observation"][done], stepped["next", "observation"][done])
            assert root["observation"].data_ptr() != stepped["next", "observation"].data_ptr()
    assert n_resets >= 3
    ptrs = [s["next", "observation"].data_ptr() for s, _ in out]
    assert len(set(ptrs)) == len(ptrs)


def test_fused_step_falls_back_for_a_locked_tensordict_or_a_preset_next():
    env = EnvPoolEnv("CartPole-v1", 2, num_threads=1, seed=0, categorical_action_encoding=True)
    td = env.reset().set("action", torch.tensor([0, 1]))
    td.set(("next", "memory"), torch.ones(2, 3))
    stepped, root = env.step_and_maybe_reset(td)
    assert torch.equal(stepped["next", "memory"], torch.ones(2, 3)) and "memory" in root.keys()
    root = root.set("action", torch.tensor([1, 0])).lock_()
    with pytest.raises(RuntimeError, match="locked"):
        env.step_and_maybe_reset(root)
    env = EnvPoolEnv("HalfCheetah-v5", 2, num_threads=1, seed=0)
    with pytest.raises(ValueError, match=r"action of shape \(2, 5\), expected \(2, 6\)"):
        env.step_and_maybe_reset(env.reset().set("action", torch.zeros(2, 5)))
