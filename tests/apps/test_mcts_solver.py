"""apps/mcts: the exact tic-tac-toe solver, the board symmetries and the FPU Q-transform."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

_APP_DIR = Path(__file__).resolve().parents[2] / "apps" / "mcts"


def _load(name: str, filename: str):
    spec = importlib.util.spec_from_file_location(name, _APP_DIR / filename)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def app():
    return _load("_mcts_app_solver", "train.py")


@pytest.fixture(scope="module")
def solver():
    from tdrl.core.mcts.tictactoe_solver import Solver

    return Solver()


def test_position_counts_and_opening_values(solver):
    # 5,478 legal positions, 958 of them finished (626 X wins, 316 O wins, 16 full draws).
    assert solver.boards.shape == (4520, 9)
    empty = torch.zeros(1, 9)
    assert solver.value(empty).item() == 0.0  # a draw under perfect play
    assert solver.action_values(empty).tolist() == [[0.0] * 9]  # every opening move draws


def test_hand_solved_positions(solver):
    game = solver.game
    state = game.from_strings(["XX.OO....", "XX.OO.X..", "X...O...X", "XO.......", "X........"])
    value = solver.value(state["board"]).tolist()
    # X completes the top row; O (to move) completes the middle row; the O-centre, X-corners
    # position is drawn; X in the corner, O on the adjacent edge loses; O must take the centre.
    assert value == [1.0, 1.0, 0.0, 1.0, 0.0]
    optimal = solver.optimal_actions(state["board"])
    assert optimal[0].nonzero().flatten().tolist() == [2]
    assert optimal[1].nonzero().flatten().tolist() == [5]
    assert optimal[2].nonzero().flatten().tolist() == [1, 3, 5, 7]  # an edge, not a corner
    assert optimal[4].nonzero().flatten().tolist() == [4]
    q = solver.action_values(state["board"])
    # Occupied; blocking O instead of winning draws; ignoring both loses.
    assert q[0, 0].isnan() and q[0, 5].item() == 0.0 and q[0, 6].item() == -1.0


def test_blunders_of_a_perfect_and_a_careless_player(solver):
    positions = solver.all_positions()
    assert int(positions["player"].eq(1).sum()) == 2423  # X to move (as many stones)

    def perfect(state):
        return solver.optimal_actions(state["board"]).float().argmax(-1)

    def first_empty(state):
        return (state["board"] == 0).float().argmax(-1)

    assert not solver.blunders(perfect)["blunder"].any()
    careless = solver.blunders(first_empty)
    assert careless["losing"].any() and not careless["losing"][careless["value"] < 0].any()
    empty = solver.game.reset(1)
    assert solver.blunders(first_empty, empty)["blunder"].tolist() == [False]


def test_symmetries_map_lines_to_lines(app, solver):
    perms = app.SYMMETRIES
    assert perms.shape == (8, 9)
    assert len({tuple(p.tolist()) for p in perms}) == 8
    rows_cols = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8)]
    lines = set(rows_cols + [(0, 4, 8), (2, 4, 6)])
    for perm in perms.tolist():
        inverse = {old: new for new, old in enumerate(perm)}
        assert {tuple(sorted(inverse[c] for c in line)) for line in lines} == lines
    boards = solver.boards
    q = solver.action_values(boards)
    for perm in perms:
        image = boards.gather(1, perm.expand_as(boards))
        assert torch.equal(solver.value(image), solver.value(boards))
        # The image's action values are the board's, moved with the cells.
        moved = q.gather(1, perm.expand_as(q))
        assert torch.equal(solver.action_values(image).nan_to_num(9), moved.nan_to_num(9))


def test_fpu_search_finds_the_win_the_prior_ignores(app, solver):
    """A prior sure of a losing move: mctx's min-completion never tries the win, FPU does."""
    from tdrl.core.mcts import muzero_policy, simulator_model

    game = solver.game
    state = game.from_strings(["XX.XXOOO."])  # O to move: 8 wins, 2 loses to X's 8
    assert solver.optimal_actions(state["board"])[0].nonzero().flatten().tolist() == [8]

    def evaluate(s):  # prior: 0.98 on cell 2 wherever it is empty, value 0
        logits = torch.where(s["board"] == 0, 0.0, -1e9)
        logits[:, 2] += 6.0
        return logits, torch.zeros(s["board"].shape[0])

    root_fn, recurrent_fn = simulator_model(game, evaluate)
    actions = {}
    for name in ("parent_and_siblings", "fpu"):
        out = muzero_policy(
            root_fn(state), recurrent_fn, 32, two_player=True, dirichlet_fraction=0.0,
            qtransform=app.QTRANSFORMS[name], temperature=0.0,
        )  # fmt: skip
        actions[name] = out["action"].item()
    assert actions == {"parent_and_siblings": 2, "fpu": 8}
