"""Single-process collector on real envs (Gymnasium Pendulum, batched torch Pendulum)."""

from __future__ import annotations

import copy

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import InteractionType, TensorDictModule
from tensordict.nn.distributions import NormalParamExtractor

from tdrl.core.collectors import MASK_KEY, Collector, split_trajectories
from tdrl.core.envs import GymEnv, PendulumEnv
from tdrl.core.keys import TRAJ_ID


def _linear_policy(weight=0.5, bias=0.25):
    net = torch.nn.Linear(3, 1)
    with torch.no_grad():
        net.weight.fill_(weight)
        net.bias.fill_(bias)
    return TensorDictModule(net, ["observation"], ["action"])


def _check_contract(batch, env_batch, T):
    assert batch.batch_size == (*env_batch, T)
    for key in ["observation", "action", "done", "terminated", "truncated",
                ("next", "observation"), ("next", "reward"), ("next", "done"),
                ("next", "terminated"), ("next", "truncated"), TRAJ_ID]:
        assert key in batch.keys(include_nested=True), key
    assert batch["next", "reward"].shape == (*env_batch, T, 1)
    assert batch["next", "done"].dtype == torch.bool
    assert batch[TRAJ_ID].shape == (*env_batch, T)


def test_gym_pendulum_batches_follow_the_data_contract():
    env = GymEnv("Pendulum-v1")
    env.set_seed(0)
    col = Collector(env, _linear_policy(), frames_per_batch=150, total_frames=450)
    batches = list(col)
    assert len(batches) == 3 == len(col)
    b = batches[0]
    _check_contract(b, (), 150)
    # the policy ran on every step: action = 0.5 * sum(obs) + 0.25 (no clipping needed here)
    assert torch.allclose(b["action"], 0.5 * b["observation"].sum(-1, keepdim=True) + 0.25)
    # step t+1's root observation is step t's next observation, across batch borders too
    assert torch.equal(b["observation"][1:], b["next", "observation"][:-1])
    assert torch.equal(batches[1]["observation"][0], b["next", "observation"][-1])
    # Pendulum truncates at 200 steps: a new trajectory id right after
    full = torch.cat(batches, 0)
    done = full["next", "done"].squeeze(-1)
    assert done.nonzero().squeeze(-1).tolist() == [199, 399]
    ids = full[TRAJ_ID]
    assert (ids[:200] == 0).all() and (ids[200:400] == 1).all() and (ids[400:] == 2).all()
    assert torch.equal(full["observation"][200], full["observation"][200])  # reset obs present
    assert not torch.equal(full["observation"][200], full["next", "observation"][199])


def test_batched_env_resets_on_done_and_ids_are_unique():
    env = PendulumEnv(batch_size=(3,), max_episode_steps=4)
    col = Collector(env, None, frames_per_batch=30, total_frames=60)
    b1, b2 = list(col)
    _check_contract(b1, (3,), 10)
    full = torch.cat([b1, b2], -1)
    step = full["step_count"].squeeze(-1)  # the env's own step counter: reset -> 0
    assert (step == torch.arange(20) % 4).all()
    ids = full[TRAJ_ID]
    # each sub-env gets a new id every 4 steps; ids never repeat across sub-envs
    for k in range(5):
        seg = ids[:, 4 * k: 4 * k + 4]
        assert (seg == seg[:, :1]).all()
    assert ids[:, ::4].unique().numel() == 15


def test_frames_per_batch_rounds_up_to_env_multiple():
    col = Collector(PendulumEnv(batch_size=(4,)), None, frames_per_batch=10, total_frames=25)
    assert col.frames_per_batch == 12 and col.total_frames == 36
    assert next(iter(col)).batch_size == (4, 3)


def test_init_random_frames_then_policy():
    torch.manual_seed(0)
    env = PendulumEnv(batch_size=(2,))
    col = Collector(env, _linear_policy(0.0, 1.5), frames_per_batch=8, init_random_frames=12)
    it = iter(col)
    b1, b2 = next(it), next(it)
    a = torch.cat([b1["action"], b2["action"]], 1).squeeze(-1)  # (2, 8)
    assert not (a[:, :6] == 1.5).any()  # 12 frames = 6 steps of 2 envs are random
    assert (a[:, 6:] == 1.5).all()


def test_exploration_type_and_policy_weight_update():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 2), NormalParamExtractor())
    from tensordict.nn import ProbabilisticTensorDictModule, ProbabilisticTensorDictSequential

    policy = ProbabilisticTensorDictSequential(
        TensorDictModule(net, ["observation"], ["loc", "scale"]),
        ProbabilisticTensorDictModule(["loc", "scale"], ["action"],
                                      distribution_class=torch.distributions.Normal),
    )
    env = PendulumEnv()
    det = Collector(env, policy, frames_per_batch=5, exploration_type="deterministic")
    b = next(iter(det))
    assert torch.allclose(b["action"], b["loc"])
    rnd = Collector(env, policy, frames_per_batch=5, exploration_type=InteractionType.RANDOM)
    b = next(iter(rnd))
    assert not torch.allclose(b["action"], b["loc"])
    # the collector runs the policy it was given: an in-place update is seen at once, and
    # update_policy_weights_ copies weights from another module / state dict
    other = copy.deepcopy(policy)
    lin = other.module[0].module[0]
    torch.nn.init.constant_(lin.weight, 0.0)
    torch.nn.init.constant_(lin.bias, 0.3)
    det.update_policy_weights_(other)
    assert torch.allclose(next(iter(det))["action"], torch.tensor(0.3))
    state = {k: torch.full_like(v, 0.7) if k.endswith("bias") else torch.zeros_like(v)
             for k, v in other.state_dict().items()}
    det.update_policy_weights_(state)
    assert torch.allclose(next(iter(det))["action"], torch.tensor(0.7))
    assert torch.allclose(lin.bias, torch.tensor(0.3))  # the source module is untouched


def test_recurrent_state_under_next_is_carried_between_batches():
    class Counter(torch.nn.Module):
        def forward(self, obs, hidden):
            return torch.zeros_like(obs[..., :1]), hidden + 1

    env = PendulumEnv(batch_size=(2,), max_episode_steps=None)
    hidden0 = TensorDict({"hidden": torch.zeros(2, 1)}, [2])

    def policy(td):
        if "hidden" not in td.keys():
            td.update(hidden0)
        action, nxt = Counter()(td["observation"], td["hidden"])
        td.set("action", action)
        td.set(("next", "hidden"), nxt)  # written under "next" by the policy
        return td

    col = Collector(env, policy, frames_per_batch=6)
    it = iter(col)
    b1, b2 = next(it), next(it)
    assert b1["hidden"].squeeze(-1).tolist() == [[0, 1, 2]] * 2
    assert b2["hidden"].squeeze(-1).tolist() == [[3, 4, 5]] * 2


def test_max_frames_per_traj_truncates():
    col = Collector(PendulumEnv(batch_size=(2,), max_episode_steps=None), None,
                    frames_per_batch=20, max_frames_per_traj=3)
    b = next(iter(col))
    trunc = b["next", "truncated"].squeeze(-1)
    assert trunc[0].nonzero().squeeze(-1).tolist() == [2, 5, 8]
    assert (b["next", "done"].squeeze(-1) == trunc).all()
    assert (b["step_count"].squeeze(-1)[0] == torch.tensor([0, 1, 2] * 3 + [0])).all()


def test_split_trajs_pads_and_masks():
    col = Collector(PendulumEnv(batch_size=(2,), max_episode_steps=3), None,
                    frames_per_batch=10, split_trajs=True)
    out = next(iter(col))
    # 5 steps per env: episodes of 3 then 2 steps
    assert out.batch_size == (4, 3)
    assert out[MASK_KEY].sum(-1).tolist() == [3, 3, 2, 2]
    assert (out["step_count"][~out[MASK_KEY]] == 0).all()
    ids = out[TRAJ_ID]
    assert (ids[out[MASK_KEY]].reshape(-1) >= 0).all()
    direct = split_trajectories(next(iter(Collector(PendulumEnv(batch_size=(2,), max_episode_steps=3),
                                                  None, frames_per_batch=10))))
    assert direct.batch_size == (4, 3)


def test_env_built_from_callable_is_owned_and_closed():
    # the policy is already on the requested device: it is used as is, not copied
    pol = _linear_policy()
    col = Collector(lambda: PendulumEnv(), pol, frames_per_batch=4, device="cpu")
    assert col.policy is pol and col._owns_env
    col.shutdown()
    assert col.env.is_closed
    with pytest.raises(RuntimeError, match="shut down"):
        col.rollout()


def test_collector_batches_feed_a_slice_sampler_without_crossing_episodes():
    from tdrl.core.replay import ReplayBuffer, SliceSampler, TensorStorage

    torch.manual_seed(0)
    col = Collector(PendulumEnv(batch_size=(3,), max_episode_steps=6), None,
                    frames_per_batch=30, total_frames=90)
    rb = ReplayBuffer(TensorStorage(64), SliceSampler(slice_len=4), batch_size=200)
    for batch in col:
        rb.extend(batch)  # (3, 10) -> 30 items, each env's steps consecutive; ring wraps
    out = rb.sample()
    assert out.batch_size == (50, 4)
    assert (out[TRAJ_ID] == out[TRAJ_ID][:, :1]).all()
    assert (out["step_count"].squeeze(-1).diff(dim=-1) == 1).all()
    assert torch.equal(out["observation"][:, 1:], out["next", "observation"][:, :-1])
