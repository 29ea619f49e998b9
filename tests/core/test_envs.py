"""EnvBase contract (reset/step/step_and_maybe_reset/rollout/seeding), the torch Pendulum
(parity with Gymnasium's Pendulum-v1, any batch size, gradients), bad-action errors and
check_env_specs."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict import TensorDict

from tdrl.core.envs import EnvBase, PendulumEnv, check_env_specs, step_mdp
from tdrl.core.specs import Bounded, Categorical, Composite, Unbounded


class CountEnv(EnvBase):
    """obs = steps since reset (float); reward = action; terminates when obs reaches ``horizon``."""

    def __init__(self, batch_size=(), horizon=3, check_actions=False):
        super().__init__(batch_size=batch_size, check_actions=check_actions)
        b = self.batch_size
        self.horizon = horizon
        self.observation_spec = Composite(observation=Unbounded((*b, 1)), shape=b)
        self.action_spec = Bounded(-1.0, 1.0, (*b, 1))
        self.n_resets = 0

    def _reset(self, td, **kwargs):
        self.n_resets += 1
        return TensorDict({"observation": torch.zeros(*self.batch_size, 1)}, self.batch_size)

    def _step(self, td):
        obs = td["observation"] + 1
        term = obs >= self.horizon
        return TensorDict(
            {"observation": obs, "reward": td["action"].clone(), "done": term.clone(),
             "terminated": term, "truncated": torch.zeros_like(term)},
            self.batch_size,
        )

    def _set_seed(self, seed):
        return seed + 1


def test_reset_and_step_write_the_contract_keys():
    env = CountEnv((2,))
    td = env.reset()
    assert td.batch_size == (2,)
    assert set(td.keys()) == {"observation", "done", "terminated", "truncated"}
    assert td["done"].dtype == torch.bool and td["done"].shape == (2, 1) and not td["done"].any()
    td["action"] = torch.full((2, 1), 0.5)
    out = env.step(td)
    assert out is td
    assert set(td["next"].keys()) == {"observation", "reward", "done", "terminated", "truncated"}
    assert torch.equal(td["next", "observation"], torch.ones(2, 1))
    assert torch.equal(td["next", "reward"], torch.full((2, 1), 0.5))
    nxt = step_mdp(td)
    assert "reward" not in nxt.keys() and torch.equal(nxt["observation"], torch.ones(2, 1))


def test_rollout_time_is_last_dim_and_breaks_on_done():
    env = CountEnv((2,), horizon=3)
    r = env.rollout(10)
    assert r.batch_size == (2, 3)  # stops at the first done
    assert torch.equal(r["observation"][0, :, 0], torch.tensor([0.0, 1.0, 2.0]))
    assert r["next", "done"][:, -1].all() and not r["next", "done"][:, :-1].any()
    r = env.rollout(7, break_when_any_done=False)
    assert r.batch_size == (2, 7)
    # after a terminal step the sub-env is reset: 0 1 2 | 0 1 2 | 0
    assert r["observation"][0, :, 0].tolist() == [0, 1, 2, 0, 1, 2, 0]
    assert r["next", "observation"][0, :, 0].tolist() == [1, 2, 3, 1, 2, 3, 1]


def test_rollout_with_policy_and_no_auto_reset():
    env = CountEnv(())

    def policy(td):
        td["action"] = td["observation"] / 10
        return td

    start = env.reset()
    r = env.rollout(2, policy=policy, auto_reset=False, tensordict=start)
    assert r.batch_size == (2,)
    assert torch.allclose(r["next", "reward"].flatten(), torch.tensor([0.0, 0.1]))
    with pytest.raises(ValueError, match="starting"):
        env.rollout(2, auto_reset=False)


def test_partial_reset_only_touches_masked_envs():
    env = CountEnv((3,), horizon=2)
    td = env.reset()
    td["observation"] = torch.tensor([[1.0], [0.0], [0.0]])
    td["action"] = torch.zeros(3, 1)
    td, nxt = env.step_and_maybe_reset(td)
    assert td["next", "done"].flatten().tolist() == [True, False, False]
    # env 0 was done and is reset; the others carry their next observation
    assert nxt["observation"].flatten().tolist() == [0.0, 1.0, 1.0]
    assert not nxt["done"].any() and "_reset" not in nxt.keys()
    # what a recurrent policy writes for t+1 survives the step and the partial reset
    td = env.reset()
    td["observation"] = torch.tensor([[1.0], [0.0], [0.0]])
    td["action"] = torch.zeros(3, 1)
    td["next", "hidden"] = torch.arange(3.0).unsqueeze(-1)
    td, nxt = env.step_and_maybe_reset(td)
    assert td["next", "observation"].flatten().tolist() == [2.0, 1.0, 1.0]
    assert nxt["hidden"].flatten().tolist() == [0.0, 1.0, 2.0]
    assert nxt["observation"].flatten().tolist() == [0.0, 1.0, 1.0]
    # an all-False mask resets nothing and does not call _reset
    n = env.n_resets
    same = env.reset(nxt.clone().set("_reset", torch.zeros(3, 1, dtype=torch.bool)))
    assert env.n_resets == n and torch.equal(same["observation"], nxt["observation"])


def _gym_pendulum_step(th, thdot, u):
    env = gym.make("Pendulum-v1").unwrapped
    env.reset(seed=0)
    env.state = np.array([th, thdot], dtype=np.float64)
    obs, reward, *_ = env.step(np.array([u], dtype=np.float32))
    return obs, reward


def test_pendulum_matches_gymnasium_dynamics():
    env = PendulumEnv((4,), dtype=torch.float64)
    th = torch.tensor([[0.3], [-2.5], [3.0], [1.0]], dtype=torch.float64)
    thdot = torch.tensor([[0.1], [-7.9], [5.0], [0.0]], dtype=torch.float64)
    u = torch.tensor([[1.5], [-2.0], [0.25], [3.0]], dtype=torch.float64)  # 3.0 gets clipped
    td = env.reset()
    td.update({"th": th, "thdot": thdot, "action": u})
    nxt = env.step(td)["next"]
    for i in range(4):
        obs, reward = _gym_pendulum_step(th[i].item(), thdot[i].item(), float(u[i]))
        np.testing.assert_allclose(nxt["observation"][i].numpy(), obs, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(nxt["reward"][i].item(), reward, rtol=1e-6, atol=1e-6)


def test_pendulum_any_batch_truncates_at_horizon():
    for batch in [(), (1,), (3, 2), (4096,)]:
        env = PendulumEnv(batch, max_episode_steps=4)
        r = env.rollout(6, break_when_any_done=False)
        assert r.batch_size == (*batch, 6)
        assert r["observation"].shape == (*batch, 6, 3)
        flags = r["next", "truncated"].reshape(-1, 6)[0]
        assert flags.tolist() == [False, False, False, True, False, False]
        assert not r["next", "terminated"].any()
        assert env.observation_spec["observation"].is_in(r["observation"][..., 0, :])


def test_pendulum_is_differentiable():
    torch.manual_seed(0)
    env = PendulumEnv((2,), dtype=torch.float64, max_episode_steps=None)
    env.set_seed(0)
    actions = torch.zeros(5, 2, 1, dtype=torch.float64, requires_grad=True)
    step = iter(range(5))

    def policy(td):
        td["action"] = actions[next(step)]
        return td

    r = env.rollout(5, policy=policy)
    ret = r["next", "reward"].sum()
    (grad,) = torch.autograd.grad(ret, actions)
    assert grad.abs().sum() > 0
    # finite-difference check on one action
    eps = 1e-6
    env.set_seed(0)
    start = env.reset()

    def total(a):
        td = start.clone()
        tot = 0.0
        for t in range(5):
            td["action"] = a[t]
            td = env.step(td)
            tot = tot + td["next", "reward"].sum()
            td = step_mdp(td)
        return tot

    base = actions.detach().clone()
    bumped = base.clone()
    bumped[1, 0, 0] += eps
    fd = (total(bumped) - total(base)) / eps
    assert torch.allclose(grad[1, 0, 0], fd, atol=1e-4)


def test_seeding_is_deterministic_and_chains():
    a, b = PendulumEnv((3,)), PendulumEnv((3,))
    assert a.set_seed(7) == 8
    b.set_seed(7)
    assert torch.equal(a.reset()["th"], b.reset()["th"])
    b.set_seed(8)
    assert not torch.equal(a.reset()["th"], b.reset()["th"])


def test_rand_action_is_in_spec():
    env = PendulumEnv((5,))
    td = env.rand_action()
    assert td["action"].shape == (5, 1) and env.action_spec.is_in(td["action"])


@pytest.mark.parametrize(
    "action, exc, words",
    [
        (torch.zeros(3, 2), ValueError, ["'action'", "shape (3, 2)", "(3, 1)", "Bounded"]),
        (torch.zeros(3, 1, dtype=torch.float64), TypeError, ["'action'", "torch.float64", "torch.float32"]),
        (torch.full((3, 1), 5.0), ValueError, ["'action'", "outside", "[-2, 2]", "5.0"]),
        (None, KeyError, ["'action'", "missing"]),
    ],
    ids=["shape", "dtype", "bounds", "missing"],
)
def test_bad_actions_raise_naming_key_spec_and_value(action, exc, words):
    env = PendulumEnv((3,), check_actions=True)
    td = env.reset()
    if action is not None:
        td["action"] = action
    with pytest.raises(exc) as info:
        env.step(td)
    for w in words:
        assert w in str(info.value), (w, str(info.value))


def test_unchecked_env_does_not_validate():
    env = PendulumEnv((3,))
    td = env.reset().set("action", torch.full((3, 1), 5.0))
    env.step(td)  # no check: the dynamics clip the torque
    assert torch.isfinite(td["next", "observation"]).all()


def test_check_env_specs_passes_and_names_what_differs():
    check_env_specs(PendulumEnv((2,)))
    check_env_specs(CountEnv((2,)))

    class BadReward(CountEnv):
        def _step(self, td):
            out = super()._step(td)
            out["reward"] = out["reward"].double()
            return out

    with pytest.raises(AssertionError, match=r"\('next', 'reward'\).*dtype torch.float32.*torch.float64"):
        check_env_specs(BadReward((2,)))

    class ExtraKey(CountEnv):
        def _step(self, td):
            return super()._step(td).set("surprise", torch.zeros(*self.batch_size, 1))

    with pytest.raises(AssertionError, match="surprise.*in no spec"):
        check_env_specs(ExtraKey(()))

    class OutOfSpec(CountEnv):
        def __init__(self):
            super().__init__(())
            self.observation_spec = Composite(observation=Bounded(0.0, 1.5, (1,)))

    with pytest.raises(AssertionError, match="observation.*outside"):
        check_env_specs(OutOfSpec())


def test_spec_setters_validate_batch_size():
    env = CountEnv((2,))
    with pytest.raises(ValueError, match="batch_size"):
        env.observation_spec = Composite(observation=Unbounded((3, 1)), shape=(3,))
    env.action_spec = Categorical(3, (2,))
    assert env.full_action_spec["action"].n == 3
    assert env.done_keys == ["done", "terminated", "truncated"]
    assert env.reward_spec.shape == (2, 1)
