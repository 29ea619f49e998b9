"""Evaluation episodes of a policy, shared by the single-agent apps."""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from tensordict.nn import InteractionType, set_interaction_type

__all__ = ["evaluate_episodes", "evaluate_per_env", "episode_returns"]


@torch.no_grad()
def evaluate_episodes(env, policy, episodes: int, seed: int, close: bool = True) -> float:
    """Mean return of the first episode of each sub-env of ``env`` under the deterministic
    policy (the mode / mean of its distribution).

    Args:
        env: a batched env of batch size ``(episodes,)`` with a ``RewardSum`` transform
            (``("next", "episode_reward")``).
        policy: a TensorDict policy.
        episodes: number of sub-envs (= episodes).
        seed: seed of the evaluation envs.
        close: close ``env`` at the end.

    Returns:
        The mean of the first finished episode's return of each sub-env.
    """
    return float(evaluate_per_env(env, policy, episodes, seed, close).mean())


@torch.no_grad()
def evaluate_per_env(env, policy, episodes: int, seed: int | None, close: bool = True) -> torch.Tensor:
    """The return of the first episode of each sub-env of ``env`` under the deterministic
    policy, ``[episodes]``.

    Args:
        env, policy, episodes, close: as :func:`evaluate_episodes`.
        seed: seed of the evaluation envs (sub-env ``i`` gets ``seed + i``); None: ``env`` is
            seeded already (e.g. per seed block by :meth:`tdrl.core.train.SeedAxis.evaluate`).

    Returns:
        ``[episodes]`` returns, in sub-env order.
    """
    from tdrl.core import step_mdp

    if tuple(env.batch_size) != (episodes,):
        raise ValueError(f"evaluate_episodes: env batch size {tuple(env.batch_size)} != ({episodes},).")
    if seed is not None:
        env.set_seed(seed)
    td = env.reset()
    finished = torch.zeros(episodes, dtype=torch.bool)
    returns = torch.zeros(episodes)
    with set_interaction_type(InteractionType.DETERMINISTIC):
        while not bool(finished.all()):
            td = env.step(policy(td))
            done = td["next", "done"].squeeze(-1)
            first = done & ~finished
            returns[first] = td["next", "episode_reward"].squeeze(-1)[first]
            finished |= done
            td = step_mdp(td)
            if bool(done.any()):
                td["_reset"] = done.unsqueeze(-1)
                td = env.reset(td).exclude("_reset")
    if close:
        env.close()
    return returns


def episode_returns(batch: TensorDictBase) -> list[float]:
    """Returns of the episodes that end in a collected batch (``RewardSum``'s
    ``("next", "episode_reward")`` where ``("next", "done")``)."""
    done = batch["next", "done"]
    return batch["next", "episode_reward"][done].tolist()
