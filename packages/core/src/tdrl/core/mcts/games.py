"""A batched tic-tac-toe with cloneable TensorDict states, and AlphaZero-style model adapters.

The game is a pure function of its state: :meth:`TicTacToe.step` returns a new state and
never mutates its input, so the search can keep every node's state in the tree. Boards are
*canonical*: ``+1`` marks the stones of the player to move, ``-1`` the opponent's, so a value
or policy net sees the position from the mover's side.

:func:`simulator_model` turns a game and an evaluator ``state -> (prior_logits, value)`` into
the ``(root_fn, recurrent_fn)`` pair the search expects (AlphaZero: perfect simulator + net).
:class:`RolloutEvaluator` is the classic pure-MCTS evaluator: uniform priors and the outcome of
a uniformly random playout.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from tensordict import TensorDict, TensorDictBase
from torch import Tensor

from .tree import RecurrentOutput, RootOutput

Evaluator = Callable[[TensorDictBase], tuple[Tensor, Tensor]]

_LINES = (
    (0, 1, 2), (3, 4, 5), (6, 7, 8),  # rows
    (0, 3, 6), (1, 4, 7), (2, 5, 8),  # columns
    (0, 4, 8), (2, 4, 6),  # diagonals
)  # fmt: skip


class TicTacToe:
    """Batched tic-tac-toe on ``[B, 9]`` canonical boards (cells numbered row by row).

    State TensorDict, batch ``[B]``:
      * ``"board"`` ``[B, 9]`` float32 — ``+1`` player to move, ``-1`` opponent, ``0`` empty;
      * ``"player"`` ``[B]`` int64 — who is to move: ``+1`` for X (moves first), ``-1`` for O;
      * ``"done"`` ``[B]`` bool — the game is over;
      * ``"winner"`` ``[B]`` int64 — ``+1`` X won, ``-1`` O won, ``0`` draw / not over.

    Playing an occupied cell loses the game for the mover; acting in a finished game changes
    nothing and earns 0.
    """

    num_actions = 9

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.lines = torch.tensor(_LINES, dtype=torch.int64, device=self.device)

    def reset(self, batch_size: int) -> TensorDict:
        """``batch_size`` empty boards with X to move."""
        return TensorDict(
            {
                "board": torch.zeros(batch_size, 9, device=self.device),
                "player": torch.ones(batch_size, dtype=torch.int64, device=self.device),
                "done": torch.zeros(batch_size, dtype=torch.bool, device=self.device),
                "winner": torch.zeros(batch_size, dtype=torch.int64, device=self.device),
            },
            batch_size=[batch_size],
            device=self.device,
        )

    def from_strings(self, boards: list[str]) -> TensorDict:
        """States from 9-character strings of ``X``, ``O`` and ``.`` (row by row).

        The player to move is X when both have as many stones, else O.
        """
        cells = []
        for text in boards:
            text = text.replace(" ", "").replace("\n", "")
            if len(text) != 9 or set(text) - set("XO."):
                raise ValueError(f"a board is 9 characters of 'X', 'O', '.', got {text!r}")
            cells.append([1.0 if c == "X" else -1.0 if c == "O" else 0.0 for c in text])
        absolute = torch.tensor(cells, device=self.device)  # +1 X, -1 O
        n_x, n_o = (absolute == 1).sum(-1), (absolute == -1).sum(-1)
        if not bool(((n_x == n_o) | (n_x == n_o + 1)).all()):
            raise ValueError(f"X moves first: need #X == #O or #O + 1 in {boards}")
        player = torch.where(n_x == n_o, 1, -1).to(torch.int64)
        state = self.reset(len(boards))
        state["board"] = absolute * player[:, None]
        state["player"] = player
        won = self._wins(absolute).long() - self._wins(-absolute).long()
        state["winner"] = won.to(torch.int64)
        state["done"] = (won != 0) | (absolute != 0).all(-1)
        return state

    def _wins(self, board: Tensor) -> Tensor:
        """``[B]`` bool: the ``+1`` stones of ``board`` ``[B, 9]`` complete a line."""
        return (board[:, self.lines].sum(-1) == 3).any(-1)

    def legal_actions(self, state: TensorDictBase) -> Tensor:
        """``[B, 9]`` bool: empty cells of unfinished games."""
        return (state["board"] == 0) & ~state["done"][:, None]

    def step(self, state: TensorDictBase, action: Tensor) -> tuple[TensorDict, Tensor, Tensor]:
        """Play ``action`` ``[B]`` in every game; the input state is left untouched.

        Returns:
            ``(next_state, reward [B], done [B])``; the reward is the mover's: ``+1`` for a
            win, ``-1`` for an illegal move, else ``0``.
        """
        board, done, player = state["board"], state["done"], state["player"]
        action = action.long()
        if action.shape != done.shape:
            raise ValueError(f"action must be [B]={tuple(done.shape)}, got {tuple(action.shape)}")
        empty = board.gather(1, action[:, None]).squeeze(1) == 0
        legal = empty & ~done
        illegal = ~empty & ~done
        placed = torch.where(legal[:, None], board.scatter(1, action[:, None], 1.0), board)
        win = self._wins(placed) & legal
        full = (placed != 0).all(-1)
        reward = win.to(board.dtype) - illegal.to(board.dtype)
        next_done = done | win | illegal | (full & legal)
        winner = torch.where(win, player, state["winner"])
        winner = torch.where(illegal, -player, winner)
        next_state = TensorDict(
            {
                "board": torch.where(legal[:, None], -placed, board),
                "player": torch.where(legal, -player, player),
                "done": next_done,
                "winner": winner,
            },
            batch_size=state.batch_size,
            device=state.device,
        )
        return next_state, reward, next_done

    @staticmethod
    def render(state: TensorDictBase, index: int = 0) -> str:
        """The board of game ``index`` as three lines of ``X``, ``O`` and ``.``."""
        absolute = state["board"][index] * state["player"][index]
        chars = ["X" if v > 0 else "O" if v < 0 else "." for v in absolute.tolist()]
        return "\n".join("".join(chars[r * 3 : r * 3 + 3]) for r in range(3))


def simulator_model(
    game: TicTacToe, evaluate: Evaluator
) -> tuple[Callable[[TensorDictBase], RootOutput], Callable[..., RecurrentOutput]]:
    """AlphaZero-style model: the game is the dynamics, ``evaluate`` the prior/value net.

    Args:
        game: a batched game with ``step``, ``legal_actions`` (e.g. :class:`TicTacToe`).
        evaluate: ``state [B] -> (prior_logits [B, A], value [B])``, value seen by the
            player to move.

    Returns:
        ``(root_fn, recurrent_fn)``: ``root_fn(state) -> RootOutput`` and
        ``recurrent_fn(state, action) -> RecurrentOutput`` (search with ``two_player=True``).
    """

    def root_fn(state: TensorDictBase) -> RootOutput:
        logits, value = evaluate(state)
        return RootOutput(logits, value, state, ~game.legal_actions(state))

    def recurrent_fn(state: TensorDictBase, action: Tensor) -> RecurrentOutput:
        next_state, reward, done = game.step(state, action)
        logits, value = evaluate(next_state)
        value = value.masked_fill(done, 0.0)
        discount = (~done).to(reward.dtype)
        return RecurrentOutput(
            next_state, reward, discount, logits, value, ~game.legal_actions(next_state)
        )

    return root_fn, recurrent_fn


class RolloutEvaluator:
    """Pure-MCTS evaluator: uniform prior logits and one uniformly random playout per state.

    Args:
        game: a batched two-player game (:class:`TicTacToe`).
        generator: optional generator for the playouts.
        max_moves: playout length cap (9 is enough for tic-tac-toe).
    """

    def __init__(
        self, game: TicTacToe, generator: torch.Generator | None = None, max_moves: int = 9
    ) -> None:
        self.game, self.generator, self.max_moves = game, generator, max_moves

    def __call__(self, state: TensorDictBase) -> tuple[Tensor, Tensor]:
        board = state["board"]
        logits = torch.zeros(board.shape[0], self.game.num_actions, device=board.device)
        value = torch.zeros(board.shape[0], device=board.device)
        sign = 1.0  # +1 when the mover is the player to move at ``state``
        for _ in range(self.max_moves):
            legal = self.game.legal_actions(state)
            if not bool(legal.any()):
                break
            noise = torch.rand(legal.shape, device=board.device, generator=self.generator)
            action = noise.masked_fill(~legal, -1.0).argmax(-1)
            state, reward, _ = self.game.step(state, action)
            value = value + sign * reward
            sign = -sign
        return logits, value
