"""apps/mcts/train.py --tiny: self-play, training and evaluation run end to end."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from _load import load_app, read_rows


def _load_app():
    return load_app("mcts")


@pytest.mark.parametrize("search", ["puct", "gumbel"])
def test_tiny_alphazero_run(tmp_path, search):
    app = _load_app()
    cfg = app.main.load([f"search={search}", f"out={tmp_path}"], recipe="tiny")
    summary = app.train(cfg)
    rows = read_rows(tmp_path / "metrics.csv")
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
    assert float(rows[-1]["positions"]) > float(rows[0]["positions"]) > 0


def test_short_run_learns_to_avoid_losing_moves(tmp_path):
    """Fixed seed, 20 small iterations: the search stops playing into lost positions.

    ``losing_moves`` counts, over all 4,520 unfinished positions, the moves that turn a won
    or drawn position into a lost one (exact minimax values). The untrained net's search
    (16 simulations) plays ~500 of them.
    """
    app = _load_app()
    cfg = app.main.load([
        "iterations=20", "games=64", "num_simulations=16", "eval_every=100", "eval_games=40",
        "eval_simulations=16", "pure_mcts_simulations=16", f"out={tmp_path}", "progress=false",
    ])  # fmt: skip
    final = app.train(cfg)["final"]
    assert final["losing_moves"] <= 60, final
    assert final["net_losing_moves"] <= 250, final
    assert final["vs_random_loss"] <= 0.05 and final["vs_random_win"] >= 0.8, final


@pytest.mark.parametrize("value_mix", [0.0, 0.5])
def test_self_play_value_targets_are_the_movers_outcome(value_mix):
    """A scripted game (first empty cell): X wins on the 2-4-6 diagonal at ply 7."""
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
    with pytest.raises(ValueError, match="search"):
        app.Config(search="alphago")
    with pytest.raises(ValueError, match="eval_games"):
        app.main.load(["eval_games=3"])


def test_resumed_run_equals_the_uninterrupted_one(tmp_path):
    """Interrupted after iteration 1 and resumed: the same metrics and the same final net as
    the run that never stopped (net, optimiser, replay and generator come from the checkpoint)."""
    app = _load_app()
    full, part = tmp_path / "full", tmp_path / "part"
    app.train(app.main.load([f"out={full}"], recipe="tiny"))
    (part / "checkpoints").mkdir(parents=True)
    shutil.copy(full / "checkpoints" / "step_1.pt", part / "checkpoints")
    shutil.copy(full / "metrics.csv", part / "metrics.csv")
    app.train(app.main.load([f"out={part}", "resume=true"], recipe="tiny"))
    a, b = read_rows(full / "metrics.csv"), read_rows(part / "metrics.csv")
    assert [{k: v for k, v in r.items() if k != "time_s"} for r in a] == \
        [{k: v for k, v in r.items() if k != "time_s"} for r in b]
    wa, wb = torch.load(full / "model.pt", weights_only=True), torch.load(part / "model.pt", weights_only=True)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
