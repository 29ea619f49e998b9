"""Soft actor-critic (Haarnoja et al., 2018) on MuJoCo tasks; Pendulum-v1 as a quick option.

A linear CleanRL-style script built from tdrl parts: a :class:`GymEnv`, a
:class:`ProbabilisticActor` with a :class:`TanhNormal`, a Q network, :class:`SACLoss`
(clipped double-Q, automatic entropy tuning), a :class:`ReplayBuffer` over a
:class:`LazyTensorStorage` and :class:`SoftUpdate` of the target critics. Each step:
act (uniformly at random for the first ``learning_starts`` frames), store the transition,
then ``utd_ratio`` gradient steps on sampled batches.

    python apps/sac/train.py                                        # HalfCheetah-v5, 1M frames
    python apps/sac/train.py --env_id Pendulum-v1 --total_frames 8000 --learning_starts 500
    python apps/sac/train.py --tiny                                 # a seconds-long smoke run (CI)

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
from tensordict.nn import InteractionType, TensorDictModule, set_interaction_type
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from ppo.app_utils import MetricsCSV, evaluate_episodes, parse_config, plot_curve  # noqa: E402

from tdrl.core import Compose, DoubleToFloat, GymEnv, RewardSum, TransformedEnv
from tdrl.core.modules import MLP, NormalParamExtractor, ProbabilisticActor, TanhNormal, ValueOperator
from tdrl.core.objectives import SACLoss, SoftUpdate, total_loss
from tdrl.core.replay import LazyTensorStorage, ReplayBuffer


@dataclass
class Config:
    """Every knob of the app; each field is a ``--flag``. Defaults follow CleanRL's
    ``sac_continuous_action.py`` (256x256 nets, batch 256, tau 0.005, 5k random frames)."""

    env_id: str = "HalfCheetah-v5"
    total_frames: int = 1_000_000
    num_envs: int = 1
    learning_starts: int = 5_000
    buffer_size: int = 1_000_000
    batch_size: int = 256
    utd_ratio: float = 1.0  # gradient steps per collected frame
    actor_lr: float = 3e-4
    critic_lr: float = 1e-3
    gamma: float = 0.99
    tau: float = 0.005
    alpha_init: float = 1.0
    hidden: tuple[int, ...] = (256, 256)
    eval_episodes: int = 5
    eval_every: int = 0  # frames between evaluations during training (0: only at the end)
    stop_return: float | None = None  # stop once an evaluation reaches this mean return
    log_every: int = 1_000  # frames between CSV rows
    seed: int = 0
    device: str = "cpu"
    time_limit_s: float = 0.0  # stop training after this many seconds (0: no limit)
    out: str = "runs/sac"
    tiny: bool = False

    def __post_init__(self) -> None:
        if self.tiny:
            self.total_frames = min(self.total_frames, 200)
            self.learning_starts = min(self.learning_starts, 100)
            self.log_every = min(self.log_every, 50)
            self.eval_episodes = min(self.eval_episodes, 1)
            self.hidden = tuple(min(h, 32) for h in self.hidden)
        if self.batch_size > self.buffer_size:
            raise ValueError(f"batch_size={self.batch_size} exceeds buffer_size={self.buffer_size}.")


def make_env(cfg: Config, num_envs: int) -> TransformedEnv:
    """A Gymnasium vector env with float32 observations and episode-return tracking."""
    base = GymEnv(cfg.env_id, num_envs=num_envs)
    return TransformedEnv(base, Compose(DoubleToFloat(), RewardSum()))


def make_actor_critic(env, cfg: Config):
    """Tanh-Gaussian actor squashed to the action bounds, and one Q network."""
    obs_dim = env.observation_spec["observation"].shape[-1]
    spec = env.action_spec
    act_dim = spec.shape[-1]
    net = nn.Sequential(MLP(obs_dim, 2 * act_dim, cfg.hidden, nn.ReLU), NormalParamExtractor())
    params = TensorDictModule(net, in_keys=["observation"], out_keys=["loc", "scale"])
    low, high = spec.low.reshape(-1, act_dim)[0], spec.high.reshape(-1, act_dim)[0]
    actor = ProbabilisticActor(params, TanhNormal, distribution_kwargs={"low": low, "high": high},
                               return_log_prob=False)
    qnet = MLP(obs_dim + act_dim, 1, cfg.hidden, nn.ReLU)
    qvalue = ValueOperator(qnet, in_keys=["observation", "action"],
                           out_keys=["state_action_value"])
    return actor, qvalue


@torch.no_grad()
def evaluate(actor, cfg: Config, episodes: int, seed: int) -> float:
    """Mean return of ``episodes`` episodes of the deterministic policy (one per sub-env)."""
    env = make_env(cfg, episodes)
    return evaluate_episodes(env, actor, episodes, seed)


def train(cfg: Config) -> dict:
    """Run SAC with ``cfg``; returns a summary dict (also written to ``summary.json``)."""
    os.makedirs(cfg.out, exist_ok=True)
    torch.manual_seed(cfg.seed)
    device = torch.device(cfg.device)
    env = make_env(cfg, cfg.num_envs)
    env.set_seed(cfg.seed)
    actor, qvalue = make_actor_critic(env, cfg)
    loss_fn = SACLoss(actor, qvalue, gamma=cfg.gamma, alpha_init=cfg.alpha_init).to(device)
    optim = torch.optim.Adam([
        {"params": list(actor.parameters()), "lr": cfg.actor_lr},
        {"params": list(loss_fn.qvalue.parameters()), "lr": cfg.critic_lr},
        {"params": list(loss_fn.temperature.parameters()), "lr": cfg.critic_lr},
    ])
    updater = SoftUpdate(loss_fn, tau=cfg.tau)
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
        # 1. act and store
        with torch.no_grad(), set_interaction_type(InteractionType.RANDOM):
            td = env.rand_action(td) if frames < cfg.learning_starts else actor(td.to(device))
        td, next_td = env.step_and_maybe_reset(td)
        buffer.extend(td.select(*keep).to(device))
        done = td["next", "done"].squeeze(-1)
        recent += td["next", "episode_reward"].squeeze(-1)[done].tolist()
        td = next_td
        frames += cfg.num_envs
        # 2. gradient steps
        if frames >= cfg.learning_starts:
            debt += cfg.utd_ratio * cfg.num_envs
            while debt >= 1.0:
                debt -= 1.0
                out = loss_fn(buffer.sample())
                optim.zero_grad(set_to_none=True)
                total_loss(out).backward()
                optim.step()
                updater.step()
                updates += 1
                stats.append(out.detach())
        # 3. log
        if frames >= next_log:
            next_log += cfg.log_every
            elapsed = time.perf_counter() - t0
            row = {"frames": frames, "updates": updates, "time_s": round(elapsed, 2),
                   "fps": round(frames / elapsed, 1),
                   "train_return": sum(recent) / len(recent) if recent else float("nan"),
                   "episodes": len(recent)}
            if stats:
                row.update({k: float(v) for k, v in torch.stack(stats).mean().items()})
            log.log(row)
            print(f"[sac] frames {frames:8d} return {row['train_return']:9.1f} "
                  f"fps {row['fps']:6.0f}", flush=True)
            recent, stats = [], []
        # 4. evaluate (deterministic policy) and maybe stop
        if cfg.eval_every and frames >= next_eval:
            next_eval += cfg.eval_every
            ret = evaluate(actor, cfg, cfg.eval_episodes, cfg.seed + 10_000)
            log.log({"frames": frames, "updates": updates, "eval_return": ret})
            print(f"[sac] frames {frames:8d} eval return {ret:9.1f}", flush=True)
            if cfg.stop_return is not None and ret >= cfg.stop_return:
                break
    env.close()
    eval_return = evaluate(actor, cfg, cfg.eval_episodes, cfg.seed + 20_000)
    log.log({"frames": frames, "updates": updates, "eval_return": eval_return})
    plot_curve(log.rows, os.path.join(cfg.out, "learning_curve.png"), f"SAC {cfg.env_id}")
    torch.save({"actor": actor.state_dict(), "qvalue": loss_fn.qvalue.state_dict(),
                "config": dataclasses.asdict(cfg)}, os.path.join(cfg.out, "model.pt"))
    summary = {"env_id": cfg.env_id, "frames": frames, "updates": updates,
               "eval_return": eval_return, "eval_episodes": cfg.eval_episodes,
               "time_s": time.perf_counter() - t0}
    with open(os.path.join(cfg.out, "summary.json"), "w") as fh:
        json.dump(summary, fh, indent=2)
    print(f"[sac] {cfg.env_id}: eval return {eval_return:.1f} over {cfg.eval_episodes} "
          f"episodes after {frames} frames ({summary['time_s']:.0f} s)", flush=True)
    return summary


if __name__ == "__main__":
    torch.set_num_threads(int(os.environ.get("TDRL_THREADS", "1")))
    train(parse_config(Config, sys.argv[1:]))
