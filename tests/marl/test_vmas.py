"""VmasEnv follows the multi-agent data contract; bad inputs name what is wrong."""

from __future__ import annotations

import pytest
import torch

from tdrl.core.envs import check_env_specs
from tdrl.marl.envs import VmasEnv


def test_vmas_rollout_matches_the_data_contract():
    env = VmasEnv("navigation", num_envs=4, max_steps=5, seed=0, n_agents=3)
    check_env_specs(env)
    td = env.rollout(12, break_when_any_done=False)
    assert td.batch_size == (4, 12)
    assert td["agents", "observation"].shape == (4, 12, 3, 18)
    assert td["agents", "action"].shape == (4, 12, 3, 2)
    assert td["next", "agents", "reward"].shape == (4, 12, 3, 1)
    for key in ("done", "terminated", "truncated"):
        assert td["next", key].shape == (4, 12, 1) and td["next", key].dtype == torch.bool
    # max_steps=5 truncates after steps 5 and 10 (index 4 and 9); resets in between
    expect = torch.zeros(12, dtype=torch.bool)
    expect[[4, 9]] = True
    assert torch.equal(td["next", "truncated"][..., 0], expect.expand(4, 12))
    assert torch.equal(td["next", "done"], td["next", "terminated"] | td["next", "truncated"])
    assert env.action_spec.is_in(td["agents", "action"][:, 0])
    # the step after a reset starts from the reset observation, not the old next obs
    assert not torch.equal(td["agents", "observation"][:, 5], td["next", "agents", "observation"][:, 4])
    assert torch.equal(td["agents", "observation"][:, 4], td["next", "agents", "observation"][:, 3])



def test_time_limit_can_terminate_as_torchrls_vmas_env():
    """time_limit_terminates=True: the limit sets terminated too (TorchRL's VmasEnv, which
    BenchMARL uses); the same seed gives the same trajectory otherwise."""
    def run(flag):
        env = VmasEnv("navigation", num_envs=2, max_steps=3, seed=0, n_agents=2, time_limit_terminates=flag)
        torch.manual_seed(0)
        return env.rollout(7, break_when_any_done=False)

    plain, term = run(False), run(True)
    limit = torch.zeros(7, dtype=torch.bool)
    limit[[2, 5]] = True
    assert torch.equal(term["next", "truncated"][..., 0], limit.expand(2, 7))
    assert torch.equal(term["next", "terminated"], term["next", "done"])
    assert not bool(plain["next", "terminated"][:, [2, 5]].any())  # navigation does not end on its own so soon
    assert torch.equal(plain["next", "agents", "observation"], term["next", "agents", "observation"])

def test_vmas_discrete_actions_and_seeding():
    def run(seed):
        env = VmasEnv("navigation", num_envs=3, continuous_actions=False, seed=seed, n_agents=2)
        assert env.action_spec.shape == (3, 2) and env.action_spec.n == 9
        torch.manual_seed(0)
        return env.rollout(4)

    a, b, c = run(1), run(1), run(2)
    assert a["agents", "action"].dtype == torch.int64
    assert torch.equal(a["next", "agents", "observation"], b["next", "agents", "observation"])
    assert not torch.equal(a["agents", "observation"], c["agents", "observation"])


def test_vmas_partial_reset_only_resets_masked_envs():
    env = VmasEnv("balance", num_envs=3, seed=0, n_agents=3)
    td = env.reset()
    td = env.rand_step(td)
    root = td["next"].exclude(("agents", "reward"))
    root["_reset"] = torch.tensor([[True], [False], [False]])
    out = env.reset(root)
    obs_old, obs_new = root["agents", "observation"], out["agents", "observation"]
    assert torch.equal(obs_new[1:], obs_old[1:])
    assert not torch.equal(obs_new[0], obs_old[0])


def test_vmas_unknown_scenario_lists_valid_names():
    with pytest.raises(ValueError, match=r"Unknown VMAS scenario 'navigatoin'.*navigation"):
        VmasEnv("navigatoin", num_envs=2)


def test_vmas_wrong_action_shape_names_group_and_shapes():
    env = VmasEnv("navigation", num_envs=2, n_agents=3)
    td = env.reset()
    td["agents", "action"] = torch.zeros(2, 3, 4)
    with pytest.raises(ValueError, match=r"group 'agents'.*\(2, 3, 4\).*\(2, 3, 2\)"):
        env.step(td)


def test_vmas_internal_distributions_skip_checks_and_the_switch_is_restored(monkeypatch):
    """The simulator's own distributions (``sampling`` builds a MultivariateNormal per step) are
    built unchecked; the same rollout results; the global default is back afterwards, also
    when the step raises."""
    from torch.distributions import Distribution

    seen = []
    original = Distribution.__init__

    def record(self, *args, **kwargs):
        seen.append(Distribution._validate_args)
        original(self, *args, **kwargs)

    def run():
        env = VmasEnv("sampling", num_envs=2, continuous_actions=False, seed=3, max_steps=4)
        torch.manual_seed(0)
        return env.rollout(6, break_when_any_done=False)

    monkeypatch.setattr(Distribution, "__init__", record)
    # torch's default; another library imported earlier in the process (as TorchRL does) may
    # have switched it off for everyone: start from the default
    monkeypatch.setattr(Distribution, "_validate_args", True)
    fast = run()
    assert seen and not any(seen)  # every distribution VMAS built was unchecked
    assert Distribution._validate_args is True
    import tdrl.marl.envs.vmas as vmas_mod

    fast_ctx = vmas_mod._unvalidated_distributions
    monkeypatch.setattr(vmas_mod, "_unvalidated_distributions", __import__("contextlib").nullcontext)
    seen.clear()
    checked = run()
    assert seen and all(seen)
    assert torch.equal(fast["next", "agents", "observation"], checked["next", "agents", "observation"])
    assert torch.equal(fast["next", "agents", "reward"], checked["next", "agents", "reward"])
    monkeypatch.setattr(vmas_mod, "_unvalidated_distributions", fast_ctx)
    monkeypatch.setattr(Distribution, "__init__", original)

    env = VmasEnv("sampling", num_envs=2, continuous_actions=False, seed=3)
    td = env.rand_step(env.reset())

    def boom(actions):
        seen.append(Distribution._validate_args)
        raise RuntimeError("simulator failed")

    seen.clear()
    env._env.step = boom
    with pytest.raises(RuntimeError, match="simulator failed"):
        env.step(td)
    assert seen == [False] and Distribution._validate_args is True
