"""Goal-conditioned SAC with hindsight experience replay (Andrychowicz et al., 2017) on
Gymnasium Robotics' goal tasks (default ``PointMaze_Open-v3``, sparse reward).

A linear script built from tdrl parts: a :class:`GymEnv` of a goal task (Dict observations
``observation`` / ``achieved_goal`` / ``desired_goal``, ``info["success"]`` read into the
TensorDicts), a goal-conditioned :class:`ProbabilisticActor` and Q network (inputs:
observation and desired goal), :class:`SACLoss`, a :class:`Collector` (uniformly random actions
for the first ``learning_starts`` frames), a :class:`ReplayBuffer` whose transform is
:class:`HERTransform` (``her=true``: a share ``k / (k + 1)`` of each sampled batch gets the
goal a ``strategy`` picks from its own episode, its reward recomputed by the env's own
``compute_reward``), :class:`SoftUpdate` of the target critics and the run harness of
``tdrl.core.train``. ``her=false`` is the same agent on the stored goals only: the ablation.

The episode of a stored step is the collector's trajectory id; one sub-env (``num_envs=1``)
keeps each episode's steps in consecutive slots, which HER needs. Episodes never terminate
(the goal tasks' convention): they end at ``max_episode_steps`` and the critics bootstrap
through that time limit.

    python apps/her/train.py                                   # PointMaze Open, HER (future, k=4)
    python apps/her/train.py her=false                         # the same agent without HER
    python apps/her/train.py --config-name open                # gamma 0.98, tau 0.05: RESULTS.md's settings
    python apps/her/train.py --config-name umaze               # the U-shaped maze (harder)
    python apps/her/train.py --config-name tiny                # a seconds-long smoke run (CI)

Evaluation: ``eval_episodes`` deterministic episodes; ``eval_success`` is the share whose last
step is a success (the goal reached and held at the time limit, Fetch's ``is_success``
convention), ``eval_return`` their mean return. Outputs in ``out`` as in ``apps/sac``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from tensordict.nn import InteractionType, TensorDictModule, set_interaction_type
from torch import nn

from tdrl.core import DoubleToFloat, RewardSum, step_mdp
from tdrl.core._optional import require
from tdrl.core.collectors import Collector
from tdrl.core.envs import make_env
from tdrl.core.modules import MLP, NormalParamExtractor, ProbabilisticActor, TanhNormal, ValueOperator
from tdrl.core.objectives import SACLoss, SoftUpdate, total_loss
from tdrl.core.replay import HERTransform, LazyTensorStorage, ReplayBuffer
from tdrl.core.replay.her import STRATEGIES
from tdrl.core.train import (
    ConfigError,
    OffPolicyConfig,
    OffPolicyLog,
    Run,
    UpdateBudget,
    hydra_app,
)

EPISODE = ("collector", "traj_ids")
INPUTS = ["observation", "desired_goal"]


@dataclass
class Config(OffPolicyConfig):
    """SAC + HER on a goal task. Defaults follow Stable-Baselines3's HER + SAC settings for
    the robotics goal tasks (gamma 0.95, learning rates 1e-3, future strategy, k = 4)."""

    env_id: str = "PointMaze_Open-v3"
    """A Gymnasium Robotics goal task (Dict observations with achieved_goal / desired_goal)."""
    max_episode_steps: int = 100
    """Time limit of an episode (the task's own is 300 for the point mazes)."""
    total_frames: int = 12_000
    learning_starts: int = 1_000
    buffer_size: int = 1_000_000
    gamma: float = 0.95
    actor_lr: float = 1e-3
    """Adam learning rate of the actor."""
    critic_lr: float = 1e-3
    """Adam learning rate of the critics and the temperature."""
    alpha_init: float = 1.0
    """Initial entropy temperature (tuned automatically)."""
    hidden: tuple[int, ...] = (128, 128)
    her: bool = True
    """Relabel sampled goals in hindsight; false: the same agent on the stored goals only."""
    strategy: str = "future"
    """HER goal strategy: future, final or episode."""
    k: int = 4
    """Hindsight goals per real goal: a share k / (k + 1) of each batch is relabelled."""
    eval_episodes: int = 20
    eval_every: int = 2_000
    log_every: int = 1_000
    out: str = "runs/her"
    """Run folder (a new numbered one beside it if it holds an earlier run and resume is false)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_envs != 1:
            raise ConfigError(f"Config.num_envs={self.num_envs}: HER reads each episode from "
                              "consecutive buffer slots, so this app runs one sub-env (num_envs=1).")
        if self.max_episode_steps < 1:
            raise ConfigError(f"Config.max_episode_steps={self.max_episode_steps}: must be >= 1.")
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"Config.strategy={self.strategy!r}: expected one of {sorted(STRATEGIES)}.")
        if self.k < 1:
            raise ConfigError(f"Config.k={self.k}: must be >= 1 (her=false turns HER off).")
        if not (self.actor_lr > 0 and self.critic_lr > 0):
            raise ConfigError(f"Config.actor_lr={self.actor_lr} / critic_lr={self.critic_lr}: "
                              "learning rates must be > 0.")


def _robotics():
    """Import gymnasium_robotics and register its tasks with Gymnasium."""
    gym = require("gymnasium", extra="gym", what="apps/her")
    robotics = require("gymnasium_robotics", extra="goal", what="apps/her",
                       pip_name="gymnasium-robotics")
    gym.register_envs(robotics)
    return gym


def env_for(cfg: Config, num_envs: int):
    """The goal task with float32 entries, ``info["success"]`` as ``"success"`` and
    episode-return tracking."""
    _robotics()
    return make_env(cfg.env_id, num_envs, (DoubleToFloat(), RewardSum()),
                    max_episode_steps=cfg.max_episode_steps, info_keys=("success",))


def env_compute_reward(cfg: Config):
    """The task's own ``compute_reward(achieved, desired, info)`` on batches of tensors
    (one instance of the task kept for it): ``(achieved [B, G], desired [B, G]) -> [B]``."""
    gym = _robotics()
    task = gym.make(cfg.env_id).unwrapped
    if not hasattr(task, "compute_reward"):
        raise ValueError(f"{cfg.env_id} has no compute_reward: HER needs a goal task.")

    def compute_reward(achieved: torch.Tensor, desired: torch.Tensor) -> torch.Tensor:
        reward = task.compute_reward(achieved.detach().cpu().numpy(), desired.detach().cpu().numpy(), None)
        return torch.as_tensor(reward, dtype=torch.float32)

    return compute_reward


class GaussianHead(nn.Module):
    """``net(*inputs)`` (an :class:`MLP` concatenates them) split into ``(loc, scale)``."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net, self.split = net, NormalParamExtractor()

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.split(self.net(*inputs))


def make_actor_critic(env, cfg: Config):
    """Tanh-Gaussian actor and one Q network, both on ``[observation, desired_goal]``."""
    spec = env.observation_spec
    for key in ("observation", "achieved_goal", "desired_goal"):
        if key not in spec.keys():
            raise ValueError(f"{cfg.env_id}: no {key!r} in its observations ({sorted(spec.keys())}): "
                             "HER needs a goal task with Dict observations.")
    in_dim = sum(spec[k].shape[-1] for k in INPUTS)
    act = env.action_spec
    act_dim = act.shape[-1]
    net = GaussianHead(MLP(in_dim, 2 * act_dim, cfg.hidden, nn.ReLU))
    params = TensorDictModule(net, in_keys=INPUTS, out_keys=["loc", "scale"])
    low, high = act.low.reshape(-1, act_dim)[0], act.high.reshape(-1, act_dim)[0]
    actor = ProbabilisticActor(params, TanhNormal, distribution_kwargs={"low": low, "high": high},
                               return_log_prob=False)
    qvalue = ValueOperator(MLP(in_dim + act_dim, 1, cfg.hidden, nn.ReLU), in_keys=[*INPUTS, "action"],
                           out_keys=["state_action_value"])
    return actor, qvalue


def evaluate_goals(env, actor, episodes: int, seed: int) -> tuple[float, float]:
    """``(success rate, mean return)`` of the first episode of each of ``episodes`` sub-envs
    under the deterministic policy; success is ``("next", "success")`` at the episode's last
    step. Closes ``env``."""
    env.set_seed(seed)
    td = env.reset()
    finished = torch.zeros(episodes, dtype=torch.bool)
    success, returns = torch.zeros(episodes), torch.zeros(episodes)
    with set_interaction_type(InteractionType.DETERMINISTIC), torch.no_grad():
        while not bool(finished.all()):
            td = env.step(actor(td))
            done = td["next", "done"].reshape(episodes)
            first = done & ~finished
            success[first] = td["next", "success"].reshape(episodes)[first]
            returns[first] = td["next", "episode_reward"].reshape(episodes)[first]
            finished |= done
            td = step_mdp(td)
            if bool(done.any()):
                td["_reset"] = done.unsqueeze(-1)
                td = env.reset(td).exclude("_reset")
    env.close()
    return float((success > 0).float().mean()), float(returns.mean())


def train(cfg: Config) -> dict:
    """Run SAC (+ HER) with ``cfg``; returns a summary dict (also written to ``summary.json``)."""
    run = Run(cfg, "her" if cfg.her else "sac_goals", total=cfg.total_frames, unit="frames")
    torch.manual_seed(cfg.seed)
    device = torch.device(cfg.device)
    env = env_for(cfg, 1)
    actor, qvalue = make_actor_critic(env, cfg)
    loss_fn = SACLoss(actor, qvalue, num_qvalue_nets=2, gamma=cfg.gamma,
                      alpha_init=cfg.alpha_init).to(device)
    optim = torch.optim.Adam([
        {"params": list(actor.parameters()), "lr": cfg.actor_lr},
        {"params": list(loss_fn.qvalue.parameters()), "lr": cfg.critic_lr},
        {"params": list(loss_fn.temperature.parameters()), "lr": cfg.critic_lr},
    ])
    updater = SoftUpdate(loss_fn, tau=cfg.tau)
    storage = LazyTensorStorage(min(cfg.buffer_size, cfg.total_frames), device=device)
    her = None
    if cfg.her:
        her = HERTransform(storage, env_compute_reward(cfg), strategy=cfg.strategy, k=cfg.k,
                           episode_key=EPISODE,
                           generator=torch.Generator().manual_seed(cfg.seed + 1))
    buffer = ReplayBuffer(storage=storage, batch_size=cfg.batch_size, transform=her)
    collector = Collector(env, actor, frames_per_batch=1, total_frames=cfg.total_frames,
                          init_random_frames=cfg.learning_starts, device=device, seed=cfg.seed)
    budget = UpdateBudget(cfg.utd_ratio, cfg.learning_starts)
    goals = ["achieved_goal", "desired_goal"]
    keep = ["observation", *goals, "action", EPISODE, ("next", "observation"),
            *[("next", g) for g in goals], ("next", "reward"), ("next", "terminated")]

    state = {"loss": loss_fn, "optim": optim, "buffer": buffer, "collector": collector, "budget": budget}
    if run.start(**state) is not None:
        collector.reset()  # the simulator restarts: a new episode, seeded from the frame count
        collector.set_seed(cfg.seed + collector.frames)

    def evaluate(seed: int) -> dict:  # the deterministic policy
        success, ret = evaluate_goals(env_for(cfg, cfg.eval_episodes), actor, cfg.eval_episodes, seed)
        return {"eval_success": success, "eval_return": ret}

    log = OffPolicyLog(run, cfg, budget, evaluate, show=("train_success", "eval_success", "alpha"),
                       success_key="success")
    for batch in collector:
        # 1. one env step (uniformly random actions before learning_starts)
        frames, new = collector.frames, batch.numel()
        buffer.extend(batch.reshape(-1).select(*keep).to(device))
        log.add_batch(batch)
        # 2. gradient steps on (relabelled) batches
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
    return log.close(collector, env, state, model, f"SAC{' + HER' if cfg.her else ''} {cfg.env_id}", her=cfg.her)


main = hydra_app(Config, train, name="her", recipes=Path(__file__).parent / "recipes")

if __name__ == "__main__":
    main()
