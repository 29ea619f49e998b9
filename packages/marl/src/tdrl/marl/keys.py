"""Keys of the multi-agent data contract (docs/ARCHITECTURE.md), on top of :mod:`tdrl.core.keys`.

Multi-agent data lives under a group key (``"agents"`` by default) with the agent dim right
after the batch dims: ``("agents", "observation")`` is ``(*batch, n_agents, ...)``, per-agent
rewards are ``("next", "agents", "reward")`` ``(*batch, n_agents, 1)``. Global done flags are
at the root ``(*batch, 1)``; per-agent ones, where the env has them, under the group.
"""

from __future__ import annotations

from tdrl.core.keys import (  # noqa: F401  (re-exported for convenience)
    ACTION,
    ACTION_LOG_PROB,
    ACTION_MASK,
    ACTION_VALUE,
    ADVANTAGE,
    DONE,
    GROUP,
    IS_INIT,
    NEXT,
    OBSERVATION,
    REWARD,
    STATE_VALUE,
    TERMINATED,
    TRUNCATED,
    VALUE_TARGET,
)

MASK = "mask"
"""``(group, "mask")``: bool ``(*batch, n_agents)``, True where the agent takes part in the step."""
STATE = "state"
"""Global state (``(*batch, state_dim)``) read by centralised mixers; defaults to all observations."""
CHOSEN_ACTION_VALUE = "chosen_action_value"
INFO = "info"

__all__ = [name for name in dir() if name.isupper()]
