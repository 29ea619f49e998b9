"""MultiStepTransform: n-step sums by hand, the window across collector batches, the n-step
discount in the losses and TD(0), the compact-path refusals, and TorchRL's transform on the
same rollout (where TorchRL is installed)."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn

from tdrl.core.objectives import DQNLoss
from tdrl.core.replay import LazyTensorStorage, NextStateReconstructor, ReplayBuffer
from tdrl.core.transforms import MultiStepTransform, StepCounter, TransformedEnv
from tdrl.core.values import TD0
from tdrl.core.values.nstep import nstep_returns


def trajectory(T=8, done_at=(4,)):
    """Rewards 1..T, observations 0..T-1 (next: +1), an episode end at each of ``done_at``."""
    r = torch.arange(1.0, T + 1).unsqueeze(-1)
    done = torch.zeros(T, 1, dtype=torch.bool)
    done[list(done_at)] = True
    obs = torch.arange(T, dtype=torch.float32).unsqueeze(-1)
    return TensorDict(observation=obs, action=torch.zeros(T, dtype=torch.long), next=TensorDict(
        observation=obs + 1, reward=r, done=done, terminated=done.clone(),
        truncated=torch.zeros_like(done), batch_size=[T]), batch_size=[T])


def test_nstep_sums_by_hand_with_an_episode_end_inside():
    out = MultiStepTransform(3, 0.5).multi_step(trajectory())
    # episode 1 = steps 0..4 (done at 4), episode 2 = steps 5..7 (cut at the data's end)
    expected = [1 + .5 * 2 + .25 * 3, 2 + .5 * 3 + .25 * 4, 3 + .5 * 4 + .25 * 5, 4 + .5 * 5, 5.0,
                6 + .5 * 7 + .25 * 8, 7 + .5 * 8, 8.0]
    torch.testing.assert_close(out["next", "reward"].squeeze(-1), torch.tensor(expected))
    assert out["steps_to_next_obs"].tolist() == [3, 3, 3, 2, 1, 3, 2, 1]
    # the bootstrap observation is steps - 1 steps ahead, never across the episode end
    assert out["next", "observation"].squeeze(-1).tolist() == [3, 4, 5, 5, 5, 8, 8, 8]
    # the window's done flags: steps 2, 3, 4 end inside their window (the episode ends at 4)
    assert out["next", "terminated"].squeeze(-1).tolist() == [False, False, True, True, True,
                                                              False, False, False]
    torch.testing.assert_close(out["next", "original_reward"], trajectory()["next", "reward"])
    torch.testing.assert_close(out["gamma"], 0.5 ** out["steps_to_next_obs"].float())
    assert out["observation"].squeeze(-1).tolist() == list(range(8))  # the root is untouched


def test_nstep_returns_batched_and_n_1_is_the_identity():
    reward = torch.randn(3, 10, 1)
    done = torch.rand(3, 10) < 0.3
    same, steps = nstep_returns(reward, done, 1, 0.9)
    torch.testing.assert_close(same, reward)
    assert bool((steps == 1).all())
    summed, steps = nstep_returns(reward, done, 4, 0.9)
    for b in range(3):
        for t in range(10):
            k, acc = 0, 0.0
            while k < 4 and t + k < 10:
                acc += 0.9 ** k * float(reward[b, t + k, 0])
                k += 1
                if done[b, t + k - 1]:
                    break
            assert int(steps[b, t]) == k
            assert abs(float(summed[b, t, 0]) - acc) < 1e-5


def test_window_across_batches_matches_the_whole_rollout():
    full = trajectory(T=20, done_at=(6, 13))
    whole = MultiStepTransform(3, 0.9).multi_step(full)[:-3]
    rb = ReplayBuffer(storage=LazyTensorStorage(100), transform=MultiStepTransform(3, 0.9))
    assert len(rb.extend(full[:2])) == 0  # fewer than n + 1 steps so far: held back
    rb.extend(full[2:9])
    rb.extend(full[9:])
    assert len(rb) == 17
    stored = rb[:]
    for key in [("next", "reward"), ("next", "observation"), ("next", "terminated"),
                "steps_to_next_obs", "observation"]:
        torch.testing.assert_close(stored[key], whole[key])


def test_window_refuses_a_changed_env_batch():
    ms = MultiStepTransform(2, 0.9)
    ms.inv(torch.stack([trajectory(), trajectory()]))
    with pytest.raises(ValueError, match="env dims must stay the same"):
        ms.inv(trajectory())


class Table(nn.Module):
    def __init__(self, q):
        super().__init__()
        self.q = nn.Parameter(torch.tensor(q))

    def forward(self, obs):
        return self.q[obs.long().squeeze(-1)]


def test_dqn_loss_on_an_nstep_batch_equals_the_hand_target():
    q = [[float(s), float(10 + s)] for s in range(9)]  # Q(s, a) = s + 10 a: greedy value 10 + s
    net = TensorDictModule(Table(q), in_keys=["observation"], out_keys=["action_value"])
    loss = DQNLoss(net, gamma=0.5, loss_function="l2")
    batch = MultiStepTransform(3, 0.5).multi_step(trajectory())
    loss(batch)
    # target = n-step reward + 0.5 ** steps * (1 - terminated) * (10 + s_{t+steps}); Q(s_t, 0) = t
    sums = [2.75, 4.5, 6.25, 6.5, 5.0, 11.5, 11.0, 8.0]
    steps = [3, 3, 3, 2, 1, 3, 2, 1]
    nxt = [3, 4, 5, 5, 5, 8, 8, 8]
    term = [0, 0, 1, 1, 1, 0, 0, 0]
    target = [s + 0.5 ** k * (1 - d) * (10 + o) for s, k, o, d in zip(sums, steps, nxt, term)]
    torch.testing.assert_close(batch["td_error"], (torch.arange(8.0) - torch.tensor(target)).abs())


def test_td0_discounts_by_gamma_to_the_steps():
    batch = MultiStepTransform(2, 0.5).multi_step(trajectory())
    value = TensorDictModule(lambda o: 2 * o, in_keys=["observation"], out_keys=["state_value"])
    TD0(0.5, value_network=value)(batch)
    k = batch["steps_to_next_obs"].float()
    not_term = (~batch["next", "terminated"].squeeze(-1)).float()
    hand = batch["next", "reward"].squeeze(-1) + 0.5 ** k * not_term * 2 * batch["next", "observation"].squeeze(-1)
    torch.testing.assert_close(batch["value_target"].squeeze(-1), hand)


def test_compact_batches_and_envs_are_refused():
    compact = trajectory().exclude(("next", "observation"))
    with pytest.raises(ValueError, match="compact_obs=False"):
        MultiStepTransform(3, 0.9).inv(compact)
    nstep = MultiStepTransform(3, 0.9).multi_step(trajectory())
    with pytest.raises(ValueError, match="n steps ahead"):
        NextStateReconstructor()(nstep)
    rebuilt = NextStateReconstructor()(compact.clone())
    with pytest.raises(ValueError, match="compact batch"):
        MultiStepTransform(3, 0.9).inv(rebuilt)
    from tdrl.core.envs import GymEnv
    with pytest.raises(ValueError, match="replay buffer's transform"):
        TransformedEnv(GymEnv("CartPole-v1"), MultiStepTransform(3, 0.9))


def cartpole_rollout(n_envs=2, T=60):
    from tdrl.core.envs import GymEnv, SerialEnv
    env = TransformedEnv(SerialEnv(n_envs, lambda: GymEnv("CartPole-v1")), StepCounter())
    env.set_seed(0)
    torch.manual_seed(0)
    return env.rollout(T, break_when_any_done=False)


def test_matches_torchrl_multistep_on_a_real_rollout():
    rl_transforms = pytest.importorskip("torchrl.envs.transforms")
    rollout = cartpole_rollout()
    assert bool(rollout["next", "done"].any())  # episode ends inside: the case that matters
    theirs = rl_transforms.MultiStepTransform(4, 0.9).inv(rollout.clone())
    ours = MultiStepTransform(4, 0.9).inv(rollout.clone())
    assert ours.batch_size == theirs.batch_size
    same = [("next", "reward"), ("next", "original_reward"), ("next", "observation"),
            ("next", "step_count"), "steps_to_next_obs", "gamma", "nonterminal", "observation", "action"]
    for key in same:
        torch.testing.assert_close(ours[key], theirs[key].to(ours[key].dtype), msg=str(key))
    # DIFFERENCES: TorchRL keeps step t's done flags; tdrl's are the window's last step's
    last = torch.arange(ours.shape[-1]).expand(ours.shape) + ours["steps_to_next_obs"] - 1
    for flag in ("done", "terminated", "truncated"):
        want = rollout["next", flag].squeeze(-1).gather(-1, last)
        assert torch.equal(ours["next", flag].squeeze(-1), want)
        assert torch.equal(theirs["next", flag], rollout["next", flag][..., : ours.shape[-1], :])
