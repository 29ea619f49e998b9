"""The PPO app's collection against a hand-written gymnasium loop doing the same work.

    flock /tmp/tdrl-cpu.lock python -m benchmarks.collect_app --repeats 7 [--record]

(a) tdrl: the env and the actor built by ``apps/ppo/train.py`` itself (``make_env``,
``make_actor_critic``: ``GymEnv`` vector env + ``DoubleToFloat``, ``VecNorm(clip=10)`` for
continuous actions, ``RewardSum``; ``ProbabilisticActor``), driven by ``Collector`` exactly as
the app builds it. (b) a hand-written ``gymnasium.vector`` loop (SAME_STEP autoreset, as
``GymEnv``) doing the same work per step in numpy/torch: the float cast, the running
observation normalisation (float64 Chan updates on step and reset rows, clip 10), the same
network and distribution (sample + log-prob), the episode-return sum, the true final
observation of finished sub-envs, and one stack of every output per batch.

Cases: CartPole-v1 with 8 envs x 32 steps (the PPO defaults) and HalfCheetah-v5 with 8 envs x
256 steps (the halfcheetah recipe). Figures are frames per CPU second of this process
(``time.process_time``), median over ``--repeats`` rounds; in each round both contenders
collect ``--batches`` batches, interleaved. A third contender is the same app env collected by
the Collector's generic loop (``_dict_loop = False``: the path every app took before the dict
loop served transformed envs), so before and after come from one run. One torch thread.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import statistics
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]
SECTION, TABLE = "Collectors", "The PPO app's collection vs a hand-written gymnasium loop, frames per CPU second"


def load_ppo_app():
    spec = importlib.util.spec_from_file_location("_tdrl_app_ppo", REPO / "apps" / "ppo" / "train.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


class HandLoop:
    """The app's collection written by hand over ``gymnasium.vector`` (see the module doc)."""

    def __init__(self, env_id: str, num_envs: int, steps: int, actor, continuous: bool, seed: int):
        wrappers = [gym.wrappers.ClipAction] if continuous else None
        self.env = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync",
                                vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
                                wrappers=wrappers)
        self.steps, self.continuous = steps, continuous
        params = actor.module[0]  # the app's TensorDictModule of the distribution parameters
        self.net, self.dist_class = params.module, actor.module[1].distribution_class
        self.norm = continuous
        self.mean = self.var = None
        self.count = 0.0
        obs, _ = self.env.reset(seed=seed)
        self.obs = self._normalise(self._cast(obs), update=True)
        self.ep_ret = torch.zeros(num_envs, 1)

    def _cast(self, obs: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(np.array(obs))
        return t.float() if t.dtype == torch.float64 else t

    def _update(self, x: torch.Tensor) -> None:
        flat = x.double()
        m = flat.shape[0]
        b_mean, b_var = flat.mean(0), flat.var(0, unbiased=False)
        if self.mean is None:
            self.mean, self.var, self.count = b_mean, b_var, float(m)
            return
        tot = self.count + m
        delta = b_mean - self.mean
        self.mean = self.mean + delta * (m / tot)
        self.var = (self.var * self.count + b_var * m + delta.pow(2) * self.count * m / tot) / tot
        self.count = tot

    def _normalise(self, x: torch.Tensor, update: bool) -> torch.Tensor:
        if not self.norm:
            return x
        if update:
            self._update(x)
        out = (x - self.mean.float()) / (self.var + 1e-8).sqrt().float()
        return out.clamp(-10.0, 10.0)

    def run(self) -> dict:
        cols = {k: [] for k in ("obs", "action", "log_prob", "next_obs", "reward", "done",
                                "terminated", "truncated", "episode_reward")}
        obs, ep_ret = self.obs, self.ep_ret
        with torch.no_grad():
            for _ in range(self.steps):
                out = self.net(obs)
                dist = self.dist_class(*out) if isinstance(out, tuple) else self.dist_class(logits=out)
                action = dist.sample()
                log_prob = dist.log_prob(action)
                nobs, rew, term, trunc, info = self.env.step(action.numpy())
                done = term | trunc
                true_next = self._cast(nobs)
                if done.any():  # SAME_STEP: nobs holds the reset obs of finished sub-envs
                    reset_rows = true_next[done].clone()
                    for i in np.nonzero(done)[0]:
                        true_next[i] = self._cast(info["final_obs"][i])
                reward = torch.from_numpy(rew.astype(np.float32)).unsqueeze(-1)
                next_obs = self._normalise(true_next, update=True)
                ep_ret = ep_ret + reward
                d = torch.from_numpy(done).unsqueeze(-1)
                for k, v in (("obs", obs), ("action", action), ("log_prob", log_prob),
                             ("next_obs", next_obs), ("reward", reward), ("done", d),
                             ("terminated", torch.from_numpy(term).unsqueeze(-1)),
                             ("truncated", torch.from_numpy(trunc).unsqueeze(-1)),
                             ("episode_reward", ep_ret)):
                    cols[k].append(v)
                if done.any():  # the next root: reset observations of finished sub-envs
                    if self.norm:
                        self._update(reset_rows)
                    obs = next_obs.clone()
                    obs[done] = self._normalise(reset_rows, update=False)
                    ep_ret = ep_ret.masked_fill(d, 0.0)
                else:
                    obs = next_obs
        self.obs, self.ep_ret = obs, ep_ret
        return {k: torch.stack(v, 1) for k, v in cols.items()}


def measure(app, env_id: str, num_envs: int, steps: int, repeats: int, batches: int) -> dict:
    cfg = app.Config(env_id=env_id, num_envs=num_envs, num_steps=steps, total_frames=num_envs * steps)
    probe = app.make_env(cfg, 1, None)
    continuous = not isinstance(probe.action_spec, (app.Categorical, app.OneHot))
    probe.close()
    obs_norm = app.VecNorm(clip=10.0) if continuous else None
    torch.manual_seed(0)
    env = app.make_env(cfg, num_envs, obs_norm)
    actor, _ = app.make_actor_critic(env, cfg)
    collector = app.Collector(env, actor, frames_per_batch=num_envs * steps, total_frames=-1,
                              device=torch.device("cpu"), seed=0)
    hand = HandLoop(env_id, num_envs, steps, actor, continuous, seed=0)
    # the same app env once more, collected by the generic loop (the path before the dict loop
    # served transformed envs), for an A/B in the same run
    generic_env = app.make_env(cfg, num_envs, app.VecNorm(clip=10.0) if continuous else None)
    generic = app.Collector(generic_env, actor, frames_per_batch=num_envs * steps, total_frames=-1,
                            device=torch.device("cpu"), seed=0)
    generic._dict_loop = False
    it, it_generic = iter(collector), iter(generic)
    runs = {"tdrl": lambda: [next(it) for _ in range(batches)],
            "hand": lambda: [hand.run() for _ in range(batches)],
            "generic": lambda: [next(it_generic) for _ in range(batches)]}
    for run in runs.values():  # warm-up
        run()
    frames = num_envs * steps * batches
    res = {k: [] for k in runs}
    for _ in range(repeats):
        for k, run in runs.items():
            start = time.process_time()
            run()
            res[k].append(frames / (time.process_time() - start))
    collector.shutdown()
    generic.shutdown()
    hand.env.close()
    return {k: statistics.median(v) for k, v in res.items()} | {"all": res}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--batches", type=int, default=0, help="batches per round (0: ~2048 frames)")
    ap.add_argument("--cases", default="cartpole,halfcheetah")
    ap.add_argument("--record", action="store_true", help="write the rows to benchmarks/results")
    ap.add_argument("--label", default="", help="suffix of the recorded rows (e.g. 'before')")
    args = ap.parse_args()
    app = load_ppo_app()
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, gymnasium {gym.__version__}; "
          f"frames per CPU second, median of {args.repeats} rounds")
    cases = {"cartpole": ("CartPole-v1", 8, 32), "halfcheetah": ("HalfCheetah-v5", 8, 256)}
    for name in args.cases.split(","):
        env_id, n, steps = cases[name]
        batches = args.batches or max(1, math.ceil(2048 / (n * steps)))
        med = measure(app, env_id, n, steps, args.repeats, batches)
        ratio, before = med["tdrl"] / med["hand"], med["generic"] / med["hand"]
        print(f"{env_id} {n} envs x {steps} steps: tdrl Collector {med['tdrl']:8.0f} f/s | "
              f"hand-written loop {med['hand']:8.0f} f/s | ratio x{ratio:.2f} | generic loop "
              f"{med['generic']:8.0f} f/s (x{before:.2f})")
        print("  per round, tdrl/hand:", " ".join(f"{a / b:.2f}" for a, b in zip(med["all"]["tdrl"], med["all"]["hand"])))
        if args.record:
            from benchmarks.records import write_record

            row = f"{env_id}, {n} envs x {steps} steps" + (f" ({args.label})" if args.label else "")
            write_record(SECTION, TABLE, row,
                         {"tdrl Collector f/s": round(med["tdrl"]), "hand-written loop f/s": round(med["hand"]),
                          "generic loop f/s (before)": round(med["generic"]),
                          "generic / loop": f"x{before:.2f}"},
                         peer="hand-written gymnasium.vector loop, same transforms and policy",
                         ratio=f"x{ratio:.2f} the loop",
                         machine="shared 2-core CPU box, one torch thread",
                         note=f"Median of {args.repeats} rounds of {batches} batches, interleaved; the "
                              "env and actor built by apps/ppo/train.py; 'generic loop' is the same "
                              "Collector with its dict loop off (the path before).")


if __name__ == "__main__":
    main()
