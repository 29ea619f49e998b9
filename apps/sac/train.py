"""Soft actor-critic (Haarnoja et al., 2018) on MuJoCo tasks; Pendulum-v1 as a quick option.

A linear TorchRL-style script built from tdrl parts: a :class:`GymEnv` (or the torch
:class:`PendulumEnv` with ``--env_id tdrl/Pendulum``), a :class:`ProbabilisticActor` with a
:class:`TanhNormal`, a Q network, :class:`SACLoss` (clipped double-Q, automatic entropy
tuning), a :class:`Collector` (uniformly random actions for the first ``learning_starts``
frames), a :class:`ReplayBuffer` over a :class:`LazyTensorStorage`, :class:`SoftUpdate` of
the target critics, and ``tdrl.core.train`` for the metrics (CSV, TensorBoard with
``--tensorboard``), the progress bar and atomic checkpoints. Each collected batch is one step
of every sub-env; then ``utd_ratio`` gradient steps on sampled batches per collected frame.

    python apps/sac/train.py                                        # HalfCheetah-v5, 1M frames
    python apps/sac/train.py --env_id Pendulum-v1 --total_frames 8000 --learning_starts 500
    python apps/sac/train.py --tiny                                 # a seconds-long smoke run (CI)
    python apps/sac/train.py ... --resume                           # continue from the last checkpoint

Outputs in ``--out``: ``metrics.csv`` (``step`` = frames), ``learning_curve.png``,
``summary.json``, ``model.pt``, ``checkpoints/step_<frames>.pt`` (actor, critics and
targets, temperature, optimiser, replay buffer, collector, metric history, RNG states) and
``tensorboard/`` when asked. With the torch ``tdrl/Pendulum`` env (its state travels in the
TensorDict) a resumed run is bit-identical to an uninterrupted one; the Gymnasium
simulators cannot be checkpointed, so there every sub-env starts a fresh episode on resume.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass

import torch
from tensordict.nn import TensorDictModule
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from ppo.app_utils import AppRun, episode_returns, evaluate_episodes, parse_config  # noqa: E402

from tdrl.core import Compose, DoubleToFloat, GymEnv, PendulumEnv, RewardSum, TransformedEnv
from tdrl.core.collectors import Collector
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
    checkpoint_every: int = 50_000  # frames between checkpoints (0: only at the end)
    resume: bool = False  # continue from the latest checkpoint in out/checkpoints
    tensorboard: bool = False  # also log to TensorBoard (out/tensorboard)
    progress: bool = True  # a progress bar with live metrics (stderr)
    out: str = "runs/sac"
    tiny: bool = False

    def __post_init__(self) -> None:
        if self.tiny:
            self.total_frames = min(self.total_frames, 200)
            self.learning_starts = min(self.learning_starts, 100)
            self.log_every = min(self.log_every, 50)
            self.eval_episodes = min(self.eval_episodes, 1)
            self.hidden = tuple(min(h, 32) for h in self.hidden)
            self.checkpoint_every = min(self.checkpoint_every, 100)
        if self.batch_size > self.buffer_size:
            raise ValueError(f"batch_size={self.batch_size} exceeds buffer_size={self.buffer_size}.")


TORCH_PENDULUM = "tdrl/Pendulum"


def make_env(cfg: Config, num_envs: int) -> TransformedEnv:
    """A Gymnasium vector env (or the torch Pendulum for ``tdrl/Pendulum``) with float32
    observations and episode-return tracking."""
    if cfg.env_id == TORCH_PENDULUM:
        base = PendulumEnv(batch_size=(num_envs,))
    else:
        base = GymEnv(cfg.env_id, num_envs=num_envs)
    return TransformedEnv(base, Compose(DoubleToFloat(), RewardSum()))


class GeneratorState:
    """``state_dict`` / ``load_state_dict`` of a ``torch.Generator`` (the torch Pendulum's
    reset RNG), so that a checkpoint resumes its episodes exactly."""

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator

    def state_dict(self) -> dict:
        return {"state": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["state"])


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
    run = AppRun(cfg, "sac")
    torch.manual_seed(cfg.seed)
    device = torch.device(cfg.device)
    env = make_env(cfg, cfg.num_envs)
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
    collector = Collector(env, actor, frames_per_batch=cfg.num_envs, total_frames=cfg.total_frames,
                          init_random_frames=cfg.learning_starts, device=device, seed=cfg.seed)
    keep = ["observation", "action", ("next", "observation"), ("next", "reward"),
            ("next", "terminated")]

    # everything a checkpoint holds (the RNG states and the metric history are added)
    state = {"loss": loss_fn, "optim": optim, "buffer": buffer, "collector": collector}
    exact_env = cfg.env_id == TORCH_PENDULUM  # its whole state is in the collector's TensorDict
    if exact_env:
        state["env_rng"] = GeneratorState(env.base_env._generator)
    loop = {"updates": 0, "debt": 0.0, "next_log": cfg.log_every,
            "next_eval": max(cfg.eval_every, cfg.learning_starts)}
    resumed = run.maybe_resume(**state)
    if resumed is not None:
        loop.update({k: resumed[k] for k in loop})
        if not exact_env:  # the simulators restart: new episodes, seeded from the frame count
            collector.reset()
            collector.set_seed(cfg.seed + collector.frames)

    returns, stats = [], []
    for batch in collector:
        # 1. one step of every sub-env (uniformly random actions before learning_starts)
        frames = collector.frames
        buffer.extend(batch.reshape(-1).select(*keep).to(device))
        returns += episode_returns(batch)
        # 2. gradient steps
        if frames >= cfg.learning_starts:
            loop["debt"] += cfg.utd_ratio * batch.numel()
            while loop["debt"] >= 1.0:
                loop["debt"] -= 1.0
                out = loss_fn(buffer.sample())
                optim.zero_grad(set_to_none=True)
                total_loss(out).backward()
                optim.step()
                updater.step()
                loop["updates"] += 1
                stats.append(out.detach())
        # 3. log, evaluate (deterministic policy), checkpoint
        row = {}
        if frames >= loop["next_log"]:
            loop["next_log"] += cfg.log_every
            row = {"updates": loop["updates"], "fps": frames / run.elapsed,
                   "train_return": run.record_episodes(returns), "episodes": len(returns)}
            if stats:
                row.update({k: float(v) for k, v in torch.stack(stats).mean().items()})
            returns, stats = [], []
        if cfg.eval_every and frames >= loop["next_eval"]:
            loop["next_eval"] += cfg.eval_every
            row["updates"] = loop["updates"]
            row["eval_return"] = evaluate(actor, cfg, cfg.eval_episodes, cfg.seed + 10_000)
        if row:
            run.log(frames, row, show=("train_return", "eval_return", "alpha"))
        run.maybe_checkpoint(frames, extra=dict(loop), **state)
        if cfg.stop_return is not None and row.get("eval_return", -float("inf")) >= cfg.stop_return:
            break
        if cfg.time_limit_s and run.elapsed > cfg.time_limit_s:
            break
    frames = collector.frames
    run.checkpoint(frames, extra=dict(loop), **state)
    collector.shutdown()
    env.close()
    eval_return = evaluate(actor, cfg, cfg.eval_episodes, cfg.seed + 20_000)
    torch.save({"actor": actor.state_dict(), "qvalue": loss_fn.qvalue.state_dict(),
                "config": dataclasses.asdict(cfg)}, os.path.join(cfg.out, "model.pt"))
    summary = run.finish(frames, eval_return, f"SAC {cfg.env_id}", updates=loop["updates"])
    print(f"[sac] {cfg.env_id}: eval return {eval_return:.1f} over {cfg.eval_episodes} "
          f"episodes after {frames} frames ({summary['time_s']:.0f} s)", flush=True)
    return summary


if __name__ == "__main__":
    torch.set_num_threads(int(os.environ.get("TDRL_THREADS", "1")))
    train(parse_config(Config, sys.argv[1:]))
