"""Agent grouping and action checks shared by the multi-agent env wrappers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from ..keys import GROUP

__all__ = ["group_agents", "check_group_action", "GroupMap"]

GroupMap = str | Mapping[str, Sequence[str]] | None


def _prefix(name: str) -> str:
    """``"adversary_0" -> "adversary"``, ``"agent_12" -> "agent"``, ``"player" -> "player"``."""
    head, sep, tail = name.rpartition("_")
    return head if sep and tail.isdigit() else name


def group_agents(names: Sequence[str], group_map: GroupMap = None) -> dict[str, list[str]]:
    """Split agent names into groups.

    Args:
        names: the agents, in the env's order.
        group_map: ``None`` or ``"one"``: every agent in one group ``"agents"``;
            ``"prefix"``: one group per name prefix (``"adversary_0"`` -> ``"adversary"``);
            a mapping ``{group: [agent names]}`` covering every agent exactly once.

    Returns:
        ``{group: [agent names]}`` in a stable order.
    """
    names = list(names)
    if group_map is None or group_map == "one":
        return {GROUP: names}
    if group_map == "prefix":
        out: dict[str, list[str]] = {}
        for n in names:
            out.setdefault(_prefix(n), []).append(n)
        return out
    if isinstance(group_map, str):
        raise ValueError(f"group_map must be None, 'one', 'prefix' or a dict; got {group_map!r}.")
    out = {g: list(a) for g, a in group_map.items()}
    seen = [a for agents in out.values() for a in agents]
    if sorted(seen) != sorted(names):
        raise ValueError(
            f"group_map must list every agent exactly once; agents are {names}, "
            f"group_map lists {seen}."
        )
    return out


def check_group_action(group: str, action: torch.Tensor | None, expected: torch.Size) -> torch.Tensor:
    """Raise an error naming the group and both shapes when ``action`` does not fit its spec."""
    if action is None:
        raise KeyError(
            f"step() needs the action of group {group!r} under ({group!r}, 'action') with shape "
            f"{tuple(expected)}; it is missing."
        )
    if action.shape != expected:
        raise ValueError(
            f"The action of group {group!r} has shape {tuple(action.shape)}, but the group's "
            f"action spec expects {tuple(expected)} (batch dims, n_agents, action dims). Check "
            "the policy's output size and that it was built for this env."
        )
    return action
