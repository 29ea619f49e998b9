"""Exact tic-tac-toe values by minimax, to measure how far a player is from perfect play.

Tic-tac-toe has 5,478 legal positions (4,520 with a move to make), so the whole game is solved
in a fraction of a second and stored as lookup tables indexed by the base-3 code of the
*canonical* board (``+1`` the player to move, ``-1`` the opponent, ``0`` empty; the layout of
:class:`tdrl.core.mcts.TicTacToe`).

* :class:`Solver` — ``value`` (game-theoretic outcome for the player to move, ``+1`` / ``0`` /
  ``-1``) and ``action_values`` (the outcome after each move) of batched boards.
* :meth:`Solver.all_positions` — every reachable unfinished position as a game state, the test
  set of :meth:`Solver.blunders`.
* :meth:`Solver.blunders` — which moves of a player lower the game-theoretic value. A player
  that blunders in none of the 4,520 positions can never lose, whoever it plays.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

import torch
from tensordict import TensorDict, TensorDictBase
from torch import Tensor

from tdrl.core.mcts import TicTacToe

_LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))
_POWERS = torch.tensor([3**i for i in range(9)], dtype=torch.int64)
_CODES = 3**9


def _won(board: tuple[int, ...], who: int) -> bool:
    return any(all(board[i] == who for i in line) for line in _LINES)


def _child(board: tuple[int, ...], action: int) -> tuple[int, ...]:
    """The canonical board after the mover plays ``action``, seen by the next mover."""
    return tuple(-1 if i == action else -c for i, c in enumerate(board))


@lru_cache(maxsize=None)
def _action_value(board: tuple[int, ...], action: int) -> int:
    """Outcome for the mover of playing the empty cell ``action`` on an unfinished board."""
    child = _child(board, action)
    if _won(child, -1):
        return 1
    if all(child):
        return 0
    return -max(_action_value(child, a) for a in range(9) if child[a] == 0)


def _code(board: tuple[int, ...]) -> int:
    return sum((c + 1) * 3**i for i, c in enumerate(board))


def encode(board: Tensor) -> Tensor:
    """Base-3 codes ``[B]`` int64 of canonical boards ``[B, 9]`` (values in {-1, 0, 1})."""
    return ((board.round().long() + 1) * _POWERS.to(board.device)).sum(-1)


class Solver:
    """Game-theoretic values of every tic-tac-toe position (for the player to move)."""

    def __init__(self) -> None:
        self.game = TicTacToe()
        # q[code, a]: outcome of move a for the mover; nan when illegal / finished.
        q = torch.full((_CODES, 9), float("nan"))
        boards: list[tuple[int, ...]] = []
        seen: set[tuple[int, ...]] = set()
        frontier = [(0,) * 9]
        while frontier:  # every reachable unfinished position, breadth first
            board = frontier.pop()
            if board in seen:
                continue
            seen.add(board)
            boards.append(board)
            for a in range(9):
                if board[a] == 0:
                    child = _child(board, a)
                    q[_code(board), a] = _action_value(board, a)
                    if not _won(child, -1) and not all(child):
                        frontier.append(child)
        self.q = q
        self.boards = torch.tensor(sorted(boards), dtype=torch.float32)  # [4520, 9]

    def action_values(self, board: Tensor) -> Tensor:
        """``[B, 9]`` outcome of each move on canonical boards ``[B, 9]`` (nan: illegal)."""
        return self.q[encode(board)]

    def value(self, board: Tensor) -> Tensor:
        """``[B]`` outcome for the player to move under perfect play, on boards ``[B, 9]``."""
        q = self.action_values(board)
        if bool(q.isnan().all(-1).any()):
            raise ValueError("value() needs reachable unfinished boards (a legal move to make)")
        return q.nan_to_num(-2.0).amax(-1)

    def optimal_actions(self, board: Tensor) -> Tensor:
        """``[B, 9]`` bool: the moves that keep the game-theoretic value."""
        q = self.action_values(board)
        return q == self.value(board)[:, None]

    def all_positions(self) -> TensorDict:
        """The 4,520 reachable unfinished positions as a :class:`TicTacToe` state ``[4520]``."""
        stones = (self.boards != 0).sum(-1)
        player = torch.where(stones % 2 == 0, 1, -1).to(torch.int64)
        state = self.game.reset(self.boards.shape[0])
        state["board"] = self.boards.clone()
        state["player"] = player
        return state

    def blunders(
        self, player: Callable[[TensorDictBase], Tensor], state: TensorDictBase | None = None
    ) -> dict[str, Tensor]:
        """Where ``player`` (``state [B] -> action [B]``) plays a move that lowers the value.

        Args:
            player: a batched player, e.g. the search agent with no noise.
            state: positions to test (default :meth:`all_positions`).

        Returns:
            dict with ``"blunder"`` ``[B]`` bool (the move loses value: a won position drawn
            or lost, a drawn one lost), ``"losing"`` ``[B]`` bool (the move turns a won or
            drawn position into a lost one), ``"value"`` ``[B]`` (before the move) and
            ``"action"`` ``[B]``.
        """
        state = self.all_positions() if state is None else state
        action = player(state)
        q = self.action_values(state["board"])
        value = self.value(state["board"])
        after = q.gather(1, action[:, None]).squeeze(1).nan_to_num(-1.0)  # illegal loses
        return {
            "blunder": after < value,
            "losing": (after < 0) & (value >= 0),
            "value": value,
            "action": action,
        }
