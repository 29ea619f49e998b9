"""Deep Q-learning (Mnih et al., 2015) on CartPole-v1, double DQN (van Hasselt et al., 2016)
by default and an optional dueling head (Wang et al., 2016).

A linear TorchRL-style script built from tdrl parts: a vectorised :class:`GymEnv`, a
:class:`QValueActor` followed by an annealed :class:`EGreedyModule`, a :class:`Collector`
(uniformly random actions for the first ``learning_starts`` frames), a :class:`ReplayBuffer`
over a :class:`LazyTensorStorage`, :class:`DQNLoss` and :class:`HardUpdate` (or
:class:`SoftUpdate`) of the target network, and the run harness of ``tdrl.core.train``.
Each collected batch is one step of every sub-env; then ``utd_ratio`` gradient steps per
collected frame.

    python apps/dqn/train.py                          # CartPole-v1
    python apps/dqn/train.py dueling=true total_frames=100000
    python apps/dqn/train.py --config-name tiny       # a seconds-long smoke run (CI)
    python apps/dqn/train.py -cn minatar              # from pixels: MinAtar Breakout (core[minatar])
    python apps/dqn/train.py resume=true              # continue from the last checkpoint

Outputs in ``out``: ``config.yaml``, ``metrics.csv`` (``step`` = frames),
``learning_curve.png``, ``summary.json``, ``model.pt``, ``checkpoints/step_<frames>.pt`` (Q
network and target, optimiser, replay buffer, collector, exploration schedule, update
budget, metric history, RNG states) and ``tensorboard/`` when asked. On resume the
Gymnasium simulators (which cannot be checkpointed) start fresh episodes, seeded from the
frame count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar
from pathlib import Path

import torch
from tensordict.nn import TensorDictSequential
from torch import nn

from tdrl.core import RewardSum, ToTensorImage
from tdrl.core.collectors import Collector
from tdrl.core.envs import env_rng_state, make_env
from tdrl.core.modules import MLP, ConvNet, DuelingHead, EGreedyModule, QValueActor
from tdrl.core.objectives import DQNLoss, HardUpdate, SoftUpdate, total_loss
from tdrl.core.replay import LazyTensorStorage, ReplayBuffer
from tdrl.core.train import (
    ConfigError,
    OffPolicyConfig,
    OffPolicyLog,
    Run,
    UpdateBudget,
    evaluate_episodes,
    hydra_app,
)


@dataclass
class Config(OffPolicyConfig):
    """DQN on a discrete-action Gymnasium task; the defaults solve CartPole-v1."""

    action_kinds: ClassVar[tuple[str, ...]] = ("discrete",)

    total_frames: int = 40_000
    num_envs: int = 4
    learning_starts: int = 1_000
    buffer_size: int = 50_000
    batch_size: int = 128
    utd_ratio: float = 0.5
    lr: float = 5e-4
    """Adam learning rate."""
    gamma: float = 0.98
    """Discount (a shorter horizon: Q converges in fewer target updates)."""
    target_update_interval: int = 50
    """Gradient steps between hard target updates."""
    tau: float = 0.0
    """> 0: Polyak (soft) target update after every gradient step instead of hard updates."""
    eps_init: float = 1.0
    """Initial exploration epsilon."""
    eps_end: float = 0.02
    """Final exploration epsilon."""
    exploration_fraction: float = 0.3
    """Fraction of total_frames over which epsilon anneals."""
    double_dqn: bool = True
    """Double DQN targets (the online net picks the next action)."""
    dueling: bool = False
    """Dueling value/advantage head."""
    hidden: tuple[int, ...] = (128, 128)
    pixels: bool = False
    """Image observations ``[H, W, C]`` (MinAtar's grids, Gymnasium renders): a channel-first
    :class:`ToTensorImage` on the env and :class:`ConvNet` (``conv`` channels, 3x3 kernels,
    stride 1, as MinAtar's DQN) before the ``hidden`` layers."""
    conv: tuple[int, ...] = (16,)
    """With pixels: channels of each 3x3 convolution."""
    max_grad_norm: float = 10.0
    """Gradient-norm clip."""
    log_every: int = 2_000
    checkpoint_every: int = 10_000
    """Frames between checkpoints; 0: only at the end."""
    out: str = "runs/dqn"
    """Run folder (a new numbered one beside it if it holds an earlier run and resume is false)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 < self.exploration_fraction <= 1.0:
            raise ConfigError(f"Config.exploration_fraction={self.exploration_fraction} is not allowed: "
                              "expected (0, 1].")
        if not self.lr > 0:
            raise ConfigError(f"Config.lr={self.lr} is not allowed: expected a learning rate > 0.")


def make_qnet(env, cfg: Config) -> QValueActor:
    """``observation -> action_value -> greedy action``; dueling head if ``cfg.dueling``, a
    convolutional torso if ``cfg.pixels``."""
    obs_shape = env.observation_spec["observation"].shape[len(env.batch_size):]  # checked by env_for
    torso: list[nn.Module] = []
    obs_dim = obs_shape[-1]
    if cfg.pixels:
        conv = ConvNet(obs_shape[0], cfg.conv, (3,) * len(cfg.conv), (1,) * len(cfg.conv))
        obs_dim = conv(torch.zeros(1, *obs_shape)).shape[-1]
        torso = [conv]
    n = env.action_spec.n
    if cfg.dueling:
        body = MLP(obs_dim, cfg.hidden[-1], cfg.hidden[:-1], nn.ReLU, activate_last=True)
        net = nn.Sequential(*torso, body, DuelingHead(cfg.hidden[-1], n, (cfg.hidden[-1],)))
    else:
        net = nn.Sequential(*torso, MLP(obs_dim, n, cfg.hidden, nn.ReLU))
    return QValueActor(net)


def env_for(cfg: Config, num_envs: int):
    """The task with integer actions and episode-return tracking (images channel-first)."""
    env = make_env(cfg.env_id, num_envs, (RewardSum(),), categorical_action_encoding=True)
    shape = tuple(env.observation_spec["observation"].shape[len(env.batch_size):])
    if cfg.pixels != (len(shape) == 3):
        env.close()
        raise ConfigError(f"Config.pixels={str(cfg.pixels).lower()} but {cfg.env_id} gives observations of shape "
                          f"{shape}: set pixels={str(len(shape) == 3).lower()} (images [H, W, C] take the conv "
                          "torso; other shapes: flatten them with FlattenObservation).")
    return env.insert_transform(0, ToTensorImage(in_keys=["observation"])) if cfg.pixels else env


def train(cfg: Config) -> dict:
    """Run DQN with ``cfg``; returns a summary dict (also written to ``summary.json``)."""
    run = Run(cfg, "dqn", total=cfg.total_frames, unit="frames")
    torch.manual_seed(cfg.seed)
    device = torch.device(cfg.device)
    env = env_for(cfg, cfg.num_envs)
    qnet = make_qnet(env, cfg).to(device)
    explore = EGreedyModule(env.action_spec.n, cfg.eps_init, cfg.eps_end,
                            int(cfg.exploration_fraction * cfg.total_frames))
    policy = TensorDictSequential(qnet, explore)
    loss_fn = DQNLoss(qnet, gamma=cfg.gamma, double_dqn=cfg.double_dqn).to(device)
    optim = torch.optim.Adam(qnet.parameters(), lr=cfg.lr)
    updater = (SoftUpdate(loss_fn, tau=cfg.tau) if cfg.tau > 0
               else HardUpdate(loss_fn, update_interval=cfg.target_update_interval))
    buffer = ReplayBuffer(storage=LazyTensorStorage(min(cfg.buffer_size, cfg.total_frames), device=device),
                          batch_size=cfg.batch_size)
    collector = Collector(env, policy, frames_per_batch=cfg.num_envs, total_frames=cfg.total_frames,
                          init_random_frames=cfg.learning_starts, device=device, seed=cfg.seed)
    budget = UpdateBudget(cfg.utd_ratio, cfg.learning_starts)
    keep = ["observation", "action", ("next", "observation"), ("next", "reward"),
            ("next", "terminated")]

    # everything a checkpoint holds (the RNG states and the metric history are added)
    state = {"loss": loss_fn, "optim": optim, "buffer": buffer, "collector": collector,
             "explore": explore, "budget": budget}
    if hasattr(updater, "state_dict"):
        state["updater"] = updater
    if (env_rng := env_rng_state(env)) is not None:
        state["env_rng"] = env_rng
    if run.start(**state) is not None and env_rng is None:
        collector.reset()  # the simulators restart: new episodes, seeded from the frame count
        collector.set_seed(cfg.seed + collector.frames)

    def evaluate(seed: int) -> dict:  # the greedy policy
        return {"eval_return": evaluate_episodes(env_for(cfg, cfg.eval_episodes), policy, cfg.eval_episodes, seed)}

    log = OffPolicyLog(run, cfg, budget, evaluate, show=("train_return", "eval_return", "epsilon"),
                       extra=lambda: {"epsilon": explore.eps})
    for batch in collector:
        # 1. one epsilon-greedy step of every sub-env (random actions before learning_starts)
        frames, new = collector.frames, batch.numel()
        buffer.extend(batch.reshape(-1).select(*keep).to(device))
        log.add_batch(batch)
        explore.step(new)
        # 2. gradient steps
        for _ in range(budget.add(frames, new)):
            out = loss_fn(buffer.sample())
            optim.zero_grad(set_to_none=True)
            total_loss(out).backward()
            nn.utils.clip_grad_norm_(qnet.parameters(), cfg.max_grad_norm)
            optim.step()
            updater.step()
            log.add_stats(out)
        # 3. log, evaluate, checkpoint
        if log.step(frames, new, state):
            break
    return log.close(collector, env, state, {"qnet": qnet.state_dict()}, f"DQN {cfg.env_id}")


main = hydra_app(Config, train, name="dqn", recipes=Path(__file__).parent / "recipes")

if __name__ == "__main__":
    main()
