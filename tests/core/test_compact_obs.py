"""The compact-observation path: a collector that drops ("next", obs), NextStateReconstructor,
and the value estimators on the rebuilt batches (masking, refusal, shifted and chunked runs)."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule

from tdrl.core.collectors import Collector, MultiSyncCollector
from tdrl.core.envs import GymEnv
from tdrl.core.keys import NEXT_OBS_KNOWN, TRAJ_ID
from tdrl.core.replay import NextStateReconstructor, ReplayBuffer, SliceSampler, TensorStorage
from tdrl.core.values import GAE, TD0, TDLambda, td0_return

NEXT_OBS = ("next", "observation")


def _cartpole(num_envs=2):
    env = GymEnv("CartPole-v1", num_envs=num_envs)
    env.set_seed(0)
    return env


def _batch(make_env, compact, frames, **kw):
    torch.manual_seed(0)  # the random policy draws from torch's generator
    col = Collector(make_env(), None, frames_per_batch=frames, compact_obs=compact, **kw)
    try:
        return col.rollout(), col.compact_keys
    finally:
        col.shutdown()


def _value_net(n_obs, seed=0):
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(n_obs, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    return TensorDictModule(net, ["observation"], ["state_value"])


def _ends_in_termination(batch):
    """[*B, T] bool: the step's trajectory ends by termination inside the batch (the targets of
    the plain path there read no next observation the compact batch lacks)."""
    done = batch["next", "done"].squeeze(-1)
    term = batch["next", "terminated"].squeeze(-1)
    out = torch.zeros_like(done)
    ok = torch.zeros_like(done[..., 0])
    for t in range(done.shape[-1] - 1, -1, -1):
        ok = torch.where(done[..., t], term[..., t], ok)
        out[..., t] = ok
    return out


# ----------------------------------------------------------------------------- collector
def test_compact_collector_drops_next_observations_and_keeps_rewards_and_flags():
    plain, _ = _batch(_cartpole, False, 80)
    compact, keys = _batch(_cartpole, True, 80)
    assert keys == ("observation",)
    assert NEXT_OBS in plain.keys(True) and NEXT_OBS not in compact.keys(True)
    assert sorted(compact["next"].keys()) == ["done", "reward", "terminated", "truncated"]
    for key in ["observation", "action", ("next", "reward"), ("next", "done"),
                ("next", "terminated"), ("next", "truncated"), TRAJ_ID]:
        assert torch.equal(plain[key], compact[key]), key
    assert int(plain["next", "done"].sum()) >= 1  # the batch crosses an episode end


@pytest.mark.parametrize("dict_loop", [True, False])
def test_compact_batches_of_both_collector_loops_rebuild_to_the_plain_batch(dict_loop):
    # a policy module: a GymEnv runs the collector's dict loop (which then never stacks the
    # next observations), unless forced onto the generic loop
    torch.manual_seed(0)
    policy = TensorDictModule(torch.nn.Linear(3, 1), ["observation"], ["action"])
    out = {}
    for compact in (False, True):
        env = GymEnv("Pendulum-v1", num_envs=2)
        env.set_seed(0)
        col = Collector(env, policy, frames_per_batch=60, max_frames_per_traj=None,
                        compact_obs=compact)
        col._dict_loop = dict_loop
        out[compact] = col.rollout()
        col.shutdown()
    plain, compact = out[False], out[True]
    assert NEXT_OBS not in compact.keys(True)
    assert torch.equal(plain["action"], compact["action"])
    rebuilt = NextStateReconstructor()(compact)
    known = rebuilt[NEXT_OBS_KNOWN].squeeze(-1)
    assert known[:, :-1].all() and not known[:, -1].any()
    assert torch.equal(rebuilt[NEXT_OBS][known], plain[NEXT_OBS][known])


def test_multi_process_collector_passes_compact_obs_to_its_workers():
    col = MultiSyncCollector([lambda: GymEnv("CartPole-v1")] * 2, None, frames_per_batch=40,
                             total_frames=40, compact_obs=True, seed=0)
    try:
        batch = next(iter(col))
    finally:
        col.shutdown()
    assert col.compact_obs
    assert NEXT_OBS not in batch.keys(True) and ("next", "reward") in batch.keys(True)
    assert batch["observation"].shape[-1] == 4


# ----------------------------------------------------------------------------- reconstructor
def test_reconstructor_rebuilds_next_obs_of_a_real_rollout_and_marks_the_ends_nan():
    plain, _ = _batch(_cartpole, False, 120)
    compact, _ = _batch(_cartpole, True, 120)
    out = NextStateReconstructor()(compact)
    known = out[NEXT_OBS_KNOWN].squeeze(-1)
    done = plain["next", "done"].squeeze(-1)
    # unknown exactly after done steps and at the end of each sub-env's batch
    expected = ~done
    expected[:, -1] = False
    assert torch.equal(known, expected)
    assert torch.equal(out[NEXT_OBS][known], plain[NEXT_OBS][known])
    assert torch.isnan(out[NEXT_OBS][~known]).all()


@pytest.mark.parametrize("frame", [(1,), (64, 64, 3)])  # narrow rows and pixel-wide rows
def test_reconstructor_on_a_1d_rollout_and_on_integer_observations(frame):
    obs = (torch.arange(6, dtype=torch.uint8) + 1).reshape(6, *[1] * len(frame)).expand(6, *frame)
    td = TensorDict({"observation": obs.clone(),
                     "next": {"done": torch.tensor([0, 1, 0, 0, 0, 0], dtype=torch.bool)[:, None]}},
                    batch_size=[6])
    out = NextStateReconstructor(fill_value=255)(td)
    want = torch.tensor([2, 255, 4, 5, 6, 255], dtype=torch.uint8).reshape(obs.shape[:1] + (1,) * len(frame))
    assert torch.equal(out[NEXT_OBS], want.expand_as(obs))
    assert torch.equal(out["observation"], obs)  # the observations themselves are untouched
    assert out[NEXT_OBS_KNOWN].squeeze(-1).tolist() == [True, False, True, True, True, False]
    with pytest.raises(KeyError, match="pixels"):
        NextStateReconstructor(["pixels"])(td)


def test_reconstructor_on_slices_sampled_from_a_compact_buffer():
    storages = {}
    for compact in (False, True):
        torch.manual_seed(0)
        env = _cartpole(2)
        col = Collector(env, None, frames_per_batch=64, compact_obs=compact)
        rb = ReplayBuffer(TensorStorage(512), SliceSampler(slice_len=8), batch_size=64)
        for _ in range(4):
            rb.extend(col.rollout())
        col.shutdown()
        storages[compact] = rb
    torch.manual_seed(1)
    sample = storages[True].sample()
    assert sample.batch_size == (8, 8) and NEXT_OBS not in sample.keys(True)
    out = NextStateReconstructor()(sample)
    known = out[NEXT_OBS_KNOWN].squeeze(-1)
    assert not known[:, -1].any() and known[:, :-1].all()  # slices never cross an episode end
    truth = storages[False][out["index"].reshape(-1)].reshape(8, 8)
    assert torch.equal(out[NEXT_OBS][known], truth[NEXT_OBS][known])
    # a uniform (flat) sample: neighbours in the batch are not neighbours in time
    flat = storages[True][torch.tensor([5, 6, 40, 3, 4])]
    flat["index"] = torch.tensor([5, 6, 40, 3, 4])
    flags = NextStateReconstructor()(flat)[NEXT_OBS_KNOWN].squeeze(-1).tolist()
    assert flags[1:] == [False, False, flags[3], False] and flags[3] == (
        not bool(flat["next", "done"][3]))


# ----------------------------------------------------------------------------- estimators
def _hand_batch(last_terminated=True, dtype=torch.float32):
    """Two trajectories: steps 0-1 (terminated at 1), steps 2-4 (ended at 4)."""
    obs = torch.tensor([1, 2, 3, 4, 5], dtype=dtype)[:, None]
    done = torch.tensor([0, 1, 0, 0, 1], dtype=torch.bool)[:, None]
    term = torch.tensor([0, 1, 0, 0, int(last_terminated)], dtype=torch.bool)[:, None]
    return TensorDict({"observation": obs, "next": {
        "reward": torch.ones(5, 1), "done": done, "terminated": term, "truncated": done & ~term}},
        batch_size=[5])


def _identity_value():
    lin = torch.nn.Linear(1, 1)
    with torch.no_grad():
        lin.weight.fill_(1.0), lin.bias.zero_()
    return TensorDictModule(lambda x: lin(x.float()), ["observation"], ["state_value"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.uint8])
@pytest.mark.parametrize("shifted", [False, True])
def test_hand_computed_targets_on_a_compact_batch(dtype, shifted):
    # V(s) = s, gamma = lambda = 0.5; rebuilt next obs: [2, ?, 4, 5, ?] (? after terminations:
    # NaN for floats, 0 for uint8 -- a finite value only the obs_known flag marks as unknown)
    # deltas: [1 + 1 - 1, 1 - 2, 1 + 2 - 3, 1 + 2.5 - 4, 1 - 5] = [1, -1, 0, -0.5, -4]
    # GAE (gamma * lambda = 0.25): A = [0.75, -1, -0.375, -1.5, -4]; target = A + V
    net = _identity_value()
    batch = NextStateReconstructor()(_hand_batch(dtype=dtype))
    kw = dict(shifted=shifted)
    gae = GAE(0.5, 0.5, net, **kw)(batch.clone())
    assert gae["advantage"].squeeze(-1).tolist() == [0.75, -1.0, -0.375, -1.5, -4.0]
    assert gae["value_target"].squeeze(-1).tolist() == [1.75, 1.0, 2.625, 2.5, 1.0]
    td0 = TD0(0.5, net, **kw)(batch.clone())
    assert td0["value_target"].squeeze(-1).tolist() == [2.0, 1.0, 3.0, 3.5, 1.0]
    tdl = TDLambda(0.5, 0.5, net, **kw)(batch.clone())
    assert tdl["value_target"].squeeze(-1).tolist() == [1.75, 1.0, 2.625, 2.5, 1.0]


@pytest.mark.parametrize("estimator", [
    lambda net, **kw: GAE(0.5, 0.5, net, **kw),
    lambda net, **kw: TDLambda(0.5, 0.5, net, **kw),
    lambda net, **kw: TD0(0.5, net, **kw),
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.uint8])
def test_a_truncated_end_of_a_compact_batch_is_refused_naming_the_fixes(estimator, dtype):
    # uint8: the filled-in 0 gives a finite V, so only ("next", "obs_known") tells it apart
    batch = NextStateReconstructor()(_hand_batch(last_terminated=False, dtype=dtype))
    with pytest.raises(ValueError, match="compact_obs=False") as err:
        estimator(_identity_value())(batch.clone())
    assert "bootstrap_unknown" in str(err.value) and "1 step(s)" in str(err.value)
    # opting in bootstraps the truncated step from V(s_4) = 5: TD0 target 1 + 0.5 * 5
    out = estimator(_identity_value(), bootstrap_unknown="value")(batch.clone())
    assert out["value_target"][-1].item() == 3.5
    assert not torch.isnan(out["value_target"]).any()


def test_a_nan_next_value_after_termination_does_not_reach_td0():
    r = torch.tensor([[1.0], [2.0]])
    nv = torch.tensor([[float("nan")], [3.0]])
    term = torch.tensor([[True], [False]])
    assert td0_return(r, nv, term, 0.5).squeeze(-1).tolist() == [1.0, 3.5]


@pytest.mark.parametrize("estimator", [
    lambda net, **kw: GAE(0.99, 0.95, net, **kw),
    lambda net, **kw: TDLambda(0.99, 0.9, net, **kw),
    lambda net, **kw: TD0(0.99, net, **kw),
])
@pytest.mark.parametrize("shifted", [False, True])
def test_compact_targets_equal_plain_ones_on_real_cartpole_rollouts(estimator, shifted):
    plain, _ = _batch(lambda: _cartpole(3), False, 240)
    compact, keys = _batch(lambda: _cartpole(3), True, 240)
    compact = NextStateReconstructor(keys)(compact)
    net = _value_net(4)
    one_step = isinstance(estimator(net), TD0)
    a = estimator(net)(plain.clone())
    b = estimator(net, shifted=shifted, bootstrap_unknown="value")(compact.clone())
    # the plain path's targets read a next observation the compact batch has, or none at all
    # (termination), everywhere but on the trajectories cut by the end of the batch
    defined = _ends_in_termination(plain)
    if one_step:  # a one-step target needs only its own next observation
        defined = defined | compact[NEXT_OBS_KNOWN].squeeze(-1)
    assert defined.float().mean() > 0.5  # most of the batch is compared
    for key in ("advantage", "value_target"):
        torch.testing.assert_close(b[key][defined], a[key][defined], rtol=1e-5, atol=1e-5)
    # without the opt-in the cut trajectories are refused
    with pytest.raises(ValueError, match="did not terminate"):
        estimator(net)(compact.clone())


# ----------------------------------------------------------------------------- shifted, chunked
def _pendulum_with_truncations():
    env = GymEnv("Pendulum-v1", num_envs=2)
    env.set_seed(0)
    return env


@pytest.mark.parametrize("estimator", [
    lambda net, **kw: GAE(0.99, 0.95, net, **kw),
    lambda net, **kw: TDLambda(0.99, 0.9, net, **kw),
    lambda net, **kw: TD0(0.99, net, **kw),
])
def test_shifted_and_chunked_equal_the_two_pass_run(estimator):
    # Pendulum with max_frames_per_traj=7: truncations inside the batch, whose real next
    # observations the shifted pass must run on their own
    plain, _ = _batch(_pendulum_with_truncations, False, 40, max_frames_per_traj=7)
    assert int(plain["next", "truncated"][:, :-1].sum()) >= 4
    net = _value_net(3)
    ref = estimator(net)(plain.clone())
    for kw in (dict(shifted=True), dict(value_chunk_size=7), dict(shifted=True, value_chunk_size=3)):
        out = estimator(net, **kw)(plain.clone())
        for key in ("advantage", "value_target", "state_value"):
            torch.testing.assert_close(out[key], ref[key], rtol=1e-6, atol=1e-6, msg=str(kw))


def test_shifted_runs_the_value_net_on_t_plus_one_observations_and_chunks_cap_its_calls():
    plain, _ = _batch(_pendulum_with_truncations, False, 40)  # no truncation inside: T + 1
    rows = []
    net = _value_net(3)
    counting = TensorDictModule(lambda x: (rows.append(x.shape[:-1].numel()), net.module(x))[1],
                                ["observation"], ["state_value"])
    GAE(0.99, 0.95, counting)(plain.clone())
    assert sum(rows) == 2 * 40
    rows.clear()
    GAE(0.99, 0.95, counting, shifted=True)(plain.clone())
    assert sum(rows) == 2 * 21  # two envs x (T + 1)
    rows.clear()
    GAE(0.99, 0.95, counting, shifted=True, value_chunk_size=8)(plain.clone())
    assert max(rows) <= 8 and sum(rows) == 42


def test_estimator_options_are_checked_at_construction():
    with pytest.raises(ValueError, match="in_keys"):
        GAE(0.99, 0.95, lambda td: td, shifted=True)
    with pytest.raises(ValueError, match="value_chunk_size"):
        GAE(0.99, 0.95, _value_net(3), value_chunk_size=0)
    with pytest.raises(ValueError, match="bootstrap_unknown"):
        TD0(0.99, _value_net(3), bootstrap_unknown="zero")


@pytest.mark.parametrize("shifted", [False, True])
def test_differentiable_targets_on_a_compact_batch_have_the_gradients_of_their_formula(shifted):
    # unknown next observations are NaN: fed to the network they would make every weight
    # gradient NaN (0 * NaN through the masked rows); the estimator feeds zeros there instead
    torch.manual_seed(0)
    T = 6
    done = torch.zeros(2, T, 1, dtype=torch.bool)
    done[0, 2] = True  # terminated inside the batch; both rows are cut at the end
    td = TensorDict({"observation": torch.randn(2, T, 3), "next": {
        "reward": torch.randn(2, T, 1), "done": done, "terminated": done.clone()}}, [2, T])
    compact = NextStateReconstructor()(td.clone())
    # the same targets written out: next obs = obs[t + 1], and s_t itself where the batch is
    # cut (what bootstrap_unknown="value" means), no unknown entries left
    reference = td.clone()
    nxt = torch.cat([td["observation"][:, 1:], td["observation"][:, -1:]], 1)
    reference["next", "observation"] = nxt
    net = _value_net(3)

    def grads(batch, **kw):
        out = GAE(0.9, 0.9, net, differentiable=True, **kw)(batch)
        net.zero_grad()
        (out["value_target"] ** 2 + out["advantage"]).sum().backward()
        return [p.grad.clone() for p in net.parameters()]

    got = grads(compact, shifted=shifted, bootstrap_unknown="value")
    want = grads(reference)
    for g, w in zip(got, want):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


def test_reconstructor_on_split_trajectories_never_reads_the_padding():
    plain, _ = _batch(_cartpole, False, 120, split_trajs=False)
    compact, _ = _batch(_cartpole, True, 120, split_trajs=False)
    from tdrl.core.collectors import split_trajectories

    plain, compact = split_trajectories(plain), split_trajectories(compact)
    out = NextStateReconstructor()(compact)
    known = out[NEXT_OBS_KNOWN].squeeze(-1)
    real = out["collector", "mask"]
    lengths = real.sum(-1)
    assert (lengths < real.shape[-1]).any()  # some rows are padded
    expected = real.clone()
    expected[torch.arange(len(lengths)), lengths - 1] = False  # each trajectory's last step
    assert torch.equal(known, expected)
    assert torch.equal(out[NEXT_OBS][known], plain[NEXT_OBS][known])
