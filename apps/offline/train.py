"""Offline RL and imitation from a fixed dataset: BC, TD3+BC (Fujimoto & Gu, 2021), IQL
(Kostrikov et al., 2022), CQL (Kumar et al., 2020) and the Decision Transformer (Chen et al.,
2021) on a D4RL-style HDF5 file.

A linear script built from tdrl parts: the dataset (``dataset=FILE``, read by
:func:`tdrl.core.datasets.read_d4rl`; without one, a dataset of uniformly random actions on
``env_id`` is collected and written to ``out/dataset.hdf5`` first) in a :class:`ReplayBuffer`,
one loss per ``algorithm``, ``steps`` gradient steps on sampled batches, deterministic
evaluation episodes in the env every ``eval_every`` steps, and the run harness of
``tdrl.core.train``. ``algorithm=dt`` trains a :class:`DecisionTransformer` on windows of
``context`` steps (observations normalised by the dataset's mean and std, returns-to-go
divided by ``return_scale``) and evaluates it conditioned on the dataset's best episode
return (or ``target_return``), decremented by each reward.

    python apps/offline/train.py algorithm=td3_bc dataset=halfcheetah-medium.hdf5 env_id=HalfCheetah-v5
    python apps/offline/train.py -m algorithm=bc,td3_bc,iql,cql        # one folder each, sweep.jsonl
    python apps/offline/train.py --config-name dt dataset=DIR           # DT, the settings of RESULTS.md
    python apps/offline/train.py --config-name tiny                     # a seconds-long smoke run (CI)

Outputs in ``out``: ``config.yaml``, ``metrics.csv`` (``step`` = gradient steps),
``learning_curve.png``, ``summary.json`` (with the dataset's mean episode return beside the
policy's), ``model.pt`` and ``checkpoints/``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModule
from torch import nn

from tdrl.core import DoubleToFloat, RewardSum
from tdrl.core.collectors import Collector
from tdrl.core.datasets import read_d4rl, read_minari, write_d4rl
from tdrl.core.envs import make_env
from tdrl.core.modules import (MLP, Actor, DecisionTransformer, DecisionTransformerPolicy, NormalParamExtractor,
                               ProbabilisticActor, TanhNormal, ValueOperator)
from tdrl.core.objectives import (BCLoss, CQLLoss, DTLoss, IQLLoss, SoftUpdate, TD3BCLoss, returns_to_go,
                                  sample_windows, total_loss)
from tdrl.core.objectives.dt import episode_timesteps
from tdrl.core.replay import LazyTensorStorage, ReplayBuffer
from tdrl.core.train import ConfigError, EnvRunConfig, Run, crossed, evaluate_episodes, hydra_app, mean_metrics

ALGORITHMS = ("bc", "td3_bc", "iql", "cql", "dt")


@dataclass
class Config(EnvRunConfig):
    """Offline training of one algorithm on a fixed dataset, evaluated in the env."""

    env_id: str = "Pendulum-v1"
    algorithm: str = "td3_bc"
    """bc, td3_bc, iql, cql or dt."""
    dataset: str = ""
    """A D4RL-style HDF5 file or a local Minari dataset folder; empty: collect dataset_frames of
    random actions on env_id first."""
    dataset_frames: int = 10_000
    """Frames of the random dataset made when no dataset is given."""
    steps: int = 20_000
    """Gradient steps (the run's step unit)."""
    batch_size: int = 256
    """Transitions per gradient step."""
    lr: float = 3e-4
    """Adam learning rate of every network."""
    gamma: float = 0.99
    """Discount."""
    tau: float = 0.005
    """Polyak factor of the target networks."""
    hidden: tuple[int, ...] = (256, 256)
    context: int = 20
    """dt: window length K (steps per sequence)."""
    embed_dim: int = 64
    """dt: token width."""
    num_layers: int = 2
    """dt: transformer blocks (one head each)."""
    return_scale: float = 1000.0
    """dt: returns-to-go are divided by it."""
    target_from_dataset: bool = True
    """dt: condition the evaluation on the dataset's best episode return (false: on target_return)."""
    target_return: float = 0.0
    """dt: the return to condition on when target_from_dataset is false."""
    eval_episodes: int = 5
    eval_every: int = 5_000
    """Gradient steps between evaluations; 0: only at the end."""
    log_every: int = 500
    """Gradient steps between metrics rows."""
    checkpoint_every: int = 10_000
    """Gradient steps between checkpoints; 0: only at the end."""
    out: str = "runs/offline"
    """Run folder (a new numbered one beside it if it holds an earlier run and resume is false)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.algorithm not in ALGORITHMS:
            raise ConfigError(f"Config.algorithm={self.algorithm!r} is not allowed: expected one of {ALGORITHMS}.")
        if self.dataset and not Path(self.dataset).exists():
            raise ConfigError(f"Config.dataset={self.dataset!r}: no such file or folder (a D4RL-style HDF5 "
                              "file or a Minari dataset folder).")
        for name in ("steps", "batch_size", "log_every", "dataset_frames", "context", "embed_dim", "num_layers"):
            if getattr(self, name) < 1:
                raise ConfigError(f"Config.{name}={getattr(self, name)} is not allowed: expected an integer >= 1.")
        if not self.lr > 0 or not 0 < self.tau <= 1 or not 0 <= self.gamma <= 1:
            raise ConfigError(f"Config: lr={self.lr} must be > 0, tau={self.tau} in (0, 1], gamma={self.gamma} in [0, 1].")
        if not self.return_scale > 0:
            raise ConfigError(f"Config.return_scale={self.return_scale} is not allowed: expected > 0.")


def env_for(cfg: Config, num_envs: int):
    return make_env(cfg.env_id, num_envs, (DoubleToFloat(), RewardSum()))


def random_dataset(cfg: Config, path: Path) -> None:
    """``cfg.dataset_frames`` transitions of uniformly random actions, written as D4RL HDF5."""
    env = make_env(cfg.env_id, 1, (DoubleToFloat(),))
    collector = Collector(env, None, frames_per_batch=min(1_000, cfg.dataset_frames),
                          total_frames=cfg.dataset_frames, seed=cfg.seed)
    rows = torch.cat([b.reshape(-1) for b in collector])  # one env: steps in order
    collector.shutdown()
    env.close()
    done = rows["next", "done"].squeeze(-1)
    rows["episode"] = torch.cat([torch.zeros(1, dtype=torch.long), done[:-1].long().cumsum(0)])
    write_d4rl(rows, path, attrs={"env": cfg.env_id, "policy": "uniform random"})


def episode_mean_return(data: TensorDictBase) -> float:
    """Mean return of the dataset's complete episodes."""
    ends = data["next", "done"].squeeze(-1)
    sums = torch.zeros(int(data["episode"].max()) + 1).index_add_(0, data["episode"], data["next", "reward"].squeeze(-1))
    complete = torch.unique(data["episode"][ends])
    return float(sums[complete].mean()) if len(complete) else float("nan")


def episode_best_return(data: TensorDictBase) -> float:
    """Best return among the dataset's complete episodes."""
    ends = data["next", "done"].squeeze(-1)
    sums = torch.zeros(int(data["episode"].max()) + 1).index_add_(0, data["episode"], data["next", "reward"].squeeze(-1))
    return float(sums[torch.unique(data["episode"][ends])].max())


class _DT:
    """The Decision Transformer's data and evaluation: windows of normalised observations and
    scaled returns-to-go, and episodes conditioned on a target return."""

    def __init__(self, cfg: Config, data: TensorDictBase, obs_dim: int, act_dim: int, low: float, high: float):
        self.cfg = cfg
        obs = data["observation"].float()
        self.mean, self.std = obs.mean(0), obs.std(0).clamp_min(1e-3)
        episode = data["episode"]
        self.seq = TensorDict(observation=(obs - self.mean) / self.std, action=data["action"].float(),
                              returns_to_go=returns_to_go(data["next", "reward"].float(), episode)[:, None] / cfg.return_scale,
                              timestep=episode_timesteps(episode), episode=episode, batch_size=data.shape)
        self.target = episode_best_return(data) if cfg.target_from_dataset else cfg.target_return
        self.model = DecisionTransformer(obs_dim, act_dim, embed_dim=cfg.embed_dim, num_layers=cfg.num_layers,
                                         context=cfg.context, max_timestep=int(self.seq["timestep"].max()) + 2,
                                         action_low=low, action_high=high)

    def sample(self) -> TensorDict:
        return sample_windows(self.seq, self.cfg.context, self.cfg.batch_size)

    def evaluate(self, seed: int) -> float:
        """Mean return of ``eval_episodes`` first episodes, conditioned on the target."""
        from tdrl.core import step_mdp

        n = self.cfg.eval_episodes
        env = env_for(self.cfg, n)
        env.set_seed(seed)
        td = env.reset()
        policy = DecisionTransformerPolicy(self.model, self.target, n, self.cfg.return_scale)
        finished, returns = torch.zeros(n, dtype=torch.bool), torch.zeros(n)
        while not bool(finished.all()):
            td["action"] = policy.act((td["observation"].float() - self.mean) / self.std)
            td = env.step(td)
            policy.observe(td["next", "reward"].reshape(n))
            done = td["next", "done"].reshape(n)
            first = done & ~finished
            returns[first] = td["next", "episode_reward"].reshape(n)[first]
            finished |= done
            td = step_mdp(td)
            if bool(done.any()) and not bool(finished.all()):
                td["_reset"] = done.unsqueeze(-1)
                td = env.reset(td).exclude("_reset")
        env.close()
        self.model.train()
        return float(returns.mean())


def make_loss(cfg: Config, obs_dim: int, act_dim: int, low: float, high: float):
    """The algorithm's loss and the policy it trains."""
    def q():
        return ValueOperator(MLP(obs_dim + act_dim, 1, cfg.hidden, nn.ReLU), in_keys=["observation", "action"],
                             out_keys=["state_action_value"])

    if cfg.algorithm in ("bc", "td3_bc"):
        scale = (high - low) / 2
        actor = Actor(nn.Sequential(MLP(obs_dim, act_dim, cfg.hidden, nn.ReLU), nn.Tanh(), _Scale(scale, low + scale)))
        if cfg.algorithm == "bc":
            return BCLoss(actor), actor
        return TD3BCLoss(actor, q(), action_low=low, action_high=high, gamma=cfg.gamma), actor
    params = TensorDictModule(nn.Sequential(MLP(obs_dim, 2 * act_dim, cfg.hidden, nn.ReLU), NormalParamExtractor()),
                              in_keys=["observation"], out_keys=["loc", "scale"])
    actor = ProbabilisticActor(params, TanhNormal, distribution_kwargs={"low": low, "high": high},
                               return_log_prob=False)
    if cfg.algorithm == "iql":
        value = ValueOperator(MLP(obs_dim, 1, cfg.hidden, nn.ReLU))
        return IQLLoss(actor, q(), value, gamma=cfg.gamma), actor
    return CQLLoss(actor, q(), action_low=low, action_high=high, gamma=cfg.gamma), actor


class _Scale(nn.Module):
    """``x * scale + shift``: a tanh output mapped onto the action bounds."""

    def __init__(self, scale: float, shift: float) -> None:
        super().__init__()
        self.scale, self.shift = scale, shift

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale + self.shift


def train(cfg: Config) -> dict:
    """Train ``cfg.algorithm`` on the dataset; returns the summary (also ``summary.json``)."""
    run = Run(cfg, "offline", total=cfg.steps)
    torch.manual_seed(cfg.seed)
    path = Path(cfg.dataset) if cfg.dataset else run.out / "dataset.hdf5"
    if not cfg.dataset and not path.exists():
        random_dataset(cfg, path)
    data = read_minari(path) if path.is_dir() else read_d4rl(path)
    buffer = ReplayBuffer(storage=LazyTensorStorage(data.shape[0]), batch_size=cfg.batch_size)
    buffer.extend(data.exclude("episode"))
    probe = env_for(cfg, 1)
    spec = probe.action_spec
    low, high = float(spec.low.min()), float(spec.high.max())
    obs_dim, act_dim = probe.observation_spec["observation"].shape[-1], spec.shape[-1]
    probe.close()
    dt = _DT(cfg, data, obs_dim, act_dim, low, high) if cfg.algorithm == "dt" else None
    loss_fn, actor = (DTLoss(dt.model), dt.model) if dt else make_loss(cfg, obs_dim, act_dim, low, high)
    optim = torch.optim.Adam(loss_fn.parameters(), lr=cfg.lr)
    updater = SoftUpdate(loss_fn, tau=cfg.tau) if cfg.algorithm not in ("bc", "dt") else None
    state = {"loss": loss_fn, "optim": optim}
    resumed = run.start(**state)
    start = int(resumed["step"]) if resumed else 0

    def evaluate(seed: int) -> float:
        if dt is not None:
            return dt.evaluate(seed)
        return evaluate_episodes(env_for(cfg, cfg.eval_episodes), actor, cfg.eval_episodes, seed)

    stats = []
    for step in range(start + 1, cfg.steps + 1):
        out = loss_fn(dt.sample() if dt else buffer.sample())
        optim.zero_grad(set_to_none=True)
        total_loss(out).backward()
        if dt is not None:  # the paper clips the gradient norm at 0.25
            nn.utils.clip_grad_norm_(loss_fn.parameters(), 0.25)
        optim.step()
        if updater is not None:
            updater.step()
        stats.append(out.detach())
        row = {}
        if crossed(cfg.log_every, step - 1, step):
            row, stats = mean_metrics(stats), []
        if crossed(cfg.eval_every, step - 1, step):
            row["eval_return"] = evaluate(cfg.seed + 10_000)
        if row:
            run.log(step, row, show=("eval_return", "loss_actor"))
        run.maybe_checkpoint(step, **state)
        if run.should_stop(row):
            break
    run.checkpoint(run.step, **state)
    eval_return = evaluate(cfg.seed + 20_000)
    run.log(run.step, {"eval_return": eval_return})
    extra = {"obs_mean": dt.mean, "obs_std": dt.std, "target_return": dt.target} if dt else {}
    torch.save({"actor": actor.state_dict(), "algorithm": cfg.algorithm, **extra}, os.path.join(cfg.out, "model.pt"))
    summary = run.finish({"algorithm": cfg.algorithm, "env_id": cfg.env_id, "steps": run.step, "dataset": str(path),
                          "dataset_transitions": data.shape[0], "dataset_return": episode_mean_return(data),
                          "eval_return": eval_return, "eval_episodes": cfg.eval_episodes},
                         plots={"learning_curve.png": ("step", ["eval_return"])}, title=f"{cfg.algorithm} {cfg.env_id}")
    print(f"[offline] {cfg.algorithm} on {cfg.env_id}: eval return {eval_return:.1f} (dataset episodes: "
          f"{summary['dataset_return']:.1f}) after {run.step} steps", flush=True)
    return summary


main = hydra_app(Config, train, name="offline", recipes=Path(__file__).parent / "recipes")

if __name__ == "__main__":
    main()
