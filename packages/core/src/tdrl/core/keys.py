"""Canonical TensorDict keys of the tdrl data contract (see docs/ARCHITECTURE.md, "Data contract").

Keys follow TorchRL so that code ports and outputs can be compared one to one.
Step ``t`` lives at the root, step ``t+1`` under ``"next"``; time is the last batch dim.
Reward and done flags have a trailing dim of 1; done flags are ``torch.bool``.
"""

from __future__ import annotations

NEXT = "next"
OBSERVATION = "observation"
ACTION = "action"
ACTION_LOG_PROB = "action_log_prob"
ACTION_MASK = "action_mask"
STATE_VALUE = "state_value"
STATE_ACTION_VALUE = "state_action_value"
ACTION_VALUE = "action_value"
LOGITS = "logits"
LOC = "loc"
SCALE = "scale"
IS_INIT = "is_init"
REWARD = "reward"
DONE = "done"
TERMINATED = "terminated"
TRUNCATED = "truncated"
ADVANTAGE = "advantage"
VALUE_TARGET = "value_target"
STEP_COUNT = "step_count"
EPISODE_REWARD = "episode_reward"
TRAJ_ID = ("collector", "traj_ids")
PRIORITY = "priority"
INDEX = "index"
OBS_KNOWN = "obs_known"  # under "next": the next observation was rebuilt (compact path)
STEPS_TO_NEXT_OBS = "steps_to_next_obs"  # n-step data: the steps to the bootstrap observation
ORIGINAL_REWARD = "original_reward"  # n-step data, under "next": the one-step reward
GROUP = "agents"

DONE_KEYS = (DONE, TERMINATED, TRUNCATED)
NEXT_REWARD = (NEXT, REWARD)
NEXT_DONE = (NEXT, DONE)
NEXT_TERMINATED = (NEXT, TERMINATED)
NEXT_TRUNCATED = (NEXT, TRUNCATED)
NEXT_OBSERVATION = (NEXT, OBSERVATION)
NEXT_OBS_KNOWN = (NEXT, OBS_KNOWN)



def next_key(key: str | tuple) -> tuple:
    """``("next", *key)``: where step ``t+1``'s value of ``key`` lives (a string or a tuple)."""
    return (NEXT, key) if isinstance(key, str) else (NEXT, *key)


__all__ = [name for name in dir() if name.isupper()] + ["next_key"]
