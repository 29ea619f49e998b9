"""tdrl's NextStateReconstructor equal to TorchRL 0.14.1's on the same stored compact data: a real
CartPole rollout (2 envs, episode ends inside) collected with ``compact_obs=True``, and slices
sampled from a compact replay buffer. TorchRL's transform takes a flat ``(B,)`` sample, so the
``[2, T]`` / ``[num_slices, slice_len]`` batches are flattened for it (its trajectory-id check
separates the rows). Unknown next observations are NaN on both sides.

One difference, named and tested: tdrl also requires consecutive replay indices (``"index"``),
so two slices of the same episode placed side by side in a sample are never joined; TorchRL
joins them unless given a ``step_count_key`` -- with ``step_count_key="index"`` the two agree.
Runs where TorchRL is installed (``/work/venvs/bench``)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("torchrl")
rl_rb = pytest.importorskip("torchrl.envs.transforms.rb_transforms")

from tdrl.core.collectors import Collector  # noqa: E402
from tdrl.core.envs import GymEnv  # noqa: E402
from tdrl.core.keys import NEXT_OBS_KNOWN  # noqa: E402
from tdrl.core.replay import (  # noqa: E402
    NextStateReconstructor,
    ReplayBuffer,
    SliceSampler,
    TensorStorage,
)

NEXT_OBS = ("next", "observation")


def _compact_rollout(frames: int):
    torch.manual_seed(0)
    env = GymEnv("CartPole-v1", num_envs=2)
    env.set_seed(0)
    col = Collector(env, None, frames_per_batch=frames, compact_obs=True)
    try:
        return col.rollout()
    finally:
        col.shutdown()


def _torchrl_rebuild(batch, **kw):
    """TorchRL's reconstructor on the flattened batch, reshaped back."""
    flat = batch.clone().reshape(-1)
    out = rl_rb.NextStateReconstructor(["observation"], **kw)(flat)
    return out[NEXT_OBS].reshape(*batch.batch_size, -1)


def test_rebuilt_rollout_equals_torchrl_nan_at_the_same_ends():
    compact = _compact_rollout(120)
    assert compact.batch_size == (2, 60) and NEXT_OBS not in compact.keys(True)
    done = compact["next", "done"].squeeze(-1)
    assert done.sum() >= 4  # several episode ends inside the rollout
    theirs = _torchrl_rebuild(compact)
    ours = NextStateReconstructor()(compact.clone())
    torch.testing.assert_close(ours[NEXT_OBS], theirs, rtol=0, atol=0, equal_nan=True)
    unknown = ~ours[NEXT_OBS_KNOWN].squeeze(-1)
    assert torch.equal(unknown, theirs.isnan().all(-1))
    assert unknown[done].all() and unknown[:, -1].all()
    assert unknown.sum() == done[:, :-1].sum() + 2


def test_rebuilt_slices_equal_torchrl_with_a_step_check_and_differ_without_one():
    rb = ReplayBuffer(TensorStorage(480), SliceSampler(slice_len=4), batch_size=400)
    rb.extend(_compact_rollout(480))
    torch.manual_seed(1)
    sample = rb.sample()  # 100 slices of 4 over ~20 episodes: neighbouring slices of one episode
    assert sample.batch_size == (100, 4)
    ours = NextStateReconstructor()(sample.clone())[NEXT_OBS]
    with_step = _torchrl_rebuild(sample, step_count_key="index")
    torch.testing.assert_close(ours, with_step, rtol=0, atol=0, equal_nan=True)
    assert ours[:, -1].isnan().all() and not ours[:, :-1].isnan().any()
    # without a step check TorchRL joins a slice's end to the next slice of the same episode
    plain = _torchrl_rebuild(sample)
    same_traj = sample["collector", "traj_ids"].reshape(-1)
    ends = torch.arange(3, 399, 4)
    joined = (same_traj[ends] == same_traj[ends + 1]) & ~sample["next", "done"].reshape(-1)[ends]
    assert joined.any()
    flat_plain = plain.reshape(400, -1)
    assert not flat_plain[ends[joined]].isnan().any()
    obs = sample["observation"].reshape(400, -1)
    torch.testing.assert_close(flat_plain[ends[joined]], obs[ends[joined] + 1])
    rest = ~torch.isin(torch.arange(400), ends[joined])  # everywhere else the two agree
    torch.testing.assert_close(ours.reshape(400, -1)[rest], flat_plain[rest],
                               rtol=0, atol=0, equal_nan=True)
