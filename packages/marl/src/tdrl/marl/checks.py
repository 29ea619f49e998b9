"""Checks that a multi-agent method can learn from what the env gives it.

:class:`TeamRewardCheck`: value-decomposition methods (QMIX, VDN; Rashid et al., 2018,
arXiv:1803.11485) learn one team value from the team reward, the mean of the group's
rewards. In a zero-sum game whose players share a group (PettingZoo's ``tictactoe_v3``:
+1 for the winner, -1 for the loser) that mean is always 0: the loss trains on a constant
and nothing is learnt, without any error. The check watches the first batches and raises
:class:`ZeroTeamRewardError` when every rewarded transition has a team reward of exactly 0.
"""

from __future__ import annotations

from torch import Tensor

__all__ = ["TeamRewardCheck", "ZeroTeamRewardError", "env_name"]


class ZeroTeamRewardError(ValueError):
    """The agents' rewards cancel in the team reward: a mixer has nothing to learn from."""


def env_name(env) -> str:
    """A readable name of ``env`` (its task or scenario; looks through a ``SerialEnv``)."""
    inner = getattr(env, "envs", None)
    if inner:
        env = inner[0]
    for attr in ("task", "scenario_name"):
        name = getattr(env, attr, None)
        if isinstance(name, str):
            return name
    return type(env).__name__


class TeamRewardCheck:
    """Refuse a team reward that is identically zero while the agents' rewards are not.

    Feed it each collected batch with :meth:`update`. It decides once it has seen
    ``min_events`` transitions where some agent of the group got a non-zero reward: if the
    team reward was 0 (up to ``rtol`` of the largest agent reward) in all of them, it raises;
    if not, it stops checking. After ``max_batches`` batches without enough rewarded
    transitions it stops checking as well.

    Args:
        algorithm: the method's name, for the message (``"QMIX"``).
        group: the agent group.
        env: the env (its task name goes into the message).
        min_events: rewarded transitions needed before deciding.
        max_batches: batches to look at at most.
        rtol: a team reward below ``rtol * max_i |r_i|`` counts as cancelled.
    """

    def __init__(self, algorithm: str, group: str, env, min_events: int = 8, max_batches: int = 50,
                 rtol: float = 1e-6) -> None:
        self.algorithm, self.group, self.env = algorithm, group, env_name(env)
        self.min_events, self.max_batches, self.rtol = min_events, max_batches, rtol
        self.events = self.cancelled = self.batches = 0
        self.active = True
        self.example: list[float] | None = None

    def update(self, agent_reward: Tensor, team_reward: Tensor) -> None:
        """Look at one batch.

        Args:
            agent_reward: ``[*B, n_agents, 1]`` (or ``[*B, n_agents]``), the group's rewards.
            team_reward: ``[*B, 1]`` (or ``[*B]``), the reward the loss trains on.

        Raises:
            ZeroTeamRewardError: see the class docstring; the message names the game and
                what to do instead.
        """
        if not self.active:
            return
        self.batches += 1
        n = team_reward.numel()
        r = agent_reward.detach().reshape(n, -1).float()
        team = team_reward.detach().reshape(n).float()
        scale = r.abs().amax(-1)
        rewarded = scale > 0
        self.events += int(rewarded.sum())
        cancelled = rewarded & (team.abs() <= self.rtol * scale)
        self.cancelled += int(cancelled.sum())
        if self.example is None and bool(cancelled.any()):
            self.example = r[cancelled.nonzero()[0, 0]].tolist()
        if self.cancelled < self.events:  # a real team signal: fine
            self.active = False
        elif self.events >= self.min_events:
            raise ZeroTeamRewardError(self._message())
        elif self.batches >= self.max_batches:
            self.active = False

    def _message(self) -> str:
        return (
            f"{self.algorithm} on {self.env!r} (group {self.group!r}): the team reward, the mean of the "
            f"group's rewards, was exactly 0 in all {self.events} transitions where an agent was rewarded "
            f"(e.g. agent rewards {self.example}): the agents' rewards cancel, as in a zero-sum game "
            "between members of one group, so the mixer trains on a constant and learns nothing. "
            "Put each player (or team) in its own group (e.g. PettingZooEnv(..., group_map={'player_1': "
            "['player_1'], 'player_2': ['player_2']}), trained with make_groups), or use per-agent "
            "learning (IPPO). To train anyway, set TrainConfig.check_team_reward=False."
        )
