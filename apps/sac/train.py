"""Soft actor-critic (Haarnoja et al., 2018) on MuJoCo tasks; Pendulum-v1 as a quick option;
REDQ (Chen et al., 2021) with ``algorithm=redq``.

A linear TorchRL-style script built from tdrl parts: a :class:`GymEnv` (or the torch
:class:`PendulumEnv` with ``--env_id tdrl/Pendulum``), a :class:`ProbabilisticActor` with a
:class:`TanhNormal`, a Q network, :class:`SACLoss` (clipped double-Q, automatic entropy
tuning), a :class:`Collector` (uniformly random actions for the first ``learning_starts``
frames), a :class:`ReplayBuffer` over a :class:`LazyTensorStorage`, :class:`SoftUpdate` of
the target critics, and the run harness of ``tdrl.core.train`` (run folder, metrics,
checkpoints, exact resume). Each collected batch is one step
of every sub-env; then ``utd_ratio`` gradient steps on sampled batches per collected frame.
``algorithm=redq`` swaps in :class:`REDQLoss` (``num_critics`` critics, each target the min
over a random ``critic_subset`` of them, the actor on their mean); the paper's high
update-to-data ratio is ``utd_ratio`` (20 in the ``redq`` recipe).

    python apps/sac/train.py                                    # HalfCheetah-v5, 1M frames
    python apps/sac/train.py env_id=Pendulum-v1 total_frames=8000 learning_starts=500
    python apps/sac/train.py --config-name tiny                 # a seconds-long smoke run (CI)
    python apps/sac/train.py --config-name redq                 # REDQ: 10 critics, subsets of 2, UTD 20
    python apps/sac/train.py resume=true                        # continue from the last checkpoint

Outputs in ``out``: ``config.yaml``, ``metrics.csv`` (``step`` = frames), ``learning_curve.png``,
``summary.json``, ``model.pt``, ``checkpoints/step_<frames>.pt`` (actor, critics and
targets, temperature, optimiser, replay buffer, collector, metric history, RNG states) and
``tensorboard/`` when asked. With the torch ``tdrl/Pendulum`` env (its state travels in the
TensorDict) a resumed run is bit-identical to an uninterrupted one; the Gymnasium
simulators cannot be checkpointed, so there every sub-env starts a fresh episode on resume.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from tensordict.nn import TensorDictModule
from torch import nn

from tdrl.core import DoubleToFloat, RewardSum
from tdrl.core.collectors import Collector
from tdrl.core.envs import env_rng_state, make_env
from tdrl.core.modules import MLP, NormalParamExtractor, ProbabilisticActor, TanhNormal, ValueOperator
from tdrl.core.objectives import REDQLoss, SACLoss, SoftUpdate, total_loss
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
    """SAC on a continuous-action task. Defaults follow CleanRL's ``sac_continuous_action.py``
    (256x256 nets, batch 256, tau 0.005, 5k random frames)."""

    env_id: str = "HalfCheetah-v5"
    total_frames: int = 1_000_000
    learning_starts: int = 5_000
    buffer_size: int = 1_000_000
    actor_lr: float = 3e-4
    """Adam learning rate of the actor."""
    critic_lr: float = 1e-3
    """Adam learning rate of the critics and the temperature."""
    alpha_init: float = 1.0
    """Initial entropy temperature (tuned automatically)."""
    hidden: tuple[int, ...] = (256, 256)
    algorithm: str = "sac"
    """``sac`` (clipped double-Q over all critics) or ``redq`` (min over a random subset)."""
    num_critics: int = 2
    """Q networks in the ensemble (2 for SAC; the REDQ paper uses 10)."""
    critic_subset: int = 2
    """REDQ only: critics drawn per update for the target's minimum (the paper's M = 2)."""
    eval_episodes: int = 5
    checkpoint_every: int = 50_000
    """Frames between checkpoints; 0: only at the end."""
    out: str = "runs/sac"
    """Run folder (a new numbered one beside it if it holds an earlier run and resume is false)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (self.actor_lr > 0 and self.critic_lr > 0):
            raise ConfigError(f"Config.actor_lr={self.actor_lr} / critic_lr={self.critic_lr}: "
                              "learning rates must be > 0.")
        if self.algorithm not in ("sac", "redq"):
            raise ConfigError(f"Config.algorithm={self.algorithm!r}: expected 'sac' or 'redq'.")
        if self.num_critics < 1:
            raise ConfigError(f"Config.num_critics={self.num_critics}: must be >= 1.")
        if self.algorithm == "redq" and not 1 <= self.critic_subset <= self.num_critics:
            raise ConfigError(f"Config.critic_subset={self.critic_subset}: REDQ needs "
                              f"1 <= critic_subset <= num_critics={self.num_critics}.")


def env_for(cfg: Config, num_envs: int):
    """The task (Gymnasium, or the torch Pendulum for ``tdrl/Pendulum``) with float32
    observations and episode-return tracking."""
    return make_env(cfg.env_id, num_envs, (DoubleToFloat(), RewardSum()))


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


def train(cfg: Config) -> dict:
    """Run SAC with ``cfg``; returns a summary dict (also written to ``summary.json``)."""
    run = Run(cfg, cfg.algorithm, total=cfg.total_frames, unit="frames")
    torch.manual_seed(cfg.seed)
    device = torch.device(cfg.device)
    env = env_for(cfg, cfg.num_envs)
    actor, qvalue = make_actor_critic(env, cfg)
    if cfg.algorithm == "redq":
        loss_fn = REDQLoss(actor, qvalue, num_qvalue_nets=cfg.num_critics,
                           subset_size=cfg.critic_subset, gamma=cfg.gamma,
                           alpha_init=cfg.alpha_init).to(device)
    else:
        loss_fn = SACLoss(actor, qvalue, num_qvalue_nets=cfg.num_critics, gamma=cfg.gamma,
                          alpha_init=cfg.alpha_init).to(device)
    optim = torch.optim.Adam([
        {"params": list(actor.parameters()), "lr": cfg.actor_lr},
        {"params": list(loss_fn.qvalue.parameters()), "lr": cfg.critic_lr},
        {"params": list(loss_fn.temperature.parameters()), "lr": cfg.critic_lr},
    ])
    updater = SoftUpdate(loss_fn, tau=cfg.tau)
    buffer = ReplayBuffer(storage=LazyTensorStorage(min(cfg.buffer_size, cfg.total_frames), device=device),
                          batch_size=cfg.batch_size)
    collector = Collector(env, actor, frames_per_batch=cfg.num_envs, total_frames=cfg.total_frames,
                          init_random_frames=cfg.learning_starts, device=device, seed=cfg.seed)
    budget = UpdateBudget(cfg.utd_ratio, cfg.learning_starts)
    keep = ["observation", "action", ("next", "observation"), ("next", "reward"),
            ("next", "terminated")]

    # everything a checkpoint holds (the RNG states and the metric history are added)
    state = {"loss": loss_fn, "optim": optim, "buffer": buffer, "collector": collector, "budget": budget}
    if (env_rng := env_rng_state(env)) is not None:  # the torch env's episodes resume exactly
        state["env_rng"] = env_rng
    if run.start(**state) is not None and env_rng is None:
        collector.reset()  # the simulators restart: new episodes, seeded from the frame count
        collector.set_seed(cfg.seed + collector.frames)

    def evaluate(seed: int) -> dict:  # the deterministic policy
        return {"eval_return": evaluate_episodes(env_for(cfg, cfg.eval_episodes), actor, cfg.eval_episodes, seed)}

    log = OffPolicyLog(run, cfg, budget, evaluate, show=("train_return", "eval_return", "alpha"))
    for batch in collector:
        # 1. one step of every sub-env (uniformly random actions before learning_starts)
        frames, new = collector.frames, batch.numel()
        buffer.extend(batch.reshape(-1).select(*keep).to(device))
        log.add_batch(batch)
        # 2. gradient steps
        for _ in range(budget.add(frames, new)):
            out = loss_fn(buffer.sample())
            optim.zero_grad(set_to_none=True)
            total_loss(out).backward()
            optim.step()
            updater.step()
            log.add_stats(out)
        # 3. log, evaluate, checkpoint
        if log.step(frames, new, state):
            break
    model = {"actor": actor.state_dict(), "qvalue": loss_fn.qvalue.state_dict()}
    return log.close(collector, env, state, model, f"{cfg.algorithm.upper()} {cfg.env_id}")


main = hydra_app(Config, train, name="sac", recipes=Path(__file__).parent / "recipes")

if __name__ == "__main__":
    main()
