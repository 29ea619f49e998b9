"""The batched tic-tac-toe simulator and the pure-MCTS rollout evaluator."""

from __future__ import annotations

import pytest
import torch

from tdrl.core.mcts import RolloutEvaluator, TicTacToe


def test_step_win_draw_illegal_and_absorbing():
    game = TicTacToe()
    state = game.from_strings(["XX.OO....", "XOXXOOOX.", "XO.......", "XXXOO...."])
    assert state["done"].tolist() == [False, False, False, True]
    assert state["winner"].tolist() == [0, 0, 0, 1]
    assert state["player"].tolist() == [1, 1, 1, -1]
    before = state.clone()
    nxt, reward, done = game.step(state, torch.tensor([2, 8, 1, 5]))
    # The input state is untouched (the search keeps every node's state).
    assert (state == before).all()
    # 0: X completes the top row; 1: last cell, a draw; 2: occupied cell -> X loses;
    # 3: the game was over -> nothing changes.
    assert reward.tolist() == [1.0, 0.0, -1.0, 0.0]
    assert done.tolist() == [True, True, True, True]
    assert nxt["winner"].tolist() == [1, 0, -1, 1]
    # The board flips to the next player's view after a legal move only.
    assert nxt["board"][0].tolist() == [-1, -1, -1, 1, 1, 0, 0, 0, 0]
    assert nxt["player"].tolist() == [-1, -1, 1, -1]
    assert game.render(nxt, 0) == "XXX\nOO.\n..."


def test_legal_actions_and_board_checks():
    game = TicTacToe()
    state = game.from_strings(["XO.......", "XXXOO...."])
    assert game.legal_actions(state)[0].tolist() == [False, False] + [True] * 7
    assert not game.legal_actions(state)[1].any()
    with pytest.raises(ValueError, match="9 characters"):
        game.from_strings(["XO"])
    with pytest.raises(ValueError, match="X moves first"):
        game.from_strings(["OO......."])


def test_rollout_value_is_the_outcome_for_the_player_to_move():
    game = TicTacToe()
    boards = [
        "XX.OOXOXO",  # X to move, only cell 2 left, it completes the top row: +1
        "XOXXOOOX.",  # X to move, only cell 8 left, no line: draw, 0
        "XX.OO.XOX",  # O to move, cells 2 and 5: O at 5 wins (+1); O at 2, X at 5: draw (0)
        "XXXOO....",  # finished: 0
    ]
    state = game.from_strings(boards)
    assert state["player"].tolist() == [1, 1, -1, -1]
    values = torch.stack(
        [RolloutEvaluator(game, torch.Generator().manual_seed(seed))(state)[1] for seed in range(200)]
    )
    assert values[:, 0].eq(1).all() and values[:, 1].eq(0).all() and values[:, 3].eq(0).all()
    assert set(values[:, 2].tolist()) == {0.0, 1.0}
    assert values[:, 2].mean().item() == pytest.approx(0.5, abs=0.1)
    logits, _ = RolloutEvaluator(game)(state)
    assert logits.shape == (4, 9) and (logits == 0).all()  # uniform priors
