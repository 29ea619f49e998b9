"""DreamerV3 (Hafner et al., 2023) from state observations, on DeepMind Control tasks.

One linear script from tdrl parts: a :class:`DMControlEnv` (``make_env("dmc/<domain>-<task>")``,
with ``action_repeat``; or the torch ``tdrl/Pendulum``), the :class:`DreamerV3` networks and
losses (RSSM world model, two-hot reward and critic heads, percentile-normalised actor), a
:class:`ReplayBuffer` sampling sequences with a :class:`SliceSampler`, and the run harness of
``tdrl.core.train``. Each iteration:

1. collect one agent step (uniformly random actions for the first ``learning_starts`` steps;
   the agent filters its observations with the RSSM and samples from its actor);
2. ``utd_ratio`` gradient steps per collected step, each: world-model loss on ``batch_size``
   sequences of ``seq_len`` steps, imagination of ``horizon`` steps from every posterior state,
   actor and critic losses, slow-critic EMA.

The paper's "train ratio" (replayed steps per agent step) is ``utd_ratio * batch_size * seq_len``.

    python apps/dreamer/train.py --config-name cartpole_swingup   # the CPU learning recipe
    python apps/dreamer/train.py --config-name gpu                # the paper's sizes (GPU)
    python apps/dreamer/train.py --config-name tiny               # a seconds-long smoke run (CI)
    python apps/dreamer/train.py resume=true

Frames are agent steps (``action_repeat`` simulator steps each). Outputs in ``out``:
``config.yaml``, ``metrics.csv``, ``learning_curve.png``, ``summary.json`` (with
``random_return``, a uniformly random policy's return measured at the start of the run),
``model.pt``, ``checkpoints/``. With ``tdrl/Pendulum`` a resumed run is bit-identical to an
uninterrupted one; the MuJoCo simulators cannot be checkpointed, so there a resumed run starts
a fresh episode.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from tdrl.core.envs import env_rng_state, make_env
from tdrl.core.objectives import DreamerConfig, DreamerV3, total_loss
from tdrl.core.replay import LazyTensorStorage, ReplayBuffer, SliceSampler
from tdrl.core.train import (
    ConfigError,
    OffPolicyConfig,
    Run,
    StateBox,
    UpdateBudget,
    crossed,
    finish_env_run,
    hydra_app,
    mean_metrics,
)


@dataclass
class Config(OffPolicyConfig):
    """DreamerV3 from states. ``hidden`` gives the MLP width (its first entry) and depth (its
    length); ``batch_size`` counts sequences. Defaults are a small CPU-sized model; the gpu
    recipe sets the paper's sizes (model S: deter 512, 32x32 latents, 2 x 512 MLPs, batch 16
    x 64, train ratio 512)."""

    env_id: str = "dmc/cartpole-balance"
    action_repeat: int = 2
    """Simulator steps per agent step (DeepMind Control only; Dreamer's convention is 2)."""
    total_frames: int = 20_000
    learning_starts: int = 1_000
    buffer_size: int = 1_000_000
    batch_size: int = 16
    seq_len: int = 64
    """Steps per replayed sequence."""
    utd_ratio: float = 0.1
    hidden: tuple[int, ...] = (128, 128)
    deter: int = 256
    """GRU state size of the RSSM."""
    stoch: int = 32
    """Categorical latents of the RSSM."""
    classes: int = 32
    """Classes per latent."""
    horizon: int = 15
    """Imagination horizon."""
    imag_starts: int = 0
    """Posterior states imagined from per update (a random subset; 0: all, as the paper)."""
    gamma: float = 0.997
    lmbda: float = 0.95
    """Lambda of the imagined returns."""
    entropy: float = 3e-4
    """Actor entropy bonus (of the return scaled to ~[0, 1])."""
    model_lr: float = 1e-4
    actor_lr: float = 3e-5
    critic_lr: float = 3e-5
    model_clip: float = 1000.0
    """Gradient-norm clip of the world model."""
    ac_clip: float = 100.0
    """Gradient-norm clip of the actor and the critic."""
    eval_episodes: int = 5
    checkpoint_every: int = 5_000
    log_every: int = 500
    out: str = "runs/dreamer"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_envs != 1:
            raise ConfigError(f"Config.num_envs={self.num_envs}: the Dreamer app collects from one env "
                              "(its replayed sequences are one env's consecutive steps); expected 1.")
        for name in ("action_repeat", "seq_len", "deter", "stoch", "classes", "horizon"):
            if getattr(self, name) < 1:
                raise ConfigError(f"Config.{name}={getattr(self, name)} is not allowed: expected >= 1.")
        if min(self.model_lr, self.actor_lr, self.critic_lr) <= 0:
            raise ConfigError("Config: model_lr, actor_lr and critic_lr must be > 0.")
        if self.learning_starts < self.seq_len:
            raise ConfigError(f"Config.learning_starts={self.learning_starts} < seq_len={self.seq_len}: "
                              "the first update needs one sequence in the buffer.")


def env_for(cfg: Config, num_envs: int = 1):
    kw = {"action_repeat": cfg.action_repeat} if cfg.env_id.startswith("dmc/") else {}
    return make_env(cfg.env_id, num_envs, **kw)


def make_agent(env, cfg: Config) -> DreamerV3:
    obs_dim = env.observation_spec["observation"].shape[-1]
    dcfg = DreamerConfig(deter=cfg.deter, stoch=cfg.stoch, classes=cfg.classes, hidden=cfg.hidden[0],
                         layers=len(cfg.hidden), horizon=cfg.horizon, imag_starts=cfg.imag_starts,
                         gamma=cfg.gamma, lmbda=cfg.lmbda,
                         entropy=cfg.entropy)
    return DreamerV3(obs_dim, env.action_spec.shape[-1], discrete=False, cfg=dcfg)


def to_env_action(env, a: torch.Tensor) -> torch.Tensor:
    """``[-1, 1]`` -> the env's action bounds."""
    low, high = env.action_spec.low, env.action_spec.high
    return low + (a.clamp(-1, 1) + 1) * 0.5 * (high - low)


def evaluate(agent: DreamerV3, cfg: Config, episodes: int, seed: int, random: bool = False) -> float:
    """Mean return of ``episodes`` episodes (one per sub-env) of the deterministic agent, or of
    uniformly random actions."""
    env = env_for(cfg, episodes)
    env.set_seed(seed)
    td = env.reset()
    device = torch.device(cfg.device)
    state = agent.initial_state(episodes, device)
    finished = torch.zeros(episodes, dtype=torch.bool)
    returns, total = torch.zeros(episodes), torch.zeros(episodes)
    gen = torch.Generator().manual_seed(seed)
    while not bool(finished.all()):
        a, state = agent.act(td["observation"].to(device), state, deterministic=True)
        a = a.cpu()
        if random:
            a = torch.rand(a.shape, generator=gen) * 2 - 1
        td = env.step(td.set("action", to_env_action(env, a)))
        total += td["next", "reward"].squeeze(-1)
        done = td["next", "done"].squeeze(-1)
        returns[done & ~finished] = total[done & ~finished]
        finished |= done
        td = td["next"].exclude("reward")
    env.close()
    return float(returns.mean())


def train(cfg: Config) -> dict:
    """Run DreamerV3 with ``cfg``; returns the summary (also in ``summary.json``)."""
    run = Run(cfg, "dreamer", total=cfg.total_frames, unit="frames")
    torch.manual_seed(cfg.seed)
    device = torch.device(cfg.device)
    env = env_for(cfg)
    env.set_seed(cfg.seed)
    agent = make_agent(env, cfg).to(device)
    wm_opt = torch.optim.Adam(agent.world_model_parameters(), lr=cfg.model_lr, eps=1e-8)
    actor_opt = torch.optim.Adam(agent.actor.parameters(), lr=cfg.actor_lr, eps=1e-5)
    critic_opt = torch.optim.Adam(agent.critic.parameters(), lr=cfg.critic_lr, eps=1e-5)
    buffer = ReplayBuffer(storage=LazyTensorStorage(min(cfg.buffer_size, cfg.total_frames), device=device),
                          sampler=SliceSampler(slice_len=cfg.seq_len), batch_size=cfg.batch_size * cfg.seq_len)
    budget = UpdateBudget(cfg.utd_ratio, cfg.learning_starts)
    # the loop's own state: the env's current step, the agent's latent, the episode's return
    loop = StateBox({"frames": 0, "td": None, "agent": None, "ep_return": 0.0,
                     "random_return": None})
    state = {"agent": agent, "wm_opt": wm_opt, "actor_opt": actor_opt, "critic_opt": critic_opt,
             "buffer": buffer, "budget": budget, "loop": loop}
    if (env_rng := env_rng_state(env)) is not None:
        state["env_rng"] = env_rng
    resumed = run.start(**state) is not None
    if resumed and env_rng is None:  # a simulator restarts: a fresh episode
        env.set_seed(cfg.seed + loop.value["frames"])
        loop.value.update(td=None, agent=None, ep_return=0.0)
    if loop.value["random_return"] is None:
        loop.value["random_return"] = evaluate(agent, cfg, cfg.eval_episodes, cfg.seed + 30_000, random=True)
    lv = loop.value
    td = lv["td"] if lv["td"] is not None else env.reset()
    ag = lv["agent"] if lv["agent"] is not None else agent.initial_state(1, device)
    frames, ep_return, returns, stats = lv["frames"], lv["ep_return"], [], []
    actor_params, critic_params = list(agent.actor.parameters()), list(agent.critic.parameters())
    while frames < cfg.total_frames:
        # 1. one agent step
        a, ag = agent.act(td["observation"].to(device), ag)
        if frames < cfg.learning_starts:
            a = (torch.rand(a.shape) * 2 - 1).to(device)
            ag = (ag[0], ag[1], a)
        td.set("action", to_env_action(env, a.cpu()))
        td, nxt = env.step_and_maybe_reset(td)
        buffer.extend(td.select("observation", ("next", "observation"), ("next", "reward"),
                                ("next", "terminated"), ("next", "done")).to(device).set("action", a))
        frames += 1
        ep_return += float(td["next", "reward"].sum())
        if bool(td["next", "done"].any()):
            returns.append(ep_return)
            ep_return, ag = 0.0, agent.initial_state(1, device)
        td = nxt
        # 2. gradient steps
        for _ in range(budget.add(frames, 1)):
            wm, (h, z) = agent.world_model_loss(buffer.sample())
            wm_opt.zero_grad(set_to_none=True)
            total_loss(wm).backward()
            torch.nn.utils.clip_grad_norm_(agent.world_model_parameters(), cfg.model_clip)
            wm_opt.step()
            ac = agent.actor_critic_loss(h, z)
            actor_opt.zero_grad(set_to_none=True)
            ac["loss_actor"].backward(inputs=actor_params)
            torch.nn.utils.clip_grad_norm_(actor_params, cfg.ac_clip)
            actor_opt.step()
            critic_opt.zero_grad(set_to_none=True)
            ac["loss_critic"].backward(inputs=critic_params)
            torch.nn.utils.clip_grad_norm_(critic_params, cfg.ac_clip)
            critic_opt.step()
            agent.update_slow_critic()
            stats.append(wm.detach().update(ac.detach()))
        # 3. log, evaluate, checkpoint
        row = {}
        if crossed(cfg.log_every, frames - 1, frames):
            row = {"updates": budget.updates, "fps": frames / run.elapsed,
                   "train_return": run.record_episodes(returns), "episodes": len(returns),
                   **mean_metrics(stats)}
            returns, stats = [], []
        if frames >= cfg.learning_starts and crossed(cfg.eval_every, frames - 1, frames):
            row["eval_return"] = evaluate(agent, cfg, cfg.eval_episodes, cfg.seed + 10_000)
        if row:
            run.log(frames, row, show=("train_return", "eval_return", "loss_decoder"))
        lv.update(frames=frames, td=td, agent=ag, ep_return=ep_return)
        run.maybe_checkpoint(frames, **state)
        if run.should_stop(row):
            break
    lv.update(frames=frames, td=td, agent=ag, ep_return=ep_return)
    run.checkpoint(frames, **state)
    env.close()
    eval_return = evaluate(agent, cfg, cfg.eval_episodes, cfg.seed + 20_000)
    torch.save({"agent": agent.state_dict(), "config": dataclasses.asdict(cfg)},
               os.path.join(cfg.out, "model.pt"))
    return finish_env_run(run, cfg, frames, eval_return, f"DreamerV3 {cfg.env_id}", updates=budget.updates,
                          random_return=lv["random_return"])


main = hydra_app(Config, train, name="dreamer", recipes=Path(__file__).parent / "recipes")

if __name__ == "__main__":
    main()
