"""The cue task of the recurrent MARL tests (shared by test_recurrent.py and test_recurrent_learning.py)."""

from __future__ import annotations

import torch
from tensordict import TensorDict

from tdrl.core.envs import EnvBase
from tdrl.core.specs import Categorical, Composite, Unbounded


class CueEnv(EnvBase):
    """Each of 2 agents sees a random cue (one-hot) at the first step only and is rewarded 1 at
    the third step for playing it back: a memoryless policy earns 0.5 on average."""

    L = 3

    def __init__(self, num_envs: int, seed: int) -> None:
        super().__init__(batch_size=(num_envs,))
        b, n = self.batch_size, 2
        self.observation_spec = Composite(
            {"agents": Composite({"observation": Unbounded((*b, n, 3))}, shape=(*b, n)),
             "cue": Unbounded((*b, n), dtype=torch.int64), "t": Unbounded((*b, 1), dtype=torch.int64)}, shape=b)
        self.full_action_spec = Composite({"agents": Composite({"action": Categorical(2, (*b, n))}, shape=(*b, n))},
                                          shape=b)
        self.full_reward_spec = Composite({"agents": Composite({"reward": Unbounded((*b, n, 1))}, shape=(*b, n))},
                                          shape=b)
        self._gen = torch.Generator().manual_seed(seed)

    def _obs(self, cue, t):
        onehot = torch.nn.functional.one_hot(cue, 2).float() * (t == 0).float().unsqueeze(-1)
        last = (t == self.L - 1).float().unsqueeze(-1).expand(*cue.shape, 1)
        return torch.cat([onehot, last], -1)

    def _reset(self, tensordict, **kwargs):
        cue = torch.randint(0, 2, (*self.batch_size, 2), generator=self._gen)
        t = torch.zeros(*self.batch_size, 1, dtype=torch.int64)
        f = torch.zeros(*self.batch_size, 1, dtype=torch.bool)
        return TensorDict({("agents", "observation"): self._obs(cue, t), "cue": cue, "t": t,
                           "done": f, "terminated": f.clone(), "truncated": f.clone()}, batch_size=self.batch_size)

    def _step(self, td):
        cue, t, act = td["cue"], td["t"], td["agents", "action"]
        reward = ((act == cue) & (t == self.L - 1)).float().unsqueeze(-1)
        t = t + 1
        done = t >= self.L
        return TensorDict({("agents", "observation"): self._obs(cue, t), "cue": cue, "t": t,
                           ("agents", "reward"): reward, "done": done, "terminated": done.clone(),
                           "truncated": torch.zeros_like(done)}, batch_size=self.batch_size)

    def _set_seed(self, seed):
        self._gen.manual_seed(seed)
        return seed + 1
