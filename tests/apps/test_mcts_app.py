"""apps/mcts/train.py --tiny: self-play, training and evaluation run end to end."""

from __future__ import annotations

import csv
import importlib.util
import sys
import json
from pathlib import Path

import pytest

_APP = Path(__file__).resolve().parents[2] / "apps" / "mcts" / "train.py"


def _load_app():
    spec = importlib.util.spec_from_file_location("_mcts_app", _APP)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("search", ["puct", "gumbel"])
def test_tiny_alphazero_run(tmp_path, search):
    app = _load_app()
    cfg = app.parse_args(["--tiny", "--search", search, "--out", str(tmp_path)])
    summary = app.main(cfg)
    rows = list(csv.DictReader(open(tmp_path / "metrics.csv")))
    assert len(rows) == cfg.iterations == 2
    assert (tmp_path / "learning_curve.png").stat().st_size > 10_000
    assert (tmp_path / "model.pt").exists()
    assert json.loads((tmp_path / "summary.json").read_text())["final"]["iteration"] == 2
    final = summary["final"]
    for prefix in ("vs_random", "vs_mcts"):
        total = final[f"{prefix}_win"] + final[f"{prefix}_draw"] + final[f"{prefix}_loss"]
        assert total == pytest.approx(1.0)
    # Even an untrained net with 8 simulations of search (it sees wins/losses one move
    # ahead) should rarely lose to a uniformly random player.
    assert final["vs_random_win"] + final["vs_random_draw"] >= 0.75
    assert int(rows[-1]["positions"]) > int(rows[0]["positions"]) > 0


def test_short_run_learns_to_avoid_losing_moves(tmp_path):
    """Fixed seed, 20 small iterations: the search stops playing into lost positions.

    ``losing_moves`` counts, over all 4,520 unfinished positions, the moves that turn a won
    or drawn position into a lost one (exact minimax values). The untrained net's search
    (16 simulations) plays ~500 of them.
    """
    app = _load_app()
    cfg = app.parse_args([
        "--iterations", "20", "--games", "64", "--num_simulations", "16", "--eval_every", "100",
        "--eval_games", "40", "--eval_simulations", "16", "--pure_mcts_simulations", "16",
        "--out", str(tmp_path),
    ])  # fmt: skip
    final = app.main(cfg)["final"]
    assert final["losing_moves"] <= 60, final
    assert final["net_losing_moves"] <= 250, final
    assert final["vs_random_loss"] <= 0.05 and final["vs_random_win"] >= 0.8, final


@pytest.mark.parametrize("value_mix", [0.0, 0.5])
def test_self_play_value_targets_are_the_movers_outcome(value_mix):
    """A scripted game (first empty cell): X wins on the 2-4-6 diagonal at ply 7."""
    import torch
    from tensordict import TensorDict

    app = _load_app()
    cfg = app.Config(games=2, random_plies=0, value_mix=value_mix)
    game = app.TicTacToe()

    def first_empty(state, noise, temperature, num_simulations):  # the search's signature
        n = state.shape[0]
        action = (state["board"] == 0).float().argmax(-1)  # the first empty cell
        target, root_value = torch.zeros(n, 9), torch.full((n,), 0.2)
        return TensorDict(
            {"action": action, app.POLICY_TARGET: target, app.ROOT_VALUE: root_value},
            batch_size=[n],
        )

    data = app.self_play(cfg, game, first_empty, torch.Generator().manual_seed(0))
    assert data.shape == (14,)
    outcome = torch.tensor([1.0, -1.0] * 3 + [1.0]).repeat_interleave(2)  # X, O, ... X to move
    expected = (1 - value_mix) * outcome + value_mix * 0.2
    torch.testing.assert_close(data["value_target"], expected)


def test_config_rejects_unknown_search():
    app = _load_app()
    with pytest.raises(ValueError, match="--search"):
        app.Config(search="alphago")
