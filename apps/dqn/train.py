"""Deep Q-learning (Mnih et al., 2015) on CartPole-v1, double DQN (van Hasselt et al., 2016)
by default and an optional dueling head (Wang et al., 2016).

A linear TorchRL-style script built from tdrl parts: a vectorised :class:`GymEnv`, a
:class:`QValueActor` followed by an annealed :class:`EGreedyModule`, a :class:`Collector`
(uniformly random actions for the first ``learning_starts`` frames), a :class:`ReplayBuffer`
over a :class:`LazyTensorStorage`, :class:`DQNLoss` and :class:`HardUpdate` (or
:class:`SoftUpdate`) of the target network, and ``tdrl.core.train`` for the metrics (CSV,
TensorBoard with ``--tensorboard``), the progress bar and atomic checkpoints. Each collected
batch is one step of every sub-env; then ``utd_ratio`` gradient steps per collected frame.

    python apps/dqn/train.py                          # CartPole-v1
    python apps/dqn/train.py --dueling --total_frames 100000
    python apps/dqn/train.py --tiny                   # a seconds-long smoke run (CI)
    python apps/dqn/train.py ... --resume             # continue from the last checkpoint

Outputs in ``--out``: ``metrics.csv`` (``step`` = frames), ``learning_curve.png``,
``summary.json``, ``model.pt``, ``checkpoints/step_<frames>.pt`` (Q network and target,
optimiser, replay buffer, collector, exploration schedule, metric history, RNG states) and
``tensorboard/`` when asked. On ``--resume`` the Gymnasium simulators (which cannot be
checkpointed) start fresh episodes, seeded from the frame count.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass

import torch
from tensordict.nn import TensorDictSequential
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from ppo.app_utils import AppRun, episode_returns, evaluate_episodes, parse_config  # noqa: E402

from tdrl.core import Compose, GymEnv, RewardSum, TransformedEnv
from tdrl.core.collectors import Collector
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
    checkpoint_every: int = 10_000  # frames between checkpoints (0: only at the end)
    resume: bool = False  # continue from the latest checkpoint in out/checkpoints
    tensorboard: bool = False  # also log to TensorBoard (out/tensorboard)
    progress: bool = True  # a progress bar with live metrics (stderr)
    out: str = "runs/dqn"
    tiny: bool = False

    def __post_init__(self) -> None:
        if self.tiny:
            self.total_frames = min(self.total_frames, 400)
            self.learning_starts = min(self.learning_starts, 100)
            self.log_every = min(self.log_every, 100)
            self.eval_episodes = min(self.eval_episodes, 2)
            self.checkpoint_every = min(self.checkpoint_every, 200)
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
    run = AppRun(cfg, "dqn")
    torch.manual_seed(cfg.seed)
    device = torch.device(cfg.device)
    env = make_env(cfg, cfg.num_envs)
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
    collector = Collector(env, policy, frames_per_batch=cfg.num_envs, total_frames=cfg.total_frames,
                          init_random_frames=cfg.learning_starts, device=device, seed=cfg.seed)
    keep = ["observation", "action", ("next", "observation"), ("next", "reward"),
            ("next", "terminated")]

    # everything a checkpoint holds (the RNG states and the metric history are added)
    state = {"loss": loss_fn, "optim": optim, "buffer": buffer, "collector": collector,
             "explore": explore}
    if hasattr(updater, "state_dict"):
        state["updater"] = updater
    loop = {"updates": 0, "debt": 0.0, "next_log": cfg.log_every,
            "next_eval": max(cfg.eval_every, cfg.learning_starts)}
    resumed = run.maybe_resume(**state)
    if resumed is not None:  # the simulators restart: new episodes, seeded from the frame count
        loop.update({k: resumed[k] for k in loop})
        collector.reset()
        collector.set_seed(cfg.seed + collector.frames)

    returns, stats = [], []
    for batch in collector:
        # 1. one epsilon-greedy step of every sub-env (random actions before learning_starts)
        frames = collector.frames
        buffer.extend(batch.reshape(-1).select(*keep).to(device))
        returns += episode_returns(batch)
        explore.step(batch.numel())
        # 2. gradient steps
        if frames >= cfg.learning_starts:
            loop["debt"] += cfg.utd_ratio * batch.numel()
            while loop["debt"] >= 1.0:
                loop["debt"] -= 1.0
                out = loss_fn(buffer.sample())
                optim.zero_grad(set_to_none=True)
                total_loss(out).backward()
                nn.utils.clip_grad_norm_(qnet.parameters(), cfg.max_grad_norm)
                optim.step()
                updater.step()
                loop["updates"] += 1
                stats.append(out.detach())
        # 3. log, evaluate (greedy policy), checkpoint
        row = {}
        if frames >= loop["next_log"]:
            loop["next_log"] += cfg.log_every
            row = {"updates": loop["updates"], "fps": frames / run.elapsed, "epsilon": explore.eps,
                   "train_return": run.record_episodes(returns), "episodes": len(returns)}
            if stats:
                row.update({k: float(v) for k, v in torch.stack(stats).mean().items()})
            returns, stats = [], []
        if cfg.eval_every and frames >= loop["next_eval"]:
            loop["next_eval"] += cfg.eval_every
            row["updates"] = loop["updates"]
            row["eval_return"] = evaluate(policy, cfg, cfg.eval_episodes, cfg.seed + 10_000)
        if row:
            run.log(frames, row, show=("train_return", "eval_return", "epsilon"))
        run.maybe_checkpoint(frames, extra=dict(loop), **state)
        if cfg.stop_return and row.get("eval_return", -float("inf")) >= cfg.stop_return:
            break
        if cfg.time_limit_s and run.elapsed > cfg.time_limit_s:
            break
    frames = collector.frames
    run.checkpoint(frames, extra=dict(loop), **state)
    collector.shutdown()
    env.close()
    eval_return = evaluate(policy, cfg, cfg.eval_episodes, cfg.seed + 20_000)
    torch.save({"qnet": qnet.state_dict(), "config": dataclasses.asdict(cfg)},
               os.path.join(cfg.out, "model.pt"))
    summary = run.finish(frames, eval_return, f"DQN {cfg.env_id}", updates=loop["updates"])
    print(f"[dqn] {cfg.env_id}: eval return {eval_return:.1f} over {cfg.eval_episodes} "
          f"episodes after {frames} frames ({summary['time_s']:.0f} s)", flush=True)
    return summary


if __name__ == "__main__":
    torch.set_num_threads(int(os.environ.get("TDRL_THREADS", "1")))
    train(parse_config(Config, sys.argv[1:]))
