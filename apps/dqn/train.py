"""Deep Q-learning (Mnih et al., 2015) on CartPole-v1, double DQN (van Hasselt et al., 2016)
by default and an optional dueling head (Wang et al., 2016).

A linear CleanRL-style script built from tdrl parts: a vectorised :class:`GymEnv`, a
:class:`QValueActor` followed by an annealed :class:`EGreedyModule`, a :class:`ReplayBuffer`
over a :class:`LazyTensorStorage`, :class:`DQNLoss` and :class:`HardUpdate` (or :class:`SoftUpdate`) of the
target network. Each step: act epsilon-greedily in every sub-env, store the transitions, then
``utd_ratio`` gradient steps per collected frame.

    python apps/dqn/train.py                          # CartPole-v1
    python apps/dqn/train.py --dueling --total_frames 100000
    python apps/dqn/train.py --tiny                   # a seconds-long smoke run (CI)

Outputs in ``--out``: ``metrics.csv``, ``learning_curve.png``, ``summary.json``, ``model.pt``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass

import torch
from tensordict.nn import InteractionType, TensorDictSequential, set_interaction_type
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from ppo.app_utils import MetricsCSV, evaluate_episodes, parse_config, plot_curve  # noqa: E402

from tdrl.core import Compose, GymEnv, RewardSum, TransformedEnv
from tdrl.core.modules import MLP, DuelingHead, EGreedyModule, QValueActor
from tdrl.core.objectives import DQNLoss, HardUpdate, SoftUpdate, total_loss
from tdrl.core.replay import LazyTensorStorage, ReplayBuffer


@dataclass
class Config:
    """Every knob of the app; each field is a ``--flag``. Defaults solve CartPole-v1."""

    env_id: str = "CartPole-v1"
    total_frames: int = 40_000
    num_envs: int = 4
    learning_starts: int = 1_000
    buffer_size: int = 50_000
    batch_size: int = 128
    utd_ratio: float = 0.5  # gradient steps per collected frame
    lr: float = 5e-4
    gamma: float = 0.98  # a shorter horizon: Q converges in fewer target updates
    target_update_interval: int = 50  # gradient steps between hard target updates
    tau: float = 0.0  # > 0: Polyak (soft) target update after every gradient step instead
    eps_init: float = 1.0
    eps_end: float = 0.02
    exploration_fraction: float = 0.3  # fraction of total_frames over which eps anneals
    double_dqn: bool = True
    dueling: bool = False
    hidden: tuple[int, ...] = (128, 128)
    max_grad_norm: float = 10.0
    eval_episodes: int = 10
    eval_every: int = 0  # frames between evaluations during training (0: only at the end)
    stop_return: float = 0.0  # stop once an evaluation reaches this mean return (0: never)
    log_every: int = 2_000  # frames between CSV rows
    seed: int = 0
    device: str = "cpu"
    time_limit_s: float = 0.0  # stop training after this many seconds (0: no limit)
    out: str = "runs/dqn"
    tiny: bool = False

    def __post_init__(self) -> None:
        if self.tiny:
            self.total_frames = min(self.total_frames, 400)
            self.learning_starts = min(self.learning_starts, 100)
            self.log_every = min(self.log_every, 100)
            self.eval_episodes = min(self.eval_episodes, 2)
        if not 0.0 < self.exploration_fraction <= 1.0:
            raise ValueError(f"exploration_fraction must be in (0, 1], got {self.exploration_fraction}.")


def make_env(cfg: Config, num_envs: int) -> TransformedEnv:
    """A Gymnasium vector env with integer actions and episode-return tracking."""
    base = GymEnv(cfg.env_id, num_envs=num_envs, categorical_action_encoding=True)
    return TransformedEnv(base, Compose(RewardSum()))


def make_qnet(env, cfg: Config) -> QValueActor:
    """``observation -> action_value -> greedy action``; dueling head if ``cfg.dueling``."""
    obs_dim = env.observation_spec["observation"].shape[-1]
    n = env.action_spec.n
    if cfg.dueling:
        body = MLP(obs_dim, cfg.hidden[-1], cfg.hidden[:-1], nn.ReLU, activate_last=True)
        net = nn.Sequential(body, DuelingHead(cfg.hidden[-1], n, (cfg.hidden[-1],)))
    else:
        net = MLP(obs_dim, n, cfg.hidden, nn.ReLU)
    return QValueActor(net)


@torch.no_grad()
def evaluate(policy, cfg: Config, episodes: int, seed: int) -> float:
    """Mean return of ``episodes`` episodes of the greedy policy (one per sub-env)."""
    env = make_env(cfg, episodes)
    return evaluate_episodes(env, policy, episodes, seed)


def train(cfg: Config) -> dict:
    """Run DQN with ``cfg``; returns a summary dict (also written to ``summary.json``)."""
    os.makedirs(cfg.out, exist_ok=True)
    torch.manual_seed(cfg.seed)
    device = torch.device(cfg.device)
    env = make_env(cfg, cfg.num_envs)
    env.set_seed(cfg.seed)
    qnet = make_qnet(env, cfg).to(device)
    explore = EGreedyModule(env.action_spec.n, cfg.eps_init, cfg.eps_end,
                            int(cfg.exploration_fraction * cfg.total_frames))
    policy = TensorDictSequential(qnet, explore)
    loss_fn = DQNLoss(qnet, gamma=cfg.gamma, double_dqn=cfg.double_dqn).to(device)
    optim = torch.optim.Adam(qnet.parameters(), lr=cfg.lr)
    updater = (SoftUpdate(loss_fn, tau=cfg.tau) if cfg.tau > 0
               else HardUpdate(loss_fn, update_interval=cfg.target_update_interval))
    buffer = ReplayBuffer(storage=LazyTensorStorage(cfg.buffer_size, device=device),
                          batch_size=cfg.batch_size)
    keep = ["observation", "action", ("next", "observation"), ("next", "reward"),
            ("next", "terminated")]

    log = MetricsCSV(os.path.join(cfg.out, "metrics.csv"))
    td = env.reset()
    frames, updates, t0, recent, stats = 0, 0, time.perf_counter(), [], []
    next_log, next_eval, debt = cfg.log_every, max(cfg.eval_every, cfg.learning_starts), 0.0
    while frames < cfg.total_frames:
        if cfg.time_limit_s and time.perf_counter() - t0 > cfg.time_limit_s:
            break
        # 1. act epsilon-greedily and store
        with torch.no_grad(), set_interaction_type(InteractionType.RANDOM):
            td = policy(td.to(device))
        td, next_td = env.step_and_maybe_reset(td)
        buffer.extend(td.select(*keep).to(device))
        done = td["next", "done"].squeeze(-1)
        recent += td["next", "episode_reward"].squeeze(-1)[done].tolist()
        td = next_td
        frames += cfg.num_envs
        explore.step(cfg.num_envs)
        # 2. gradient steps
        if frames >= cfg.learning_starts:
            debt += cfg.utd_ratio * cfg.num_envs
            while debt >= 1.0:
                debt -= 1.0
                out = loss_fn(buffer.sample())
                optim.zero_grad(set_to_none=True)
                total_loss(out).backward()
                nn.utils.clip_grad_norm_(qnet.parameters(), cfg.max_grad_norm)
                optim.step()
                updater.step()
                updates += 1
                stats.append(out.detach())
        # 3. log
        if frames >= next_log:
            next_log += cfg.log_every
            elapsed = time.perf_counter() - t0
            row = {"frames": frames, "updates": updates, "time_s": round(elapsed, 2),
                   "fps": round(frames / elapsed, 1), "epsilon": explore.eps,
                   "train_return": sum(recent) / len(recent) if recent else float("nan"),
                   "episodes": len(recent)}
            if stats:
                row.update({k: float(v) for k, v in torch.stack(stats).mean().items()})
            log.log(row)
            print(f"[dqn] frames {frames:8d} return {row['train_return']:7.1f} "
                  f"eps {explore.eps:.3f} fps {row['fps']:6.0f}", flush=True)
            recent, stats = [], []
        # 4. evaluate (greedy policy) and maybe stop
        if cfg.eval_every and frames >= next_eval:
            next_eval += cfg.eval_every
            ret = evaluate(policy, cfg, cfg.eval_episodes, cfg.seed + 10_000)
            log.log({"frames": frames, "updates": updates, "eval_return": ret})
            print(f"[dqn] frames {frames:8d} eval return {ret:7.1f}", flush=True)
            if cfg.stop_return and ret >= cfg.stop_return:
                break
    env.close()
    eval_return = evaluate(policy, cfg, cfg.eval_episodes, cfg.seed + 20_000)
    log.log({"frames": frames, "updates": updates, "eval_return": eval_return})
    plot_curve(log.rows, os.path.join(cfg.out, "learning_curve.png"), f"DQN {cfg.env_id}")
    torch.save({"qnet": qnet.state_dict(), "config": dataclasses.asdict(cfg)},
               os.path.join(cfg.out, "model.pt"))
    summary = {"env_id": cfg.env_id, "frames": frames, "updates": updates,
               "eval_return": eval_return, "eval_episodes": cfg.eval_episodes,
               "time_s": time.perf_counter() - t0}
    with open(os.path.join(cfg.out, "summary.json"), "w") as fh:
        json.dump(summary, fh, indent=2)
    print(f"[dqn] {cfg.env_id}: eval return {eval_return:.1f} over {cfg.eval_episodes} "
          f"episodes after {frames} frames ({summary['time_s']:.0f} s)", flush=True)
    return summary


if __name__ == "__main__":
    torch.set_num_threads(int(os.environ.get("TDRL_THREADS", "1")))
    train(parse_config(Config, sys.argv[1:]))
