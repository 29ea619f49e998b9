"""PPO (Schulman et al., 2017) on Gymnasium classic-control and MuJoCo tasks.

A linear TorchRL-style script built from tdrl parts: a vectorised :class:`GymEnv` (with
observation normalisation for MuJoCo), a :class:`ProbabilisticActor` and a value head, a
:class:`Collector`, :func:`gae`, :class:`PPOLoss`, and the run harness of ``tdrl.core.train``
(run folder, metrics, checkpoints, exact resume). Each iteration collects
``num_envs x num_steps`` frames, computes advantages, runs ``epochs`` passes over shuffled
minibatches, logs, and checkpoints every ``checkpoint_every`` frames.

    python apps/ppo/train.py                              # CartPole-v1 (about a minute)
    python apps/ppo/train.py --config-name halfcheetah    # CleanRL's MuJoCo settings, 1M frames
    python apps/ppo/train.py --config-name tiny           # a seconds-long smoke run (CI)
    python apps/ppo/train.py env_id=Pendulum-v1 lr=3e-4 hidden=[128,128]
    python apps/ppo/train.py -m seed=0,1,2                # three runs, out/seed=<k>/
    python apps/ppo/train.py resume=true                  # continue from the last checkpoint
    python apps/ppo/train.py --help                       # every setting, documented

Outputs in ``out``: ``config.yaml``, ``metrics.csv`` (one row per iteration, ``step`` =
frames), ``learning_curve.png``, ``summary.json``, ``model.pt`` (actor, critic and
observation-normalisation state), ``checkpoints/step_<frames>.pt`` (model, optimiser,
collector, normalisers, metric history, RNG states) and ``tensorboard/`` when asked.
A resumed run restores all of that; the Gymnasium simulators themselves cannot be
checkpointed, so every sub-env starts a fresh episode (seeded from the frame count).
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule
from torch import nn

from tdrl.core import DoubleToFloat, RewardSum, TransformedEnv, VecNorm
from tdrl.core.collectors import Collector
from tdrl.core.envs import TORCH_ENVS, env_rng_state
from tdrl.core.envs import make_env as make_task
from tdrl.core.modules import MLP, IndependentNormal, MaskedCategorical, ProbabilisticActor, ValueOperator
from tdrl.core.objectives import PPOLoss, total_loss
from tdrl.core.specs import Categorical, OneHot
from tdrl.core.train import (
    ConfigError,
    EnvRunConfig,
    Run,
    crossed,
    episode_returns,
    evaluate_episodes,
    finish_env_run,
    hydra_app,
)
from tdrl.core.values import gae


@dataclass
class Config(EnvRunConfig):
    """PPO on a Gymnasium task. The defaults solve CartPole-v1 fast on one CPU thread (the RL
    Zoo's CartPole settings); the halfcheetah recipe holds CleanRL's MuJoCo settings."""

    num_envs: int = 8
    num_steps: int = 32
    """Steps per sub-env per iteration (a batch is num_envs x num_steps frames)."""
    epochs: int = 20
    """Passes over each batch."""
    minibatch_size: int = 256
    """Frames per gradient step; must divide the batch."""
    lr: float = 1e-3
    """Adam learning rate."""
    anneal_lr: bool = True
    """Decay the learning rate linearly to 0 over the run."""
    gamma: float = 0.98
    """Discount."""
    lmbda: float = 0.8
    """GAE lambda."""
    clip_epsilon: float = 0.2
    """PPO ratio clip."""
    entropy_coef: float = 0.0
    """Entropy bonus weight."""
    critic_coef: float = 0.5
    """Value-loss weight."""
    clip_value: float = 0.0
    """PPO2 value clipping range; 0 disables it."""
    max_grad_norm: float = 0.5
    """Gradient-norm clip."""
    normalize_advantage: bool = True
    """Normalise advantages per minibatch."""
    gae_backend: str = "auto"
    """GAE implementation: auto (tdrl.kernels when installed), torch or kernels."""
    norm_obs: bool | None = None
    """Normalise observations with running statistics; null: on for continuous actions."""
    norm_reward: bool | None = None
    """Scale rewards by the running std of the return; null: on for continuous actions."""
    checkpoint_every: int = 100_000
    """Frames between checkpoints; 0: only at the end."""
    eval_every: int = 0
    """Frames between evaluations during training; 0: only at the end."""
    out: str = "runs/ppo"
    """Run folder (a new numbered one beside it if it holds an earlier run and resume is false)."""
    eval_only: bool = False
    """Only evaluate the latest checkpoint in out/checkpoints."""

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("num_steps", "epochs", "minibatch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"Config.{name}={getattr(self, name)} is not allowed: expected an integer >= 1.")
        if not self.lr > 0:
            raise ConfigError(f"Config.lr={self.lr} is not allowed: expected a learning rate > 0.")
        if not (0.0 <= self.gamma <= 1.0 and 0.0 <= self.lmbda <= 1.0):
            raise ConfigError(f"Config.gamma={self.gamma} / lmbda={self.lmbda}: both must be in [0, 1].")
        batch = self.num_envs * self.num_steps
        if self.total_frames < batch:
            raise ConfigError(f"Config.total_frames={self.total_frames} is less than one batch "
                              f"(num_envs x num_steps = {batch}).")
        if batch % self.minibatch_size:
            raise ConfigError(f"Config.minibatch_size={self.minibatch_size} must divide the batch of "
                              f"num_envs x num_steps = {batch} frames.")


# ---------------------------------------------------------------------------- env / nets
def make_env(cfg: Config, num_envs: int, obs_norm: VecNorm | None) -> TransformedEnv:
    """The task with float32 observations (MuJoCo's are float64), optional observation
    normalisation and episode returns; Gymnasium's continuous actions are clipped to the
    bounds inside the env."""
    import gymnasium as gym

    wrappers = None
    if cfg.env_id not in TORCH_ENVS:
        probe = gym.make(cfg.env_id)
        wrappers = [gym.wrappers.ClipAction] if isinstance(probe.action_space, gym.spaces.Box) else None
        probe.close()
    transforms = (DoubleToFloat(), *([obs_norm] if obs_norm is not None else []), RewardSum())
    return make_task(cfg.env_id, num_envs, transforms, categorical_action_encoding=True, wrappers=wrappers)


class GaussianHead(nn.Module):
    """``obs -> (loc, scale)`` with a state-independent log-std (CleanRL's continuous PPO)."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: tuple[int, ...]) -> None:
        super().__init__()
        self.mean = MLP(obs_dim, act_dim, hidden, nn.Tanh, orthogonal_init=True, last_gain=0.01)
        self.log_std = nn.Parameter(torch.zeros(act_dim))

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        loc = self.mean(obs)
        return loc, self.log_std.exp().expand_as(loc)


def make_actor_critic(env, cfg: Config):
    """A probabilistic actor (categorical or diagonal Gaussian) and a value head."""
    obs_dim = env.observation_spec["observation"].shape[-1]
    spec = env.action_spec
    if isinstance(spec, (Categorical, OneHot)):
        net = MLP(obs_dim, spec.n, cfg.hidden, nn.Tanh, orthogonal_init=True, last_gain=0.01)
        params = TensorDictModule(net, in_keys=["observation"], out_keys=["logits"])
        actor = ProbabilisticActor(params, MaskedCategorical, in_keys=["logits"])
    else:
        head = GaussianHead(obs_dim, spec.shape[-1], cfg.hidden)
        params = TensorDictModule(head, in_keys=["observation"], out_keys=["loc", "scale"])
        actor = ProbabilisticActor(params, IndependentNormal, in_keys=["loc", "scale"])
    critic = ValueOperator(MLP(obs_dim, 1, cfg.hidden, nn.Tanh, orthogonal_init=True))
    return actor, critic


class ReturnScaler:
    """CleanRL/Gymnasium ``NormalizeReward``: divide rewards by the running std of the
    discounted return, then clip to ``[-clip, clip]``.

    Args:
        num_envs: batch size. gamma: discount of the tracked return. clip: clip bound.
    """

    def __init__(self, num_envs: int, gamma: float, clip: float = 10.0) -> None:
        self.ret = torch.zeros(num_envs, 1, dtype=torch.float64)
        self.gamma, self.clip = gamma, clip
        self.mean, self.var, self.count = 0.0, 1.0, 1e-4

    def state_dict(self) -> dict:
        return {"ret": self.ret.clone(), "mean": self.mean, "var": self.var, "count": self.count}

    def load_state_dict(self, state: dict) -> None:
        self.ret = state["ret"].clone()
        self.mean, self.var, self.count = float(state["mean"]), float(state["var"]), float(state["count"])

    def __call__(self, reward: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
        self.ret = self.ret * self.gamma + reward.double()
        b_mean, b_var, m = self.ret.mean().item(), self.ret.var(unbiased=False).item(), reward.numel()
        tot = self.count + m
        delta = b_mean - self.mean
        self.mean += delta * m / tot
        self.var = (self.var * self.count + b_var * m + delta**2 * self.count * m / tot) / tot
        self.count = tot
        self.ret = self.ret.masked_fill(done, 0.0)
        return (reward / math.sqrt(self.var + 1e-8)).clamp(-self.clip, self.clip)


@torch.no_grad()
def compute_advantage(batch: TensorDictBase, critic, cfg: Config) -> None:
    """Write ``advantage`` and ``value_target`` (``[N, T, 1]``) into a ``[N, T]`` rollout.

    Terminated steps stop bootstrapping; truncated ones bootstrap from the value of the true
    final observation (kept under ``"next"`` by the env wrapper).
    """
    value = critic(batch.select("observation"))["state_value"]
    next_value = critic(batch["next"].select("observation"))["state_value"]
    adv, target = gae(
        batch["next", "reward"], value, next_value, batch["next", "done"],
        batch["next", "terminated"], cfg.gamma, cfg.lmbda, backend=cfg.gae_backend,
    )
    batch.update({"state_value": value, "advantage": adv, "value_target": target})


# ---------------------------------------------------------------------------- evaluation
@torch.no_grad()
def evaluate(actor, cfg: Config, obs_norm: VecNorm | None, episodes: int, seed: int) -> float:
    """Mean return of ``episodes`` episodes of the deterministic policy (one per sub-env)."""
    eval_norm = None
    if obs_norm is not None:
        eval_norm = VecNorm(clip=obs_norm.clip)
        eval_norm.load_state_dict(obs_norm.state_dict())
        eval_norm.freeze()
    env = make_env(cfg, episodes, eval_norm)
    return evaluate_episodes(env, actor, episodes, seed)


# ---------------------------------------------------------------------------- training
def train(cfg: Config) -> dict:
    """Run PPO with ``cfg``; returns a summary dict (also written to ``summary.json``)."""
    run = Run(cfg, "ppo", total=cfg.total_frames, unit="frames")
    torch.manual_seed(cfg.seed)
    device = torch.device(cfg.device)
    probe_env = make_env(cfg, 1, None)
    continuous = not isinstance(probe_env.action_spec, (Categorical, OneHot))
    probe_env.close()
    norm_obs = continuous if cfg.norm_obs is None else cfg.norm_obs
    norm_reward = continuous if cfg.norm_reward is None else cfg.norm_reward
    obs_norm = VecNorm(clip=10.0) if norm_obs else None
    env = make_env(cfg, cfg.num_envs, obs_norm)
    scaler = ReturnScaler(cfg.num_envs, cfg.gamma) if norm_reward else None

    actor, critic = make_actor_critic(env, cfg)
    actor, critic = actor.to(device), critic.to(device)
    loss_fn = PPOLoss(
        actor, critic, clip_epsilon=cfg.clip_epsilon, entropy_coef=cfg.entropy_coef,
        critic_coef=cfg.critic_coef, clip_value=cfg.clip_value or None,
        normalize_advantage=cfg.normalize_advantage,
    )
    optim = torch.optim.Adam(loss_fn.parameters(), lr=cfg.lr, eps=1e-5)
    frames_per_batch = cfg.num_envs * cfg.num_steps
    n_iters = cfg.total_frames // frames_per_batch
    collector = Collector(env, actor, frames_per_batch=frames_per_batch,
                          total_frames=n_iters * frames_per_batch, device=device, seed=cfg.seed)

    # everything a checkpoint holds (the RNG states and the metric history are added)
    state = {"actor": actor, "critic": critic, "optim": optim, "collector": collector}
    if obs_norm is not None:
        state["obs_norm"] = obs_norm
    if scaler is not None:
        state["scaler"] = scaler
    if (env_rng := env_rng_state(env)) is not None:  # a torch env: its episodes resume exactly
        state["env_rng"] = env_rng
    resumed = run.start(**state)
    it = 0
    if resumed is not None:
        it = int(resumed["iteration"])
        if env_rng is None:  # the simulators restart: new episodes, seeded from the frame count
            collector.reset()
            collector.set_seed(cfg.seed + collector.frames)

    for batch in collector:
        if cfg.anneal_lr:
            for g in optim.param_groups:
                g["lr"] = cfg.lr * (1.0 - it / n_iters)
        # 1. the batch [num_envs, num_steps] came from the stochastic policy
        batch = batch.to(device)
        returns = episode_returns(batch)
        if scaler is not None:
            done = batch["next", "done"]
            scaled = [scaler(batch["next", "reward"][:, t], done[:, t]) for t in range(batch.shape[1])]
            batch["next", "reward"] = torch.stack(scaled, 1).float()
        # 2. advantages (terminated stops bootstrapping, truncated bootstraps)
        compute_advantage(batch, critic, cfg)
        flat = batch.reshape(-1)
        # 3. epochs x minibatches
        stats = []
        for _ in range(cfg.epochs):
            perm = torch.randperm(flat.shape[0], device=device)
            for start in range(0, flat.shape[0], cfg.minibatch_size):
                mb = flat[perm[start:start + cfg.minibatch_size]]
                out = loss_fn(mb)
                optim.zero_grad(set_to_none=True)
                total_loss(out).backward()
                nn.utils.clip_grad_norm_(loss_fn.parameters(), cfg.max_grad_norm)
                optim.step()
                stats.append(out.detach())
        it += 1
        # 4. log, evaluate, checkpoint
        frames = collector.frames
        row = {"iteration": it, "fps": frames / run.elapsed,
               "train_return": run.record_episodes(returns), "episodes": len(returns),
               "lr": optim.param_groups[0]["lr"],
               **{k: float(v) for k, v in torch.stack(stats).mean().items()}}
        if crossed(cfg.eval_every, frames - frames_per_batch, frames):
            row["eval_return"] = evaluate(actor, cfg, obs_norm, cfg.eval_episodes, cfg.seed + 10_000)
        run.log(frames, row, show=("train_return", "eval_return", "fps"))
        run.maybe_checkpoint(frames, extra={"iteration": it}, **state)
        if run.should_stop(row):
            break
    frames = collector.frames
    run.checkpoint(frames, extra={"iteration": it}, **state)
    collector.shutdown()
    env.close()
    eval_return = evaluate(actor, cfg, obs_norm, cfg.eval_episodes, cfg.seed + 20_000)
    torch.save(
        {"actor": actor.state_dict(), "critic": critic.state_dict(),
         "obs_norm": obs_norm.state_dict() if obs_norm is not None else None,
         "config": dataclasses.asdict(cfg)},
        os.path.join(cfg.out, "model.pt"),
    )
    return finish_env_run(run, cfg, frames, eval_return, f"PPO {cfg.env_id}", iterations=it)


def evaluate_checkpoint(cfg: Config, path: str | None = None) -> dict:
    """Evaluate a checkpoint (default: the latest in ``cfg.out/checkpoints``) with
    ``cfg.eval_episodes`` fresh deterministic episodes; works while its run still trains.

    Returns:
        ``{"frames": int, "eval_return": float, "checkpoint": str}``.
    """
    from tdrl.core.train import Checkpointer

    ckpt = Checkpointer(os.path.join(cfg.out, "checkpoints"))
    path = path or ckpt.latest()
    if path is None:
        raise FileNotFoundError(f"No checkpoint in {ckpt.directory}.")
    probe = make_env(cfg, 1, None)
    continuous = not isinstance(probe.action_spec, (Categorical, OneHot))
    actor, _ = make_actor_critic(probe, cfg)
    probe.close()
    objects = {"actor": actor}
    if (continuous if cfg.norm_obs is None else cfg.norm_obs):
        objects["obs_norm"] = VecNorm(clip=10.0)
    state = ckpt.load(path, restore_rng=False, **objects)
    ret = evaluate(actor, cfg, objects.get("obs_norm"), cfg.eval_episodes, cfg.seed + 20_000)
    return {"frames": int(state["extra"]["step"]), "eval_return": ret, "checkpoint": str(path)}


def run_app(cfg: Config) -> dict:
    """The app's task: train, or with ``eval_only`` evaluate the latest checkpoint."""
    if cfg.eval_only:
        result = evaluate_checkpoint(cfg)
        print(f"[ppo] {cfg.env_id}: {result}", flush=True)
        return result
    return train(cfg)


main = hydra_app(Config, run_app, name="ppo", recipes=Path(__file__).parent / "recipes")

if __name__ == "__main__":
    main()
