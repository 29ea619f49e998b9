"""GymEnv's hot path: step outputs in preallocated row slabs never alias across steps, stay
equal to raw Gymnasium across slab refills; opt-in ``info_keys``; the unchecked TensorDict
constructor behaves like ``TensorDict._new_unsafe``."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict import TensorDict

from tdrl.core.envs import GymEnv, GymWrapper, check_env_specs
from tdrl.core.envs._fastpath import RowSlab
from tdrl.core.td_access import plain_td_maker
from tdrl.core.specs import Unbounded


class _InPlaceObsEnv(gym.Env):
    """Returns the same numpy array object every step, mutated in place (allowed by
    Gymnasium, done by some hand-written envs): a wrapper that wraps it without copying
    would let step t+1 overwrite step t."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self, horizon: int = 1000):
        self._buf = np.zeros(3, np.float32)
        self._t = 0
        self._horizon = horizon

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        self._buf[:] = 0.0
        return self._buf, {"t": 0}

    def step(self, action):
        self._t += 1
        self._buf[:] = self._t
        return self._buf, float(self._t), False, self._t >= self._horizon, {"t": self._t}


def _steps(env, n: int, action_fn):
    """``n`` steps; returns the list of stepped TensorDicts (the env's tensors, uncopied)."""
    td = env.reset()
    out = []
    for i in range(n):
        td["action"] = action_fn(i)
        td, td_next = env.step_and_maybe_reset(td)
        out.append(td)
        td = td_next
    return out


def test_step_t_does_not_change_when_step_t_plus_1_runs():
    env = GymWrapper(_InPlaceObsEnv())
    tds = _steps(env, 5, lambda i: torch.zeros(1))
    for t, td in enumerate(tds, start=1):  # each step kept its own values
        assert td["next", "observation"].tolist() == [float(t)] * 3
        assert td["next", "reward"].item() == float(t)
    # and checked explicitly right after the next step runs
    td = env.reset()
    td["action"] = torch.zeros(1)
    first = env.step(td)["next"]
    obs0, rew0 = first["observation"], first["reward"]
    before = (obs0.clone(), rew0.clone())
    td2 = first.exclude("reward")
    td2["action"] = torch.zeros(1)
    second = env.step(td2)["next"]
    assert torch.equal(obs0, before[0]) and torch.equal(rew0, before[1])
    assert obs0.data_ptr() != second["observation"].data_ptr()
    assert rew0.data_ptr() != second["reward"].data_ptr()


def test_rollout_steps_are_distinct_tensors_and_do_not_alias():
    env = GymWrapper(_InPlaceObsEnv())
    roll = env.rollout(4)
    assert roll["next", "observation"][:, 0].tolist() == [1.0, 2.0, 3.0, 4.0]
    assert roll["observation"][:, 0].tolist() == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.parametrize("num_envs", [None, 3])
def test_same_values_as_raw_gymnasium_across_slab_refills(num_envs):
    """600 steps > 2 slabs of 256 rows: every kept step equals raw Gymnasium's."""
    n = 600
    rng = np.random.default_rng(0)
    shape = (1,) if num_envs is None else (num_envs, 1)
    actions = rng.uniform(-2, 2, (n, *shape)).astype(np.float32)
    if num_envs is None:
        raw, env = gym.make("Pendulum-v1"), GymEnv("Pendulum-v1")
    else:
        kw = {"num_envs": num_envs, "vectorization_mode": "sync",
              "vector_kwargs": {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}}
        raw, env = gym.make_vec("Pendulum-v1", **kw), GymEnv("Pendulum-v1", num_envs=num_envs)
    raw.reset(seed=5)
    env.set_seed(5)
    tds = _steps(env, n, lambda i: torch.from_numpy(actions[i]))
    for i, td in enumerate(tds):
        obs, rew, term, trunc, info = raw.step(actions[i])
        if num_envs is not None and (term | trunc).any():
            obs = np.where((term | trunc)[:, None], np.stack(info["final_obs"]), obs)
        if num_envs is None and (term or trunc):
            raw.reset()
        nxt = td["next"]
        np.testing.assert_array_equal(nxt["observation"].numpy(), obs)
        np.testing.assert_array_equal(nxt["reward"].numpy().reshape(-1),
                                      np.asarray(rew, np.float32).reshape(-1))
        np.testing.assert_array_equal(nxt["truncated"].numpy().reshape(-1),
                                      np.asarray(trunc).reshape(-1))
        assert nxt["done"].dtype == torch.bool and nxt["done"].shape == (*env.batch_size, 1)
    assert any(bool(td["next", "truncated"].any()) for td in tds)  # episodes of 200 steps


def test_bad_observation_from_the_env_names_the_spec():
    class Bad(_InPlaceObsEnv):
        def step(self, action):
            return np.zeros(5, np.float32), 0.0, False, False, {}

    env = GymWrapper(Bad())
    td = env.reset()
    td["action"] = torch.zeros(1)
    with pytest.raises(ValueError, match=r"observation of shape \(5,\).*expects shape \(3,\)"):
        env.step(td)


def test_info_keys_on_mujoco_match_raw_info():
    env = GymEnv("HalfCheetah-v5", info_keys=("x_position",))
    raw = gym.make("HalfCheetah-v5")
    spec = env.observation_spec["x_position"]
    assert isinstance(spec, Unbounded) and spec.shape == () and spec.dtype == torch.float32
    assert env.info_keys == ["x_position"]
    env.set_seed(1)
    _, raw_info = raw.reset(seed=1)
    actions = np.random.default_rng(1).uniform(-1, 1, (10, 6)).astype(np.float32)
    roll = env.rollout(10, policy=_replay(actions))
    assert roll["x_position"][0].item() == pytest.approx(raw_info["x_position"], abs=1e-6)
    xs = [raw.step(a)[4]["x_position"] for a in actions]
    np.testing.assert_allclose(roll["next", "x_position"].numpy(), np.float32(xs), rtol=1e-6)
    assert torch.equal(roll["x_position"][1:], roll["next", "x_position"][:-1])
    check_env_specs(env)
    env.set_info_keys(None)  # and off again
    assert "x_position" not in env.observation_spec.keys()
    assert "x_position" not in env.rollout(2).keys()


def _replay(actions):
    it = iter(actions)
    return lambda td: td.set("action", torch.from_numpy(next(it)))


def test_info_keys_with_specs_missing_entries_and_vector_envs():
    spec = Unbounded((1,), dtype=torch.float64)
    env = GymEnv("HalfCheetah-v5", info_keys={"x_velocity": spec, "not_there": None})
    assert env.observation_spec["x_velocity"].shape == (1,)
    assert env.observation_spec["x_velocity"].dtype == torch.float64
    roll = env.rollout(3)
    assert roll["next", "x_velocity"].shape == (3, 1)
    assert roll["next", "x_velocity"].dtype == torch.float64
    assert roll["x_velocity"][0].item() == 0.0  # step-only entry: zeros after a reset
    assert torch.equal(roll["next", "not_there"], torch.zeros(3))
    venv = GymEnv("HalfCheetah-v5", num_envs=2, info_keys=["x_position"])
    assert venv.observation_spec["x_position"].shape == (2,)
    vroll = venv.rollout(3)
    assert vroll["next", "x_position"].shape == (2, 3)
    assert not torch.equal(vroll["next", "x_position"][:, -1], torch.zeros(2))
    check_env_specs(venv)


def test_info_keys_bad_input():
    with pytest.raises(TypeError, match="sequence of names"):
        GymEnv("Pendulum-v1", info_keys="x_position")
    with pytest.raises(ValueError, match="collide"):
        GymEnv("Pendulum-v1", info_keys=("observation",))
    env = GymEnv("HalfCheetah-v5", info_keys={"x_position": Unbounded((3,))})
    with pytest.raises(ValueError, match=r"info\['x_position'\] has shape"):
        env.reset()


def test_plain_td_maker_matches_new_unsafe():
    for batch in [(), (4,), (2, 3)]:
        make = plain_td_maker(torch.Size(batch), torch.device("cpu"))
        x, y = torch.randn(*batch, 2), torch.zeros(*batch, 1, dtype=torch.bool)
        td = make({"x": x, "y": y})
        ref = TensorDict._new_unsafe({"x": x, "y": y}, batch_size=torch.Size(batch),
                                     device=torch.device("cpu"))
        assert td.batch_size == ref.batch_size and td.device == ref.device
        assert td.get("x") is x and sorted(td.keys()) == ["x", "y"]
        assert (td == ref).all()
        td.set("z", torch.ones(*batch, 3))  # a normal, writable TensorDict
        assert torch.stack([td, td.clone()], 0).batch_size == (2, *batch)
        td2 = make({"x": x})
        assert "z" not in td2.keys()  # instances share nothing


def test_row_slab_hands_out_distinct_rows():
    slab = RowSlab({"a": (2,)}, {"a": torch.float32}, rows=3)
    rows = []
    for v in range(7):  # 3 slabs
        i = slab.take()
        slab.np["a"][i] = v
        rows.append(slab.views["a"][i])
    assert [r.tolist() for r in rows] == [[float(v)] * 2 for v in range(7)]
    assert len({r.data_ptr() for r in rows}) == 7
    big = RowSlab({"img": (256, 256, 3)}, {"img": torch.uint8})
    assert big.rows == 1  # large rows: a slab never pins much memory


def test_step_mdp_root_shares_no_container_with_next():
    from tdrl.core.envs import step_mdp

    flat = TensorDict({"next": {"observation": torch.zeros(2, 3), "reward": torch.ones(2, 1)}}, [2])
    root = step_mdp(flat)
    assert sorted(root.keys()) == ["observation"] and root.batch_size == (2,)
    root["action"] = torch.zeros(2, 1)
    assert "action" not in flat["next"].keys()
    nested = TensorDict({"next": {"agents": {"obs": torch.zeros(2, 3), "reward": torch.ones(2, 1)}}},
                        [2])
    root = step_mdp(nested, reward_keys=[("agents", "reward")])
    assert ("agents", "reward") not in root.keys(True) and ("agents", "obs") in root.keys(True)
    root["agents", "action"] = torch.zeros(2, 1)
    assert "action" not in nested["next", "agents"].keys()


def test_info_keys_vector_same_step_reads_final_info_then_reset_info():
    env = GymEnv("HalfCheetah-v5", num_envs=2, info_keys=["x_position"], max_episode_steps=3)
    env.set_seed(0)
    roll = env.rollout(5, break_when_any_done=False)
    assert roll["next", "truncated"][:, 2].all()
    raw = gym.make_vec("HalfCheetah-v5", num_envs=2, vectorization_mode="sync", max_episode_steps=3,
                       vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})
    _, info = raw.reset(seed=0)
    np.testing.assert_allclose(roll["x_position"][:, 0].numpy(), info["x_position"], rtol=1e-6)
    for t in range(5):
        _, _, _, _, info = raw.step(roll["action"][:, t].numpy())
        final = info.get("final_info")
        want = final["x_position"] if final else info["x_position"]  # last step of the episode
        np.testing.assert_allclose(roll["next", "x_position"][:, t].numpy(), want, rtol=1e-6)
        if t == 2:  # the root after the autoreset holds the reset's info
            np.testing.assert_allclose(roll["x_position"][:, 3].numpy(), info["x_position"],
                                       rtol=1e-6)


@pytest.mark.parametrize("num_envs", [None, 1, 3])
def test_step_and_maybe_reset_by_hand_takes_the_one_step_body_and_equals_the_checked_path(num_envs):
    """A user's own loop (``env.step_and_maybe_reset``) runs the env's dict step body, as the
    collector does; its TensorDicts equal the generic path's (forced with ``check_actions``,
    which has no dict body), resets and trajectory ends included."""
    from tdrl.core.envs import GymEnv

    outs = []
    for checked in (False, True):
        env = GymEnv("CartPole-v1", num_envs=num_envs, categorical_action_encoding=True)
        env.check_actions = checked
        assert (env.dict_stepper() is None) == checked
        env.set_seed(11)
        td, steps = env.reset(), []
        g = torch.Generator().manual_seed(0)
        for _ in range(120):
            td["action"] = torch.randint(0, 2, env.batch_size, generator=g)
            stepped, td = env.step_and_maybe_reset(td)
            steps.append((stepped.clone(), td.clone()))
        outs.append(steps)
    ends = 0
    for (a, ra), (b, rb) in zip(*outs):
        assert set(a.keys(True, True)) == set(b.keys(True, True)) and set(ra.keys(True, True)) == set(rb.keys(True, True))
        assert (a == b).all() and (ra == rb).all()
        ends += int(a["next", "done"].sum())
    assert ends >= 3  # episodes ended and were reset along the way


@pytest.mark.parametrize("env_id", ["Pendulum-v1", "CartPole-v1"])
def test_step_by_hand_takes_the_one_step_body_and_equals_the_checked_path(env_id):
    """``env.step(td)`` on a plain TensorDict runs the env's dict step body (as
    ``step_and_maybe_reset`` and the collector do): same keys, key order and values as the
    generic path (forced with ``check_actions``), episode ends included; a ``"next"`` entry
    the caller put there (a recurrent policy's next state) is kept, through the generic path."""
    from tdrl.core.envs import GymEnv

    outs = []
    for checked in (False, True):
        env = GymEnv(env_id, categorical_action_encoding=True)
        env.check_actions = checked
        env.set_seed(5)
        td, steps = env.reset(), []
        g = torch.Generator().manual_seed(0)
        for _ in range(260):
            td = td.clone()
            td["action"] = (torch.randint(0, 2, (), generator=g) if env_id == "CartPole-v1"
                            else torch.rand(1, generator=g) * 4 - 2)
            out = env.step(td)
            assert out is td
            steps.append(td.clone())
            td = env.reset() if bool(td["next", "done"]) else td["next"].exclude("reward")
        outs.append(steps)
    ends = 0
    for a, b in zip(*outs):
        assert list(a.keys()) == list(b.keys()) and list(a["next"].keys()) == list(b["next"].keys())
        assert (a == b).all()
        ends += int(a["next", "done"])
    assert ends >= 1
    env = GymEnv(env_id, categorical_action_encoding=True)
    td = env.reset()
    td["action"] = env.action_spec.zero()
    td["next", "hidden"] = torch.ones(3)
    env.step(td)
    assert torch.equal(td["next", "hidden"], torch.ones(3)) and "observation" in td["next"].keys()
