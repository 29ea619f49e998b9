"""tdrl's NextObservationDelta equal to TorchRL 0.14.1's on the same real rollout: a CartPole
rollout (2 envs, seed 0, episode ends inside) recorded by tdrl, played back to each library's
Gymnasium wrapper through a ``TransformedEnv`` with each one's ``NextObservationDelta`` (env
side: the stored float16 delta, the full next observation gone from the stored steps), then
each one's transform on the stored batch (replay side: the rebuilt next observation). Runs
where TorchRL is installed (``/work/venvs/bench``)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

pytest.importorskip("torchrl")
rl = pytest.importorskip("torchrl.envs")
rl_t = pytest.importorskip("torchrl.envs.transforms")
rl_gym = pytest.importorskip("torchrl.envs.libs.gym")

from tdrl.core.collectors import Collector  # noqa: E402
from tdrl.core.envs import GymEnv, GymWrapper  # noqa: E402
from tdrl.core.transforms import NextObservationDelta, TransformedEnv  # noqa: E402

NEXT_OBS, DELTA = ("next", "observation"), ("next", "delta", "observation")


def _recorded(frames=240):
    torch.manual_seed(0)
    col = Collector(GymEnv("CartPole-v1", num_envs=2), None, frames_per_batch=frames, seed=0)
    try:
        return col.rollout()
    finally:
        col.shutdown()


class _Playback(gym.Env):
    """One sub-env of a recorded rollout, played back: ``reset`` gives the observation where the
    current episode starts (idempotent), ``step`` the recorded next observation and flags."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, rec) -> None:
        self.obs = rec["observation"].numpy()
        self.next_obs = rec[NEXT_OBS].numpy()
        self.reward = rec["next", "reward"].squeeze(-1).numpy()
        self.term = rec["next", "terminated"].squeeze(-1).numpy()
        self.trunc = rec["next", "truncated"].squeeze(-1).numpy()
        self.t = 0

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return self.obs[self.t].copy(), {}

    def step(self, action):
        t = self.t
        self.t += 1
        return (self.next_obs[t].copy(), float(self.reward[t]), bool(self.term[t]),
                bool(self.trunc[t]), {})


def test_same_stored_delta_and_rebuilt_next_obs_as_torchrl():
    rec = _recorded()
    T = rec.shape[-1]
    done = rec["next", "done"].squeeze(-1)
    assert done[:, :-1].sum() >= 3  # several episode ends inside the rollout
    for i in range(2):
        theirs_env = rl.TransformedEnv(rl_gym.GymWrapper(_Playback(rec[i])), rl_t.NextObservationDelta())
        ours_env = TransformedEnv(GymWrapper(_Playback(rec[i])), NextObservationDelta())
        theirs = theirs_env.rollout(T, break_when_any_done=False)
        ours = ours_env.rollout(T, break_when_any_done=False)
        # both replayed the recorded trajectory (resets included) and stored it the same way
        assert torch.equal(ours["observation"], rec[i]["observation"])
        assert torch.equal(theirs["observation"], rec[i]["observation"])
        assert NEXT_OBS not in ours.keys(True) and NEXT_OBS not in theirs.keys(True)
        assert ("delta", "observation") not in ours.keys(True)
        assert ("delta", "observation") not in theirs.keys(True)
        assert ours[DELTA].dtype == theirs[DELTA].dtype == torch.float16
        assert torch.equal(ours[DELTA], theirs[DELTA])
        # replay side: each library's transform on its stored batch
        mine = NextObservationDelta(["observation"])(ours.clone())[NEXT_OBS]
        their = rl_t.NextObservationDelta(["observation"])(theirs.clone())[NEXT_OBS]
        assert mine.dtype == their.dtype == torch.float32
        assert torch.equal(mine, their)
        # and both within float16's round-off of the real next observation, at episode ends too
        true_next = rec[i][NEXT_OBS]
        err = (mine - true_next).abs()
        assert bool((err <= (true_next - rec[i]["observation"]).abs() * 2.0 ** -11 + 2.0 ** -25
                     + true_next.abs() * 2.0 ** -23).all())
        ends = done[i]
        if ends.any():
            assert (mine[ends] - true_next[ends]).abs().max() < 1e-3
