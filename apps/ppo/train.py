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
    python apps/ppo/train.py n_seeds=3                    # seeds 0,1,2 as one vectorised model
    python apps/ppo/train.py resume=true                  # continue from the last checkpoint
    python apps/ppo/train.py --help                       # every setting, documented

Outputs in ``out``: ``config.yaml``, ``metrics.csv`` (one row per iteration, ``step`` =
frames), ``learning_curve.png``, ``summary.json``, ``model.pt`` (actor, critic and
observation-normalisation state), ``checkpoints/step_<frames>.pt`` (model, optimiser,
collector, normalisers, metric history, RNG states) and ``tensorboard/`` when asked.
A resumed run restores all of that; the Gymnasium simulators themselves cannot be
checkpointed, so every sub-env starts a fresh episode (seeded from the frame count).

With ``n_seeds=K`` the seeds ``seed, ..., seed+K-1`` train in one process as one model
(:class:`tdrl.core.train.SeedAxis`): one env of ``K`` seed-major blocks of ``num_envs`` sub-envs
(block ``k`` seeded as a single run of seed ``seed+k``), actor and critic stacked over the
seeds and evaluated with ``vmap``, one Adam with gradients clipped per seed, advantages
normalised and rewards scaled per seed. ``total_frames``, ``minibatch_size`` and the logged
``step`` are per seed; ``fps`` counts every seed's frames. ``metrics.csv`` and
``summary.json`` hold ``train_return/seed_<s>`` / ``eval_return/seed_<s>`` beside the means
over seeds. Observation normalisation (statistics shared by the sub-envs) is refused there.
It composes with a sweep: ``-m seed=0,3 n_seeds=3`` runs seeds 0-2 and 3-5.
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
from tdrl.core.train import ConfigError, EnvRunConfig, Run, SeedAxis, crossed, finish_env_run, hydra_app
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
    n_seeds: int = 1
    """Seeds seed..seed+n_seeds-1 trained in one process as one vectorised model (per-seed
    metrics); total_frames and minibatch_size are per seed."""

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("num_steps", "epochs", "minibatch_size", "n_seeds"):
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
        axis = SeedAxis(run_seeds(self))
        axis.refuse_shared("Config.norm_obs=true: the running observation statistics", bool(self.norm_obs),
                           "set norm_obs=false")
        axis.refuse_shared(f"Config.env_id={self.env_id}: the torch env's one generator for every sub-env",
                           self.env_id in TORCH_ENVS, "use a Gymnasium task")


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
def evaluate(actor, cfg: Config, obs_norm: VecNorm | None, episodes: int, offset: int, axis: SeedAxis) -> list[float]:
    """Mean return of ``episodes`` episodes of the deterministic policy per run seed (one per
    sub-env, block ``k`` seeded as seed ``axis.seeds[k] + offset``'s single run), with a frozen
    copy of the observation statistics."""
    eval_norm = None
    if obs_norm is not None:
        eval_norm = VecNorm(clip=obs_norm.clip)
        eval_norm.load_state_dict(obs_norm.state_dict())
        eval_norm.freeze()
    return axis.evaluate(lambda n: make_env(cfg, n, eval_norm), actor, episodes, offset)


def ppo_update(flat: TensorDictBase, loss_fn: PPOLoss, optim: torch.optim.Optimizer, cfg: Config,
               axis: SeedAxis) -> list[TensorDictBase]:
    """``epochs`` passes of shuffled minibatches over one batch; returns the loss outputs.

    Args:
        flat: the batch flattened to ``[n_seeds * N]`` (seed-major blocks of ``N`` frames).
        loss_fn, optim: the PPO loss (over the axis's networks) and Adam.
        cfg: ``epochs``, ``minibatch_size`` (per seed), ``max_grad_norm``, ``normalize_advantage``.
        axis: the run's seeds. Each minibatch takes the same positions of every seed's block;
            advantages are normalised within each seed, each seed gets the gradient of its own
            mean loss, and gradients are clipped per seed, so a seed's update does not depend
            on the other seeds' data.
    """
    stats = []
    for _ in range(cfg.epochs):
        for mb in axis.minibatches(flat, cfg.minibatch_size):
            if cfg.normalize_advantage:
                mb["advantage"] = axis.normalize(mb["advantage"])
            out = loss_fn(mb)
            optim.zero_grad(set_to_none=True)
            axis.backward(total_loss(out))
            axis.clip_grad_norm_(loss_fn.parameters(), cfg.max_grad_norm)
            optim.step()
            stats.append(out.detach())
    return stats


# ---------------------------------------------------------------------------- training
def run_seeds(cfg: Config) -> list[int]:
    """The seeds of a run: ``seed, ..., seed + n_seeds - 1``."""
    return [cfg.seed + k for k in range(cfg.n_seeds)]


def _resolved_norms(cfg: Config, axis: SeedAxis) -> tuple[bool, bool]:
    probe_env = make_env(cfg, 1, None)
    continuous = not isinstance(probe_env.action_spec, (Categorical, OneHot))
    probe_env.close()
    norm_obs = continuous if cfg.norm_obs is None else cfg.norm_obs
    norm_reward = continuous if cfg.norm_reward is None else cfg.norm_reward
    axis.refuse_shared(f"{cfg.env_id} has continuous actions, so norm_obs defaults to true: the running "
                       "observation statistics", norm_obs, "set norm_obs=false (rewards are scaled per seed)")
    return norm_obs, norm_reward


def train(cfg: Config, seeds: list[int] | None = None) -> dict:
    """Run PPO with ``cfg``; returns a summary dict (also written to ``summary.json``).

    Args:
        cfg: the config.
        seeds: the seeds trained together (default :func:`run_seeds`: ``seed`` ..
            ``seed + n_seeds - 1``) as one vectorised model (:class:`SeedAxis`).
    """
    axis = SeedAxis(run_seeds(cfg) if seeds is None else seeds, cfg.num_envs)
    run = Run(cfg, "ppo", total=cfg.total_frames, unit="frames")
    torch.manual_seed(cfg.seed)
    device = torch.device(cfg.device)
    norm_obs, norm_reward = _resolved_norms(cfg, axis)
    obs_norm = VecNorm(clip=10.0) if norm_obs else None
    env = make_env(cfg, axis.num_envs, obs_norm)
    scalers = [ReturnScaler(cfg.num_envs, cfg.gamma) for _ in axis.seeds] if norm_reward else None

    actor, critic = axis.build(lambda seed: make_actor_critic(env, cfg))
    actor, critic = actor.to(device), critic.to(device)
    loss_fn = PPOLoss(  # advantages are normalised per seed in ppo_update
        actor, critic, clip_epsilon=cfg.clip_epsilon, entropy_coef=cfg.entropy_coef,
        critic_coef=cfg.critic_coef, clip_value=cfg.clip_value or None,
    )
    optim = torch.optim.Adam(loss_fn.parameters(), lr=cfg.lr, eps=1e-5)
    frames_per_batch = cfg.num_envs * cfg.num_steps  # per seed
    n_iters = cfg.total_frames // frames_per_batch
    collector = Collector(env, actor, frames_per_batch=axis.n * frames_per_batch,
                          total_frames=n_iters * axis.n * frames_per_batch, device=device)
    axis.seed_envs(env)  # block k starts as a single run of seed seeds[k]

    # everything a checkpoint holds (the RNG states and the metric history are added)
    state = {"actor": actor, "critic": critic, "optim": optim, "collector": collector}
    if obs_norm is not None:
        state["obs_norm"] = obs_norm
    if scalers is not None:
        state.update(axis.state("scaler", scalers))
    if (env_rng := env_rng_state(env)) is not None:  # a torch env: its episodes resume exactly
        state["env_rng"] = env_rng
    resumed = run.start(**state)
    it = 0
    if resumed is not None:
        it = int(resumed["iteration"])
        if env_rng is None:  # the simulators restart: new episodes, seeded from the frame count
            collector.reset()
            axis.seed_envs(env, offset=collector.frames // axis.n)

    for batch in collector:
        if cfg.anneal_lr:
            for g in optim.param_groups:
                g["lr"] = cfg.lr * (1.0 - it / n_iters)
        # 1. the batch [n_seeds * num_envs, num_steps] came from the stochastic policy
        batch = batch.to(device)
        returns = axis.episode_returns(batch)
        if scalers is not None:
            done, reward = axis.split(batch["next", "done"]), axis.split(batch["next", "reward"])
            scaled = [torch.stack([sc(reward[k][:, t], done[k][:, t]) for t in range(batch.shape[1])], 1)
                      for k, sc in enumerate(scalers)]
            batch["next", "reward"] = torch.cat(scaled, 0).float()
        # 2. advantages (terminated stops bootstrapping, truncated bootstraps)
        compute_advantage(batch, critic, cfg)
        # 3. epochs x minibatches
        stats = ppo_update(batch.reshape(-1), loss_fn, optim, cfg, axis)
        it += 1
        # 4. log, evaluate, checkpoint
        frames = collector.frames // axis.n
        row = {"iteration": it, "fps": collector.frames / run.elapsed,
               "train_return": run.record_episodes([r for rs in returns for r in rs]),
               "episodes": sum(len(r) for r in returns), "lr": optim.param_groups[0]["lr"],
               **{k: float(v) for k, v in torch.stack(stats).mean().items()}}
        row.update(zip(axis.names("train_return"), (sum(r) / len(r) if r else math.nan for r in returns)))
        if crossed(cfg.eval_every, frames - frames_per_batch, frames):
            row.update(axis.metrics("eval_return", evaluate(actor, cfg, obs_norm, cfg.eval_episodes, 10_000, axis)))
        run.log(frames, row, show=("train_return", "eval_return", "fps"))
        run.maybe_checkpoint(frames, extra={"iteration": it}, **state)
        if run.should_stop(row):
            break
    frames = collector.frames // axis.n
    run.checkpoint(frames, extra={"iteration": it}, **state)
    collector.shutdown()
    env.close()
    evals = evaluate(actor, cfg, obs_norm, cfg.eval_episodes, 20_000, axis)
    torch.save(
        {"actor": actor.state_dict(), "critic": critic.state_dict(),
         "obs_norm": obs_norm.state_dict() if obs_norm is not None else None,
         "config": dataclasses.asdict(cfg), "seeds": axis.seeds},
        os.path.join(cfg.out, "model.pt"),
    )
    final = axis.metrics("eval_return", evals)
    if per_seed := {k: final[k] for k in axis.names("eval_return")}:
        run.log(frames, per_seed)
    return finish_env_run(run, cfg, frames, final["eval_return"], f"PPO {cfg.env_id}", iterations=it,
                          **axis.summary("eval_return", evals))


def evaluate_checkpoint(cfg: Config, path: str | None = None) -> dict:
    """Evaluate a checkpoint (default: the latest in ``cfg.out/checkpoints``) with
    ``cfg.eval_episodes`` fresh deterministic episodes; works while its run still trains.

    Returns:
        ``{"frames": int, "eval_return": float, "checkpoint": str}`` (with several seeds
        also ``eval_return_seeds``, and ``eval_return`` their mean).
    """
    from tdrl.core.train import Checkpointer

    ckpt = Checkpointer(os.path.join(cfg.out, "checkpoints"))
    path = path or ckpt.latest()
    if path is None:
        raise FileNotFoundError(f"No checkpoint in {ckpt.directory}.")
    axis = SeedAxis(run_seeds(cfg))
    norm_obs, _ = _resolved_norms(cfg, axis)
    probe = make_env(cfg, axis.n, None)
    actor, _ = axis.build(lambda seed: make_actor_critic(probe, cfg))
    probe.close()
    objects = {"actor": actor}
    if norm_obs:
        objects["obs_norm"] = VecNorm(clip=10.0)
    state = ckpt.load(path, restore_rng=False, **objects)
    evals = evaluate(actor, cfg, objects.get("obs_norm"), cfg.eval_episodes, 20_000, axis)
    return {"frames": int(state["extra"]["step"]), "eval_return": sum(evals) / len(evals), "checkpoint": str(path),
            **{k: v for k, v in axis.summary("eval_return", evals).items() if k != "seeds"}}


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
