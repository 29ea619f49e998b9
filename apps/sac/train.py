"""Soft actor-critic (Haarnoja et al., 2018) on MuJoCo tasks; Pendulum-v1 as a quick option;
REDQ (Chen et al., 2021) with ``algorithm=redq``.

A linear TorchRL-style script built from tdrl parts: a :class:`GymEnv` (or the torch
:class:`PendulumEnv` with ``--env_id tdrl/Pendulum``), a :class:`ProbabilisticActor` with a
:class:`TanhNormal`, a Q network, :class:`SACLoss` (clipped double-Q, automatic entropy
tuning), a :class:`Collector` (uniformly random actions for the first ``learning_starts``
frames), a :class:`ReplayBuffer` over a :class:`LazyTensorStorage`, :class:`SoftUpdate` of
the target critics, and the run harness of ``tdrl.core.train`` (run folder, metrics,
checkpoints, exact resume). Each collected batch is one step
of every sub-env; then ``utd_ratio`` gradient steps on sampled batches per collected frame,
the actor and temperature stepping on every ``policy_delay``-th of them (1 for SAC: every step).
``algorithm=redq`` swaps in :class:`REDQLoss` (``num_critics`` critics, each target the min
over a random ``critic_subset`` of them, the actor on their mean); the paper's high
update-to-data ratio is ``utd_ratio`` (20 in the ``redq`` recipe) and its Algorithm 1 steps
the policy once per environment step, after the ``G`` critic steps: ``policy_delay = G``
(the recipe's 20; the actor's step shares the batch of the ``G``-th critic step, as the
authors' code does).

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

With ``n_seeds=K`` the seeds ``seed, ..., seed+K-1`` train in one process as one model
(:class:`tdrl.core.train.SeedAxis`): one env of ``K`` seed-major blocks of ``num_envs`` sub-envs
(block ``k`` seeded as a single run of seed ``seed+k``), each seed's loss built as its single
run builds it and stacked (``stack_losses``: actor, critics and target critics with a
leading seed dim, one temperature per seed), one replay storage whose item ``i`` holds every
seed's ``i``-th transition (``to_seed_items``: each seed samples only its own data, the same
slots for all), one Adam (element-wise, so per seed). ``total_frames``, ``learning_starts``,
``buffer_size``, ``batch_size`` and the logged ``step`` are per seed; ``fps`` counts every
seed's frames. ``metrics.csv`` and ``summary.json`` hold ``train_return/seed_<s>``,
``eval_return/seed_<s>`` and ``alpha/seed_<s>`` beside the means over seeds. One generator
draws for all seeds (actions, replay slots, REDQ's critic subsets), so a seed equals its single
run given the same data, not sample for sample. The torch ``tdrl/Pendulum`` (one generator
for every sub-env) is refused.

    python apps/sac/train.py env_id=Pendulum-v1 n_seeds=3 total_frames=8000 learning_starts=500
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar
from pathlib import Path

import torch
from tensordict.nn import TensorDictModule
from torch import nn

from tdrl.core import DoubleToFloat, RewardSum
from tdrl.core.collectors import Collector
from tdrl.core.envs import TORCH_ENVS, env_rng_state, make_env
from tdrl.core.modules import MLP, NormalParamExtractor, ProbabilisticActor, TanhNormal, ValueOperator
from tdrl.core.objectives import REDQLoss, SACLoss, SoftUpdate, total_loss
from tdrl.core.replay import LazyTensorStorage, ReplayBuffer
from tdrl.core.train import ConfigError, OffPolicyConfig, OffPolicyLog, Run, SeedAxis, UpdateBudget, hydra_app


@dataclass
class Config(OffPolicyConfig):
    """SAC on a continuous-action task. Defaults follow CleanRL's ``sac_continuous_action.py``
    (256x256 nets, batch 256, tau 0.005, 5k random frames)."""

    action_kinds: ClassVar[tuple[str, ...]] = ("continuous",)

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
    policy_delay: int = 1
    """Gradient steps per actor (and temperature) step: the actor steps on every
    policy_delay-th update, the others update the critics only. 1: SAC (every step); REDQ's
    Algorithm 1: utd_ratio (one policy step per environment step)."""
    eval_episodes: int = 5
    checkpoint_every: int = 50_000
    """Frames between checkpoints; 0: only at the end."""
    out: str = "runs/sac"
    """Run folder (a new numbered one beside it if it holds an earlier run and resume is false)."""
    n_seeds: int = 1
    """Seeds seed..seed+n_seeds-1 trained in one process as one vectorised model (per-seed
    metrics); total_frames, learning_starts, buffer_size and batch_size are per seed."""

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
        if not isinstance(self.policy_delay, int) or self.policy_delay < 1:
            raise ConfigError(f"Config.policy_delay={self.policy_delay!r}: expected an integer >= 1.")
        if self.n_seeds < 1:
            raise ConfigError(f"Config.n_seeds={self.n_seeds} is not allowed: expected an integer >= 1.")
        SeedAxis(run_seeds(self)).refuse_shared(
            f"Config.env_id={self.env_id}: the torch env's one generator for every sub-env",
            self.env_id in TORCH_ENVS, "use a Gymnasium task (e.g. Pendulum-v1)")


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


def make_loss(env, cfg: Config):
    """The actor and the SAC / REDQ loss of one seed (its critics, target critics and
    temperature), on the CPU."""
    actor, qvalue = make_actor_critic(env, cfg)
    if cfg.algorithm == "redq":
        return REDQLoss(actor, qvalue, num_qvalue_nets=cfg.num_critics, subset_size=cfg.critic_subset,
                        gamma=cfg.gamma, alpha_init=cfg.alpha_init)
    return SACLoss(actor, qvalue, num_qvalue_nets=cfg.num_critics, gamma=cfg.gamma, alpha_init=cfg.alpha_init)


def run_seeds(cfg: Config) -> list[int]:
    """The seeds of a run: ``seed, ..., seed + n_seeds - 1``."""
    return [cfg.seed + k for k in range(cfg.n_seeds)]


def build_loss(env, cfg: Config, axis: SeedAxis):
    """The loss of the axis's seeds, seed ``s`` initialised as a single run of seed ``s``
    (``torch.manual_seed(s)`` then :func:`make_loss`), stacked over the seeds."""
    return axis.build_loss(lambda seed: make_loss(env, cfg))


def sac_update(loss_fn, optim: torch.optim.Optimizer, batch, axis: SeedAxis, actor: bool = True):
    """One gradient step on ``batch`` (``[n_seeds * B]`` seed-major rows); returns the loss
    output. Each seed's slice of the stacked parameters gets the gradient of its own mean loss
    (:meth:`SeedAxis.backward`; Adam is element-wise). ``actor=False``: the critics only (the
    actor and temperature get no gradient, so Adam leaves them be)."""
    out = loss_fn(batch, actor=actor)
    optim.zero_grad(set_to_none=True)
    axis.backward(total_loss(out))
    optim.step()
    return out


def train(cfg: Config, seeds: list[int] | None = None) -> dict:
    """Run SAC with ``cfg``; returns a summary dict (also written to ``summary.json``).

    Args:
        cfg: the config.
        seeds: the seeds trained together (default :func:`run_seeds`) as one vectorised
            model (:class:`SeedAxis`).
    """
    axis = SeedAxis(run_seeds(cfg) if seeds is None else seeds, cfg.num_envs)
    run = Run(cfg, cfg.algorithm, total=cfg.total_frames, unit="frames")
    torch.manual_seed(cfg.seed)
    device = torch.device(cfg.device)
    env = env_for(cfg, axis.num_envs)
    loss_fn = build_loss(env, cfg, axis).to(device)
    actor = loss_fn.actor
    optim = torch.optim.Adam([
        {"params": list(actor.parameters()), "lr": cfg.actor_lr},
        {"params": list(loss_fn.qvalue.parameters()), "lr": cfg.critic_lr},
        {"params": list(loss_fn.temperature.parameters()), "lr": cfg.critic_lr},
    ])
    updater = SoftUpdate(loss_fn, tau=cfg.tau)
    # item i holds every seed's i-th transition (SeedAxis.to_replay): a buffer per seed in one storage
    buffer = ReplayBuffer(storage=LazyTensorStorage(min(cfg.buffer_size, cfg.total_frames), device=device),
                          batch_size=cfg.batch_size)
    collector = Collector(env, actor, frames_per_batch=axis.num_envs, total_frames=axis.n * cfg.total_frames,
                          init_random_frames=axis.n * cfg.learning_starts, device=device)
    axis.seed_envs(env)  # block k starts as a single run of seed seeds[k]
    budget = UpdateBudget(cfg.utd_ratio, cfg.learning_starts)
    keep = ["observation", "action", ("next", "observation"), ("next", "reward"),
            ("next", "terminated")]

    # everything a checkpoint holds (the RNG states and the metric history are added)
    state = {"loss": loss_fn, "optim": optim, "buffer": buffer, "collector": collector, "budget": budget}
    if (env_rng := env_rng_state(env)) is not None:  # the torch env's episodes resume exactly
        state["env_rng"] = env_rng
    if run.start(**state) is not None and env_rng is None:
        collector.reset()  # the simulators restart: new episodes, seeded from the frame count
        axis.seed_envs(env, offset=collector.frames // axis.n)

    def evaluate(seed: int) -> dict:  # the deterministic policy, block k as seed seeds[k]'s single run
        evals = axis.evaluate(lambda n: env_for(cfg, n), actor, cfg.eval_episodes, seed - cfg.seed)
        return axis.metrics("eval_return", evals)

    def alphas() -> dict:
        return dict(zip(axis.names("alpha"), loss_fn.temperature.alpha.reshape(-1).tolist()))

    log = OffPolicyLog(run, cfg, budget, evaluate, show=("train_return", "eval_return", "alpha"), extra=alphas,
                       axis=axis)
    for batch in collector:
        # 1. one step of every sub-env (uniformly random actions before learning_starts)
        frames, new = collector.frames // axis.n, batch.numel() // axis.n
        buffer.extend(axis.to_replay(batch.reshape(-1).select(*keep).to(device)))
        log.add_batch(batch)
        # 2. gradient steps
        steps = budget.add(frames, new)
        for u in range(budget.updates - steps, budget.updates):  # u: the run's update index
            with_actor = (u + 1) % cfg.policy_delay == 0
            out = sac_update(loss_fn, optim, axis.from_replay(buffer.sample()), axis, actor=with_actor)
            updater.step()
            if with_actor:  # the diagnostics of the steps with every term
                log.add_stats(out)
        # 3. log, evaluate, checkpoint
        if log.step(frames, new, state):
            break
    model = {"actor": actor.state_dict(), "qvalue": loss_fn.qvalue.state_dict(), "seeds": axis.seeds}
    return log.close(collector, env, state, model, f"{cfg.algorithm.upper()} {cfg.env_id}")


main = hydra_app(Config, train, name="sac", recipes=Path(__file__).parent / "recipes")

if __name__ == "__main__":
    main()
