"""Decision Transformer training (Chen et al., 2021, arXiv:2106.01345): returns-to-go of a
transition dataset, windows of ``K`` consecutive steps of one episode (left-padded), and the
action-regression loss of :class:`~tdrl.core.modules.DecisionTransformer`."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDict, TensorDictBase
from torch import Tensor

from tdrl.core.objectives.common import LossModule
from tdrl.core.values._utils import NestedKey

__all__ = ["DTKeys", "DTLoss", "returns_to_go", "episode_timesteps", "sample_windows"]


def _check_episodes(episode: Tensor) -> None:
    if episode.dim() != 1:
        raise ValueError(f"episode ids must be 1-d [N], got shape {tuple(episode.shape)}.")
    if len(episode) > 1 and bool((episode[1:] < episode[:-1]).any()):
        raise ValueError("episode ids must be non-decreasing (each episode's steps contiguous, in order).")


def returns_to_go(reward: Tensor, episode: Tensor) -> Tensor:
    """Undiscounted return from each step to its episode's end, ``R_t = sum_{t' >= t} r_t'``.

    Args:
        reward: ``[N]`` (or ``[N, 1]``). episode: ``[N]`` non-decreasing episode ids.

    Returns:
        ``[N]`` (float64 sums, cast back to ``reward``'s dtype).
    """
    r = reward.reshape(-1).double()
    _check_episodes(episode)
    if r.shape != episode.shape:
        raise ValueError(f"returns_to_go: reward {tuple(reward.shape)} and episode {tuple(episode.shape)} differ in N.")
    new = torch.ones_like(episode, dtype=torch.bool)
    new[1:] = episode[1:] != episode[:-1]
    seg = new.long().cumsum(0) - 1  # 0, 1, ... per contiguous episode
    total = torch.zeros(int(seg[-1]) + 1 if len(seg) else 0, dtype=r.dtype).index_add_(0, seg, r)
    before = r.cumsum(0) - r  # sum of the earlier steps, all episodes
    start = before[new][seg]  # ... up to the episode's first step
    return (total[seg] - (before - start)).to(reward.dtype)


def episode_timesteps(episode: Tensor) -> Tensor:
    """Step index of each transition within its episode, ``[N]`` long."""
    _check_episodes(episode)
    idx = torch.arange(len(episode))
    new = torch.ones_like(episode, dtype=torch.bool)
    new[1:] = episode[1:] != episode[:-1]
    first = idx[new][new.long().cumsum(0) - 1]
    return idx - first


def sample_windows(data: TensorDictBase, context: int, batch_size: int,
                   generator: torch.Generator | None = None) -> TensorDict:
    """``batch_size`` windows of up to ``context`` consecutive steps of one episode.

    Each window starts at a uniformly drawn transition and runs forward within its episode;
    shorter windows (near an episode's end) are right-padded (``mask`` False, zeros). The
    transformer is causal and has no in-window position embedding, so a right-padded window
    predicts its real steps exactly as the short window alone would, without an attention
    mask for the padding.

    Args:
        data: ``[N]`` with ``observation``, ``action``, ``returns_to_go`` ``[N, 1]``,
            ``timestep`` ``[N]`` and ``episode`` ``[N]`` (non-decreasing).
        context: window length ``K``. batch_size: windows.

    Returns:
        ``[batch_size, K]`` with the same keys and ``mask`` (True for real steps).
    """
    if context < 1 or batch_size < 1:
        raise ValueError(f"sample_windows: context={context} and batch_size={batch_size} must be >= 1.")
    n = data.shape[0]
    episode = data["episode"]
    start = torch.randint(0, n, (batch_size,), generator=generator)
    src = start[:, None] + torch.arange(context)
    inside = src.clamp(max=n - 1)
    mask = (src < n) & (episode[inside] == episode[start][:, None])  # episodes are contiguous
    out = {}
    for key in ("observation", "action", "returns_to_go", "timestep"):
        x = data[key][inside]
        out[key] = x * mask.reshape(*mask.shape, *([1] * (x.dim() - 2))).to(x.dtype)
    out["mask"] = mask
    return TensorDict(out, batch_size=[batch_size, context])


@dataclass
class DTKeys:
    """Keys read by :class:`DTLoss` (a ``[B, T]`` window batch)."""

    observation: NestedKey = "observation"
    action: NestedKey = "action"
    returns_to_go: NestedKey = "returns_to_go"
    timestep: NestedKey = "timestep"
    mask: NestedKey = "mask"


class DTLoss(LossModule):
    """Mean squared error between the transformer's predicted actions and the dataset's,
    over the real (unpadded) steps of each window (the paper's continuous-action loss).

    Args:
        model: a :class:`~tdrl.core.modules.DecisionTransformer`.

    Returns ``loss_actor`` and the diagnostic ``action_error`` (mean absolute error).
    """

    Keys = DTKeys

    def __init__(self, model, check_finite: bool = False) -> None:
        super().__init__(check_finite)
        self.model = model

    def forward(self, td: TensorDictBase) -> TensorDict:
        action = self._get(td, "action")
        mask = self._get(td, "mask").bool()
        pred = self.model(self._get(td, "returns_to_go"), self._get(td, "observation"), action,
                          self._get(td, "timestep"), mask)
        w = mask.unsqueeze(-1).to(pred.dtype)
        count = w.sum().clamp_min(1.0) * pred.shape[-1]
        err = pred - action
        return self._output({"loss_actor": (err.pow(2) * w).sum() / count,
                             "action_error": (err.abs() * w).sum() / count})
