"""NextObservationDelta (issue 43's lossy compact variant, issue 40's transform name): the stored
float16 delta and the rebuilt next observation computed by hand, its round-off stated and
asserted, episode ends (the delta is the real last transition, not the reset), a replay buffer
that rebuilds on sample, and the refusals (bad dtypes, non-float keys, overflow, a mismatched
delta) raised before any work."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdrl.core.collectors import Collector
from tdrl.core.envs import GymEnv
from tdrl.core.replay import ReplayBuffer, SamplerWithoutReplacement, TensorStorage
from tdrl.core.transforms import (
    Compose,
    DTypeCastTransform,
    NextObservationDelta,
    StepCounter,
    TransformedEnv,
)
from tdrl.core.transforms.delta import next_from_delta, observation_delta

F16_REL = 2.0 ** -11  # float16 keeps 11 significant bits: relative round-off <= 2**-11
F16_SUB = 2.0 ** -25  # below 2**-14 float16 is subnormal: absolute round-off <= 2**-25


def test_delta_and_rebuild_by_hand():
    obs = torch.tensor([[1.0, 2.0, -3.0]])
    nxt = torch.tensor([[1.1, 1000.5, -3.0]])
    delta = observation_delta(obs, nxt, torch.float16)
    # 1.1f - 1.0f = 0.10000002 -> nearest float16 0.0999755859375 (= 819 / 8192); 998.5 is a
    # float16 (its spacing is 0.5 in [512, 1024)); 0 stays 0
    assert delta.dtype == torch.float16
    assert delta.tolist() == [[0.0999755859375, 998.5, 0.0]]
    rebuilt = next_from_delta(obs, delta, torch.float32)
    assert rebuilt.dtype == torch.float32
    assert rebuilt.tolist() == [[1.0999755859375, 1000.5, -3.0]]
    err = (rebuilt - nxt).abs()
    assert float(err[0, 0]) == pytest.approx(2.44e-5, rel=1e-2)  # lossy: 1.1 comes back 2.4e-5 low
    assert bool((err <= (nxt - obs).abs() * F16_REL + 1e-6).all())


def test_transform_on_a_tensordict_by_hand():
    t = NextObservationDelta(["observation"])
    root = TensorDict(observation=torch.tensor([[0.5, -0.25]]), batch_size=[1])
    nxt = TensorDict(observation=torch.tensor([[0.75, 0.5]]), reward=torch.ones(1, 1), batch_size=[1])
    nxt = t._step(root, nxt)
    assert nxt["delta", "observation"].tolist() == [[0.25, 0.75]]  # exact in float16
    batch = root.clone().set("next", nxt.exclude("observation").clone())
    out = t(batch)
    assert out["next", "observation"].tolist() == [[0.75, 0.5]]
    assert ("next", "delta") not in out.keys(True)  # drop_delta: the plain layout again
    kept = NextObservationDelta(["observation"], drop_delta=False, restore_dtype=torch.float64)(
        root.clone().set("next", nxt.exclude("observation").clone()))
    assert kept["next", "observation"].dtype == torch.float64
    assert kept["next", "delta", "observation"].tolist() == [[0.25, 0.75]]


def _collect(transform, frames=200):
    env = GymEnv("CartPole-v1", num_envs=2)
    if transform is not None:
        env = TransformedEnv(env, transform)
    torch.manual_seed(0)
    col = Collector(env, None, frames_per_batch=frames, seed=3)
    try:
        return col.rollout(), env
    finally:
        col.shutdown()


def test_collected_delta_against_the_plain_rollout_across_episode_ends():
    plain, _ = _collect(None)
    packed, env = _collect(NextObservationDelta())
    assert env.transform[0].in_keys == ["observation"]  # found from the spec (float32)
    assert env.step_only_keys == ["reward", "delta"] and env.unstored_next_keys == ["observation"]
    keys = set(packed.keys(True, True))
    assert ("next", "observation") not in keys and ("delta", "observation") not in keys
    assert ("next", "delta", "observation") in keys
    # the policy side saw full precision: the same roots as the plain run
    assert torch.equal(packed["observation"], plain["observation"])
    assert torch.equal(packed["next", "done"], plain["next", "done"])
    obs, true_next = plain["observation"], plain["next", "observation"]
    delta = packed["next", "delta", "observation"]
    assert delta.dtype == torch.float16 and torch.equal(delta, (true_next - obs).half())
    rebuilt = NextObservationDelta(["observation"])(packed.clone())["next", "observation"]
    assert torch.equal(rebuilt, obs + delta.float())
    err = (rebuilt - true_next).abs()
    bound = (true_next - obs).abs() * F16_REL + F16_SUB + true_next.abs() * 2.0 ** -23  # + float32 ops
    assert bool((err <= bound).all()) and float(err.max()) > 0  # lossy, within the bound
    # episode ends: the delta is the last real transition (CartPole's final state), not the
    # jump to the reset observation that follows in the root
    done = plain["next", "done"].squeeze(-1)
    env_i, t = done[:, :-1].nonzero()[0].tolist()
    assert done.sum() >= 2 and plain["next", "terminated"].any()
    assert torch.equal(delta[env_i, t], (true_next[env_i, t] - obs[env_i, t]).half())
    assert (rebuilt[env_i, t] - true_next[env_i, t]).abs().max() < 1e-3
    assert (rebuilt[env_i, t] - obs[env_i, t + 1]).abs().max() > 1e-2


def test_replay_buffer_rebuilds_on_sample():
    packed, _ = _collect(NextObservationDelta(), frames=64)
    plain, _ = _collect(None, frames=64)
    rb = ReplayBuffer(TensorStorage(64), SamplerWithoutReplacement(), batch_size=16,
                      transform=NextObservationDelta(["observation"]))
    rb.extend(packed.reshape(-1))
    torch.manual_seed(0)
    sample = rb.sample()
    want = plain.reshape(-1)[sample["index"]]
    assert ("next", "delta") not in sample.keys(True)
    torch.testing.assert_close(sample["next", "observation"], want["next", "observation"],
                               rtol=0, atol=2e-3)
    assert torch.equal(sample["next", "observation"],
                       want["observation"] + (want["next", "observation"] - want["observation"]).half().float())


def test_refusals_before_any_work():
    with pytest.raises(ValueError, match="delta_dtype must be a floating dtype"):
        NextObservationDelta(delta_dtype=torch.int16)
    with pytest.raises(ValueError, match="restore_dtype"):
        NextObservationDelta(restore_dtype=torch.int64)
    # a key the env does not observe, and an integer observation: refused when joining the env
    with pytest.raises(ValueError, match="'pixels' is not an observation"):
        TransformedEnv(GymEnv("CartPole-v1"), NextObservationDelta(["pixels"]))
    with pytest.raises(ValueError, match="has dtype torch.int64; only floating"):
        TransformedEnv(GymEnv("CartPole-v1"), Compose(
            DTypeCastTransform(torch.float32, torch.int64, in_keys=["observation"]),
            NextObservationDelta(["observation"])))
    # keys found from the spec skip integer observations (StepCounter's step_count)
    env = TransformedEnv(GymEnv("CartPole-v1"), Compose(StepCounter(), NextObservationDelta()))
    assert env.transform[1].in_keys == ["observation"]
    # replay side: no keys, a missing pair, a delta of another dtype or shape
    batch = TensorDict(observation=torch.zeros(4, 3), batch_size=[4])
    batch["next", "delta", "observation"] = torch.zeros(4, 3, dtype=torch.float32)
    with pytest.raises(ValueError, match="no in_keys to rebuild"):
        NextObservationDelta()(batch.clone())
    with pytest.raises(ValueError, match=r"is torch.float32 of shape \(4, 3\); expected torch.float16"):
        NextObservationDelta(["observation"])(batch.clone())
    batch["next", "delta", "observation"] = torch.zeros(4, 2, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"expected torch.float16 of shape \(4, 3\)"):
        NextObservationDelta(["observation"])(batch.clone())
    with pytest.raises(KeyError, match="neither"):
        NextObservationDelta(["observation"])(TensorDict(observation=torch.zeros(4, 3), batch_size=[4]))
    # an overflowing delta would be stored as inf: refused, naming a wider dtype
    t = NextObservationDelta(["observation"])
    root = TensorDict(observation=torch.tensor([[0.0]]), batch_size=[1])
    with pytest.raises(ValueError, match="overflows torch.float16"):
        t._step(root, TensorDict(observation=torch.tensor([[7.0e4]]), batch_size=[1]))
    wide = NextObservationDelta(["observation"], delta_dtype=torch.bfloat16)
    assert wide._step(root, TensorDict(observation=torch.tensor([[7.0e4]]), batch_size=[1]))[
        "delta", "observation"].item() == 70144.0  # bfloat16: range kept, 8 bits of precision


def test_check_env_specs_knows_the_stored_layout():
    """The env's fake TensorDict describes a stored step (a float16 delta, no full next
    observation), so TorchRL's habit of running ``check_env_specs`` holds on both paths."""
    from tdrl.core import check_env_specs

    env = TransformedEnv(GymEnv("CartPole-v1", num_envs=2), Compose(StepCounter(), NextObservationDelta()))
    fake = env.fake_tensordict()
    assert fake["next", "delta", "observation"].dtype == torch.float16
    assert ("next", "observation") not in fake.keys(True) and ("next", "step_count") in fake.keys(True)
    check_env_specs(env, max_steps=30, seed=0)
    check_env_specs(env, max_steps=30, seed=0, break_when_any_done=True)


def test_inside_a_batched_env_refused_outside_it_works():
    from tdrl.core.envs import SerialEnv

    def inner():
        return TransformedEnv(GymEnv("Pendulum-v1"), NextObservationDelta())

    with pytest.raises(ValueError, match="Put the transform outside"):
        SerialEnv(2, inner)
    env = TransformedEnv(SerialEnv(2, lambda: GymEnv("Pendulum-v1")), NextObservationDelta())
    torch.manual_seed(0)
    batch = env.rollout(5, break_when_any_done=False)
    assert batch["next", "delta", "observation"].shape == (2, 5, 3)
    assert ("next", "observation") not in batch.keys(True)
    step = batch["observation"][:, 1:] - batch["observation"][:, :-1]
    assert torch.equal(batch["next", "delta", "observation"][:, :-1], step.half())
    env.close()
