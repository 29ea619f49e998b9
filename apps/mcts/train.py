"""AlphaZero (Silver et al., 2018) self-play on tic-tac-toe, with tdrl's batched MCTS.

A linear script built from :mod:`tdrl.core.mcts` parts: the batched :class:`TicTacToe`
(cloneable TensorDict states) is the perfect simulator, a small MLP gives prior logits and a
value, and :func:`muzero_policy` (PUCT + Dirichlet root noise) or
:func:`gumbel_muzero_policy` searches all live games at once. Each iteration plays
``games`` self-play games in one batch (each opening with 0-4 uniformly random moves), stores
(board, search policy, value target) in a replay TensorDict, and trains the net with policy
cross-entropy + value MSE on a random one of the board's 8 symmetries of each position. The
value target mixes the game's outcome and the search's root value. Every ``eval_every``
iterations it plays, with the search (no noise, most-visited move), against a uniformly
random player and a pure-MCTS player (UCB1 with random playouts), half the games as X, and
counts the moves of the search and of the net alone that turn a drawn or won position into a
lost one, over all 4,520 positions (exact values from :mod:`tictactoe_solver`).

    python apps/mcts/train.py                       # about three minutes on one CPU core
    python apps/mcts/train.py search=gumbel num_simulations=16
    python apps/mcts/train.py --config-name tiny    # a seconds-long smoke run (CI)
    python apps/mcts/train.py resume=true           # continue from the last checkpoint

Outputs in ``out`` (the run harness of ``tdrl.core.train``): ``config.yaml``,
``metrics.csv`` (one row per iteration), ``learning_curve.png``, ``summary.json``,
``model.pt`` and ``checkpoints/step_<iteration>.pt`` (net, optimiser, replay, RNG states):
a resumed run continues exactly where the checkpoint left off.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from tensordict import TensorDict, TensorDictBase
from torch import nn

from tdrl.core.mcts import (
    POLICY_TARGET,
    ROOT_VALUE,
    RolloutEvaluator,
    TicTacToe,
    gumbel_muzero_policy,
    muzero_policy,
    node_batched,
    qtransform_by_min_max,
    qtransform_by_parent_and_siblings,
    search,
    simulator_model,
    ucb1_selection,
)
from tdrl.core.mcts.tictactoe_solver import Solver
from tdrl.core.train import ConfigError, GeneratorState, Run, RunConfig, StateBox, crossed, hydra_app

if TYPE_CHECKING:
    from tdrl.core.mcts.tree import NodeStats


@node_batched
def qtransform_fpu(stats: NodeStats) -> torch.Tensor:
    """Q-values in ``[-1, 1]`` mapped to ``[0, 1]``; an unvisited child scores the net's value.

    AlphaZero-style fixed bounds with a "first-play urgency": an unvisited move is assumed
    as good as the net's value of the position (``raw_value``), not lost. With mctx's default
    (:func:`qtransform_by_parent_and_siblings`, unvisited children score the minimum), once
    the prior puts ~0 on a move the move is never tried however bad the visited ones turn
    out, and 32 simulations miss immediate wins the net does not predict. (The node's mean
    value as the FPU follows the one visited move down and helps less.)

    Args:
        stats: the scored nodes (``Tree.node_stats``); values seen by the player to act.

    Returns:
        ``[B, *K, A]`` normalised Q-values.
    """
    qvalues = torch.where(stats.visits > 0, stats.qvalues, stats.raw_value[..., None])
    return (qvalues + 1) / 2


QTRANSFORMS = {
    "fpu": qtransform_fpu,
    "parent_and_siblings": qtransform_by_parent_and_siblings,
    "min_max": partial(qtransform_by_min_max, min_value=-1.0, max_value=1.0),
}


@dataclass
class Config(RunConfig):
    """AlphaZero / Gumbel MuZero self-play on tic-tac-toe with tdrl's batched MCTS."""

    iterations: int = 40
    """Self-play + training iterations (the run's step unit)."""
    games: int = 128
    """Self-play games per iteration, played as one batch."""
    search: str = "puct"
    """puct (AlphaZero) or gumbel (Gumbel MuZero)."""
    num_simulations: int = 32
    """Simulations per move in self-play."""
    dirichlet_alpha: float = 1.0
    """Root Dirichlet noise concentration (~10 / typical number of legal moves)."""
    dirichlet_fraction: float = 0.25
    """Weight of the root noise in the prior."""
    sample_moves: int = 4
    """Plies played with temperature 1, then the most visited move."""
    random_plies: int = 4
    """Each game opens with U{0..random_plies} uniformly random moves."""
    qtransform: str = "fpu"
    """puct only: fpu, parent_and_siblings (mctx's default) or min_max."""
    max_num_considered_actions: int = 9
    """gumbel only: actions sampled at the root."""
    replay_size: int = 20_000
    """Positions kept for training."""
    epochs: int = 4
    """Passes over the replay per iteration."""
    minibatch_size: int = 256
    """Positions per gradient step."""
    augment: bool = True
    """Train on a random one of the board's 8 symmetries of each position."""
    value_mix: float = 0.5
    """Value target: (1 - mix) * outcome + mix * search root value."""
    lr: float = 3e-3
    """AdamW learning rate (cosine decay to lr_final over the iterations)."""
    lr_final: float = 3e-4
    """Final learning rate."""
    weight_decay: float = 1e-4
    """AdamW weight decay."""
    hidden: int = 128
    """Hidden width of the policy-value MLP."""
    eval_every: int = 10
    """Iterations between evaluations (and the last iteration)."""
    checkpoint_every: int = 10
    """Iterations between checkpoints; 0: only at the end."""
    eval_games: int = 200
    """Games per evaluation match (half as X, half as O)."""
    eval_simulations: int = 32
    """Simulations per move of the evaluated search."""
    pure_mcts_simulations: int = 200
    """Simulations per move of the pure-MCTS opponent."""
    out: str = "runs/mcts"
    """Run folder (a new numbered one beside it if it holds an earlier run and resume is false)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.search not in ("puct", "gumbel"):
            raise ConfigError(f"Config.search={self.search!r} is not allowed: expected 'puct' or 'gumbel'.")
        if self.qtransform not in QTRANSFORMS:
            raise ConfigError(f"Config.qtransform={self.qtransform!r} is not allowed: expected one of "
                              f"{sorted(QTRANSFORMS)}.")
        if self.eval_games % 2 or self.eval_games < 2:
            raise ConfigError(f"Config.eval_games={self.eval_games} must be even and >= 2 (half as X, half as O).")
        for name in ("iterations", "games", "num_simulations", "epochs", "minibatch_size", "replay_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"Config.{name}={getattr(self, name)} is not allowed: expected an integer >= 1.")


def _symmetries() -> torch.Tensor:
    """``[8, 9]`` cell permutations of the board's symmetries (rotations, reflections).

    Row ``k`` maps a board to its ``k``-th image by ``board.gather(-1, perm)``: cell ``i`` of
    the image holds cell ``perm[i]`` of the board (the same gather maps a policy).
    """
    grid = torch.arange(9).view(3, 3)
    images = []
    for flip in (False, True):
        g = grid.t() if flip else grid
        for k in range(4):
            images.append(torch.rot90(g, k).reshape(9))
    return torch.stack(images)


SYMMETRIES = _symmetries()


class PolicyValueNet(nn.Module):
    """MLP on the canonical board: ``[B, 9]`` -> (prior logits ``[B, 9]``, value ``[B]``)."""

    def __init__(self, hidden: int = 128) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(27, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU()
        )
        self.policy = nn.Linear(hidden, 9)
        self.value = nn.Linear(hidden, 1)

    def forward(self, board: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        planes = torch.cat([board == 1, board == -1, board == 0], -1).float()
        h = self.body(planes)
        return self.policy(h), torch.tanh(self.value(h)).squeeze(-1)


def net_evaluator(net: PolicyValueNet):
    @torch.no_grad()
    def evaluate(state: TensorDictBase) -> tuple[torch.Tensor, torch.Tensor]:
        return net(state["board"])

    return evaluate


def make_agent(cfg: Config, game: TicTacToe, net: PolicyValueNet, generator: torch.Generator):
    """The search policy: ``(state [B], noise: bool, temperature) -> TensorDict [B]``."""
    root_fn, recurrent_fn = simulator_model(game, net_evaluator(net))

    def act(state: TensorDictBase, noise: bool, temperature: float, num_simulations: int):
        root = root_fn(state)
        if cfg.search == "gumbel":
            return gumbel_muzero_policy(
                root, recurrent_fn, num_simulations, two_player=True,
                max_num_considered_actions=cfg.max_num_considered_actions,
                gumbel_scale=1.0 if noise else 0.0, generator=generator,
            )  # fmt: skip
        return muzero_policy(
            root, recurrent_fn, num_simulations, two_player=True,
            dirichlet_alpha=cfg.dirichlet_alpha,
            dirichlet_fraction=cfg.dirichlet_fraction if noise else 0.0,
            qtransform=QTRANSFORMS[cfg.qtransform],
            temperature=temperature, generator=generator,
        )  # fmt: skip

    return act


def self_play(cfg: Config, game: TicTacToe, act, generator: torch.Generator) -> TensorDict:
    """Play ``cfg.games`` games at once; returns positions with policy and value targets.

    Every position gets the search's policy target; the game opens with a random number of
    uniformly random moves (``cfg.random_plies``), so that training also covers the
    positions a weak opponent leads to (self-play alone rarely leaves the main lines).
    """
    state = game.reset(cfg.games)
    random_plies = torch.randint(cfg.random_plies + 1, (cfg.games,), generator=generator)
    rand = random_player(game, generator)
    boards, targets, root_values, movers, game_ids = [], [], [], [], []
    ply = 0
    while not bool(state["done"].all()):
        live = (~state["done"]).nonzero().squeeze(-1)
        temperature = 1.0 if ply < cfg.sample_moves else 0.0
        out = act(state[live], noise=True, temperature=temperature, num_simulations=cfg.num_simulations)
        boards.append(state["board"][live])
        targets.append(out[POLICY_TARGET])
        root_values.append(out[ROOT_VALUE])
        movers.append(state["player"][live])
        game_ids.append(live)
        action = torch.zeros(cfg.games, dtype=torch.int64)
        opening = random_plies[live] > ply
        action[live] = torch.where(opening, rand(state[live]), out["action"])
        state, _, _ = game.step(state, action)
        ply += 1
    winner = state["winner"].float()  # +1 X, -1 O, 0 draw
    mover = torch.cat(movers).float()
    outcome = winner[torch.cat(game_ids)] * mover  # the mover's outcome
    value_target = (1 - cfg.value_mix) * outcome + cfg.value_mix * torch.cat(root_values)
    return TensorDict(
        {
            "board": torch.cat(boards),
            POLICY_TARGET: torch.cat(targets),
            "value_target": value_target,
        },
        batch_size=[mover.shape[0]],
    )


def train_epochs(cfg: Config, net, optimizer, replay: TensorDict, generator) -> dict[str, float]:
    losses = {"loss_policy": [], "loss_value": []}
    for _ in range(cfg.epochs):
        order = torch.randperm(replay.shape[0], generator=generator)
        for start in range(0, replay.shape[0], cfg.minibatch_size):
            batch = replay[order[start : start + cfg.minibatch_size]]
            board, policy_target = batch["board"], batch[POLICY_TARGET]
            if cfg.augment:
                perm = SYMMETRIES[torch.randint(8, (board.shape[0],), generator=generator)]
                board, policy_target = board.gather(1, perm), policy_target.gather(1, perm)
            logits, value = net(board)
            loss_policy = -(policy_target * F.log_softmax(logits, -1)).sum(-1).mean()
            loss_value = F.mse_loss(value, batch["value_target"])
            optimizer.zero_grad()
            (loss_policy + loss_value).backward()
            optimizer.step()
            losses["loss_policy"].append(loss_policy.item())
            losses["loss_value"].append(loss_value.item())
    return {k: sum(v) / len(v) for k, v in losses.items()}


def random_player(game: TicTacToe, generator: torch.Generator):
    def act(state: TensorDictBase) -> torch.Tensor:
        noise = torch.rand(state["board"].shape, generator=generator)
        return noise.masked_fill(~game.legal_actions(state), -1.0).argmax(-1)

    return act


def pure_mcts_player(game: TicTacToe, num_simulations: int, generator: torch.Generator):
    """UCT: UCB1 selection, uniform priors, one random playout per new node."""
    root_fn, recurrent_fn = simulator_model(game, RolloutEvaluator(game, generator))
    select = partial(ucb1_selection, qtransform=partial(qtransform_by_min_max, min_value=-1, max_value=1))

    def act(state: TensorDictBase) -> torch.Tensor:
        tree = search(root_fn(state), recurrent_fn, select, select, num_simulations, two_player=True)
        visits = tree.root_summary()["visit_counts"]
        return visits.masked_fill(~game.legal_actions(state), -1).argmax(-1)

    return act


def play_match(game: TicTacToe, agent, opponent, num_games: int) -> dict[str, float]:
    """``num_games / 2`` games with the agent as X, as many as O. Returns its result rates."""
    results = []
    for agent_is_x in (True, False):
        state = game.reset(num_games // 2)
        ply = 0
        while not bool(state["done"].all()):
            live = (~state["done"]).nonzero().squeeze(-1)
            agent_turn = (ply % 2 == 0) == agent_is_x
            action = torch.zeros(state.shape[0], dtype=torch.int64)
            action[live] = (agent if agent_turn else opponent)(state[live])
            state, _, _ = game.step(state, action)
            ply += 1
        results.append(state["winner"] * (1 if agent_is_x else -1))
    outcome = torch.cat(results).float()
    return {
        "win": (outcome > 0).float().mean().item(),
        "draw": (outcome == 0).float().mean().item(),
        "loss": (outcome < 0).float().mean().item(),
    }


def plot(rows: list[dict], path: str) -> None:
    """Losses, match results and losing-move counts of ``rows`` (metric rows) to ``path``."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        import logging

        logging.getLogger(__name__).warning("matplotlib is not installed: %s not drawn.", path)
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_eval, ax_moves) = plt.subplots(1, 3, figsize=(15, 4))
    it = [r["iteration"] for r in rows]
    ax_loss.plot(it, [r["loss_policy"] for r in rows], label="policy cross-entropy")
    ax_loss.plot(it, [r["loss_value"] for r in rows], label="value MSE")
    ax_loss.set_xlabel("iteration")
    ax_loss.set_title("training loss")
    ax_loss.legend()
    evals = [r for r in rows if "vs_random_win" in r]
    ev = [r["iteration"] for r in evals]
    for key, label in [
        ("vs_random_win", "search vs random: win"),
        ("vs_random_loss", "search vs random: loss"),
        ("vs_mcts_win", "search vs pure MCTS: win"),
        ("vs_mcts_loss", "search vs pure MCTS: loss"),
        ("net_vs_random_win", "net alone vs random: win"),
        ("net_vs_random_loss", "net alone vs random: loss"),
    ]:
        ax_eval.plot(ev, [r[key] for r in evals], marker="o", label=label)
    ax_eval.set_ylim(-0.02, 1.02)
    ax_eval.set_xlabel("iteration")
    ax_eval.set_title("evaluation (half the games as X)")
    ax_eval.legend(fontsize=8)
    for key, label in [("losing_moves", "search"), ("net_losing_moves", "net alone")]:
        ax_moves.plot(ev, [r[key] for r in evals], marker="o", label=label)
    ax_moves.set_yscale("symlog", linthresh=1)
    ax_moves.set_xlabel("iteration")
    ax_moves.set_title("moves into a lost position (of 4,520 positions)")
    ax_moves.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def evaluate(cfg: Config, game: TicTacToe, solver: Solver, net, act, generator) -> dict[str, float]:
    """Losing moves over all positions (search and net alone) and match results against a
    random and a pure-MCTS player."""

    def agent(state):
        return act(state, noise=False, temperature=0.0, num_simulations=cfg.eval_simulations)["action"]

    def greedy_net(state):
        logits, _ = net_evaluator(net)(state)
        return logits.masked_fill(~game.legal_actions(state), -torch.inf).argmax(-1)

    rand = random_player(game, generator)
    mcts = pure_mcts_player(game, cfg.pure_mcts_simulations, generator)
    with torch.no_grad():
        row = {"losing_moves": int(solver.blunders(agent)["losing"].sum()),
               "net_losing_moves": int(solver.blunders(greedy_net)["losing"].sum())}
    matches = {"vs_random": (agent, rand), "vs_mcts": (agent, mcts), "net_vs_random": (greedy_net, rand)}
    for prefix, (player, opponent) in matches.items():
        for k, v in play_match(game, player, opponent, cfg.eval_games).items():
            row[f"{prefix}_{k}"] = v
    return row


def train(cfg: Config) -> dict:
    """Run self-play training with ``cfg``; returns the summary (also ``summary.json``)."""
    run = Run(cfg, "mcts", total=cfg.iterations, unit="iteration")
    torch.manual_seed(cfg.seed)
    generator = torch.Generator().manual_seed(cfg.seed)
    game = TicTacToe()
    solver = Solver()
    net = PolicyValueNet(cfg.hidden)
    optimizer = torch.optim.AdamW(net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    act = make_agent(cfg, game, net, generator)
    replay = StateBox(None)  # the latest replay_size positions (a TensorDict)
    state = {"net": net, "optim": optimizer, "replay": replay, "generator": GeneratorState(generator)}
    resumed = run.start(**state)
    start = int(resumed["step"]) if resumed else 0
    row: dict = {}
    for iteration in range(start + 1, cfg.iterations + 1):
        net.eval()
        data = self_play(cfg, game, act, generator)
        replay.value = data if replay.value is None else torch.cat([replay.value, data])[-cfg.replay_size :]
        progress = (iteration - 1) / max(cfg.iterations - 1, 1)
        for group in optimizer.param_groups:
            cosine = 0.5 * (1 + math.cos(math.pi * progress))
            group["lr"] = cfg.lr_final + (cfg.lr - cfg.lr_final) * cosine
        net.train()
        losses = train_epochs(cfg, net, optimizer, replay.value, generator)
        net.eval()
        row = {"positions": replay.value.shape[0], **losses}
        if crossed(cfg.eval_every, iteration - 1, iteration) or iteration == cfg.iterations:
            row.update(evaluate(cfg, game, solver, net, act, generator))
        run.log(iteration, row)
        print(", ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                        for k, v in {"iteration": iteration, **row}.items()), flush=True)
        run.maybe_checkpoint(iteration, **state)
        if run.out_of_time():
            break
    last = int(run.step)
    run.checkpoint(last, **state)
    torch.save(net.state_dict(), os.path.join(cfg.out, "model.pt"))
    final = dict(run.history.rows[-1]) if run.history.rows else {}
    summary = run.finish({"iterations": last, "final": final})
    if any("vs_random_win" in r for r in run.history.rows):
        plot(run.history.rows, os.path.join(cfg.out, "learning_curve.png"))
    return summary


main = hydra_app(Config, train, name="mcts", recipes=Path(__file__).parent / "recipes")

if __name__ == "__main__":
    main()
