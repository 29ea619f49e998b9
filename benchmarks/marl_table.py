"""MARL: tdrl vs BenchMARL 1.5.2 on BenchMARL's five VMAS tasks x its algorithms (MAPPO, IPPO, QMIX,
MADDPG, IDDPG, MASAC, ISAC, IQL), in one run.

For every (task, algorithm, seed) both sides train with one matched config (below: BenchMARL's
conf values, cited by file, set explicitly on both sides) and the same budget, then evaluate
the final policy on ``--eval-episodes`` episodes (deterministic actions: the TanhNormal's mode
for MAPPO/IPPO, greedy Q for QMIX; one episode per evaluation sub-env, cut at the first done,
return = sum over the episode of the agents' mean reward, as BenchMARL's logger computes it).
Frames/s = frames / wall time of the training loop (collection + advantage / replay + updates;
construction and the final evaluation excluded on both sides); frames/CPU-s uses the process
CPU time of the same loop. The sides are interleaved per seed (tdrl, then BenchMARL) so load
changes hit both. BenchMARL runs in ``.venv-benchmarl`` (``benchmarks/setup_benchmarl.sh``), or
the ``TDRL_BENCHMARL_PYTHON`` / ``TDRL_BENCHMARL_PYTHONPATH`` that ``marl.py`` describes, as a
subprocess of this script (``--side benchmarl``); the shared helpers live in ``marl.py``.

Every finished seed (both sides) is appended to ``--runs`` (``benchmarks/results/marl_table_runs.ndjson``)
at once, keyed by task, algorithm, seed, budget and device: a later invocation reuses the seeds
found there (``--fresh`` reruns them), so a long table is filled in pieces and a crash or a
timeout loses only the seed that was running. ``--time-limit-terminates`` changes only the tdrl
side, so its seeds take BenchMARL's run from the default variant's record (and the other way
round) when there is one (``peer_run``).

    flock /tmp/tdrl-cpu.lock python -u benchmarks/marl_table.py --tasks navigation --seeds 0 1 --record
    flock /tmp/tdrl-cpu.lock python -u benchmarks/marl_table.py --tasks wheel --algorithms qmix --seeds 0 1 2 --record
    python -m benchmarks.marl_table --side tdrl --tasks balance --algorithms qmix --iters 1  # one side

Where the two libraries differ in formula, the mapping keeps the update the same:

* TorchRL's ``"l2"`` is ``(x - y)^2``, tdrl's is ``0.5 (x - y)^2``: tdrl's PPO ``critic_coef`` is
  twice BenchMARL's, and tdrl's QMIX grad-norm clip is half BenchMARL's (Adam is invariant to
  the loss scale, so the clipped steps agree).
* BenchMARL's QMIX mixes with TorchRL's ``QMixer`` (one-layer hypernetworks): tdrl's QMixer is
  built with ``hypernet_hidden=None``.

Not matched by default (said in the table's note): at VMAS's time limit TorchRL reports
``terminated`` (no bootstrap), tdrl ``truncated`` (bootstrapped value), so the value targets of
the last step of each episode differ. ``--time-limit-terminates`` gives the tdrl side TorchRL's
semantics (``VmasEnv(time_limit_terminates=True)``); its rows and cached seeds are kept apart.

Evaluation noise: a deterministic policy's episode returns are heavy-tailed on navigation (an
episode where agents stay locked in a collision scores -60 to -80 against a median near +0.5),
so with BenchMARL's 10 evaluation episodes one such episode moves a seed's return by several
units (tdrl's MAPPO navigation seed 1: -6.68 on 10 episodes, -2.99 on 200; BenchMARL's seeds
-1.39..0.40 on 10, -4.2..-3.9 on 200). Rows with ``--eval-episodes 200`` compare returns.
``marl_parity.py`` checks that one update of either side is the same computation.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from collections.abc import Sequence
from pathlib import Path

import torch
from benchmarks.records import module_command, read_keyed
from benchmarks.marl import SimulatorClock, BENCHMARL_PY, MISSING_BENCHMARL, check_device, sync_device, benchmarl_task, benchmarl_env

BASE_ALGORITHMS = ("mappo", "ippo", "qmix", "maddpg", "iddpg", "masac", "isac", "iql")
CELLS = ("gru", "lstm")  # BenchMARL's model=layers/gru | layers/lstm: "<algorithm>_<cell>" (tdrl: recurrent=True, rnn=cell)
ALGORITHMS = (*BASE_ALGORITHMS, *(f"{a}_{c}" for a in ("mappo", "ippo", "qmix") for c in CELLS))
ON_POLICY = ("mappo", "ippo")
CONTINUOUS = ("mappo", "ippo", "maddpg", "iddpg", "masac", "isac")  # the others act on VMAS's discrete actions
TASKS = ("balance", "navigation", "transport", "wheel", "sampling", "give_way", "dispersion")
PEER = "BenchMARL 1.5.2"
SECTION, TABLE = "Multi-agent", "MARL: tdrl vs BenchMARL on its VMAS tasks and algorithms"

# BenchMARL 1.5.2's configuration values (benchmarl/conf/..., the files BenchMARL's
# ``get_from_yaml`` reads); both sides get them explicitly.
EXPERIMENT = {  # experiment/base_experiment.yaml
    "gamma": 0.99, "lr": 5e-5, "adam_eps": 1e-6, "clip_grad_norm": True, "clip_grad_val": 5.0,
    "share_policy_params": True, "soft_target_update": True, "polyak_tau": 0.005,
    "exploration_eps_init": 0.8, "exploration_eps_end": 0.01, "off_policy_memory_size": 1_000_000,
    "off_policy_init_random_frames": 0, "off_policy_use_prioritized_replay_buffer": False,
    "evaluation_deterministic_actions": True,
}
PPO = {  # algorithm/mappo.yaml (ippo.yaml holds the same values)
    "share_param_critic": True, "clip_epsilon": 0.2, "entropy_coef": 0.0, "critic_coef": 1.0,
    "loss_critic_type": "l2", "lmbda": 0.9, "scale_mapping": "biased_softplus_1.0",
    "use_tanh_normal": True, "minibatch_advantage": False,
}
QMIX = {"mixing_embed_dim": 32, "delay_value": True, "loss_function": "l2"}  # algorithm/qmix.yaml
DDPG = {"share_param_critic": True, "loss_function": "l2", "delay_value": True,  # algorithm/maddpg.yaml, iddpg.yaml
        "use_tanh_mapping": True}
SAC = {"share_param_critic": True, "num_qvalue_nets": 2, "loss_function": "l2",  # algorithm/masac.yaml, isac.yaml
       "delay_qvalue": True, "target_entropy": "auto", "alpha_init": 1.0, "min_alpha": None, "max_alpha": None,
       "fixed_alpha": False, "scale_mapping": "biased_softplus_1.0", "use_tanh_normal": True}
IQL = {"delay_value": True, "loss_function": "l2"}  # algorithm/iql.yaml
OFF_POLICY_CONF = {"qmix": QMIX, "maddpg": DDPG, "iddpg": DDPG, "masac": SAC, "isac": SAC, "iql": IQL}
MLP = {"num_cells": (256, 256)}  # model/layers/mlp.yaml (activation Tanh on both sides: tdrl's default)
RNN = {"hidden_size": 128, "n_layers": 1}  # model/layers/gru.yaml, lstm.yaml (then an MLP of MLP's cells)


def split_algorithm(algorithm: str) -> tuple[str, str | None]:
    """``"qmix_gru"`` -> ``("qmix", "gru")``; a plain algorithm -> ``(algorithm, None)``."""
    base, _, cell = algorithm.partition("_")
    return base, cell or None


@dataclass(frozen=True)
class Budget:
    """The budget of one run, the same on both sides.

    Args:
        envs: vectorised VMAS envs for collection (BenchMARL's ``*_n_envs_per_worker``).
        frames_per_batch: frames collected per iteration; iters: iterations.
        epochs: on-policy passes over each batch (``on_policy_n_minibatch_iters``), in
            minibatches of ``minibatch`` frames (``on_policy_minibatch_size``; a divisor of
            ``frames_per_batch``, as BenchMARL rounds the count up and tdrl down).
        optimizer_steps: off-policy gradient steps per iteration (``off_policy_n_optimizer_steps``)
            on ``train_batch`` sampled transitions (``off_policy_train_batch_size``).
        eval_episodes: final evaluation episodes (``evaluation_episodes``).
    """

    envs: int = 60
    frames_per_batch: int = 6000
    iters: int = 10
    epochs: int = 4
    minibatch: int = 1000
    optimizer_steps: int = 100
    train_batch: int = 128
    eval_episodes: int = 10

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if value < 1:
                raise ValueError(f"Budget.{name} must be >= 1, got {value}.")
        if self.frames_per_batch % self.minibatch:
            raise ValueError(f"Budget.minibatch ({self.minibatch}) must divide frames_per_batch "
                             f"({self.frames_per_batch}): BenchMARL rounds the minibatch count up, tdrl down.")
        if self.frames_per_batch % self.envs:
            raise ValueError(f"Budget.envs ({self.envs}) must divide frames_per_batch ({self.frames_per_batch}).")

    @property
    def frames(self) -> int:
        return self.frames_per_batch * self.iters

    @property
    def anneal_frames(self) -> int:
        """Epsilon-annealing frames: BenchMARL's rule for ``exploration_anneal_frames: null``
        (a third of the run's frames), set explicitly on both sides."""
        return self.frames // 3


def _check_algorithm(algorithm: str) -> None:
    if algorithm not in ALGORITHMS:
        raise ValueError(f"Unknown algorithm {algorithm!r}; valid: {', '.join(ALGORITHMS)}.")


def benchmarl_overrides(algorithm: str, budget: Budget) -> dict[str, dict]:
    """What the BenchMARL side sets on its config objects (plain data; no BenchMARL import).

    Returns:
        ``{"experiment": {ExperimentConfig field: value}, "algorithm": {MappoConfig /
        IppoConfig / QmixConfig field: value}, "model": {MlpConfig field: value}}``.
    """
    _check_algorithm(algorithm)
    algorithm, cell = split_algorithm(algorithm)
    on = algorithm in ON_POLICY
    p = "on_policy" if on else "off_policy"
    exp = {**EXPERIMENT, f"{p}_collected_frames_per_batch": budget.frames_per_batch,
           f"{p}_n_envs_per_worker": budget.envs, "max_n_iters": budget.iters, "max_n_frames": None,
           "evaluation_episodes": budget.eval_episodes, "prefer_continuous_actions": algorithm in CONTINUOUS,
           "exploration_anneal_frames": budget.anneal_frames}
    if on:
        exp.update(on_policy_n_minibatch_iters=budget.epochs, on_policy_minibatch_size=budget.minibatch)
    else:
        exp.update(off_policy_n_optimizer_steps=budget.optimizer_steps,
                   off_policy_train_batch_size=budget.train_batch)
    model = ({"num_cells": list(MLP["num_cells"])} if cell is None else
             {"hidden_size": RNN["hidden_size"], "n_layers": RNN["n_layers"], "mlp_num_cells": list(MLP["num_cells"])})
    return {"experiment": exp, "algorithm": dict(PPO if on else OFF_POLICY_CONF[algorithm]), "model": model,
            "cell": cell}


def tdrl_configs(algorithm: str, budget: Budget, max_steps: int) -> dict:
    """The tdrl side's configs for the same run.

    Returns:
        ``{"algorithm": the algorithm's config, "train": TrainConfig, "num_cells": tuple,
        "continuous": bool, "on_policy": bool}``.
    """
    from tdrl.marl.algorithms import ALGORITHMS as BUILDERS
    from tdrl.marl.loops import TrainConfig

    _check_algorithm(algorithm)
    algorithm, cell = split_algorithm(algorithm)
    on = algorithm in ON_POLICY
    e = EXPERIMENT
    clip = e["clip_grad_val"] if e["clip_grad_norm"] else None
    if on:
        algo = BUILDERS[algorithm].config_class(
            gamma=e["gamma"], lmbda=PPO["lmbda"], clip_epsilon=PPO["clip_epsilon"],
            entropy_coef=PPO["entropy_coef"], critic_coef=2 * PPO["critic_coef"],  # 0.5 (x-y)^2 vs TorchRL's (x-y)^2
            loss_critic_type=PPO["loss_critic_type"], normalize_advantage=False,
            share_param_actor=e["share_policy_params"], share_param_critic=PPO["share_param_critic"])
        train = TrainConfig(frames_per_batch=budget.frames_per_batch, n_iters=budget.iters,
                            num_epochs=budget.epochs, minibatch_size=budget.minibatch, lr=e["lr"],
                            adam_eps=e["adam_eps"], max_grad_norm=clip, eval_interval=0, max_steps=max_steps)
    else:
        algo = off_policy_config(algorithm, budget)
        train = TrainConfig(frames_per_batch=budget.frames_per_batch, n_iters=budget.iters,
                            minibatch_size=budget.train_batch, n_optimizer_steps=budget.optimizer_steps,
                            buffer_size=e["off_policy_memory_size"], lr=e["lr"], adam_eps=e["adam_eps"],
                            # QMIX's l2 is half TorchRL's: half the clip; the others take TorchRL's "mse"
                            max_grad_norm=None if clip is None else clip / 2 if algorithm == "qmix" else clip,
                            eval_interval=0, max_steps=max_steps)
    if cell is not None:  # GRU / LSTM of RNN's size, then the MLP (BenchMARL's layers/gru.yaml)
        algo = dataclasses.replace(algo, recurrent=True, rnn=cell, rnn_hidden=RNN["hidden_size"])
    return {"algorithm": algo, "train": train, "num_cells": tuple(MLP["num_cells"]),
            "continuous": algorithm in CONTINUOUS, "on_policy": on, "builder": algorithm, "recurrent": cell is not None}


def off_policy_config(algorithm: str, budget: Budget):
    """tdrl's config of an off-policy algorithm with BenchMARL's values (OFF_POLICY_CONF, EXPERIMENT)."""
    from tdrl.marl.algorithms import ALGORITHMS as BUILDERS

    e, conf = EXPERIMENT, BUILDERS[algorithm].config_class
    if algorithm == "qmix":
        return conf(gamma=e["gamma"], loss_function=QMIX["loss_function"], double_q=False,
                    mixing_embed_dim=QMIX["mixing_embed_dim"], hypernet_hidden=None,  # TorchRL's QMixer
                    share_params=e["share_policy_params"], tau=e["polyak_tau"], eps_init=e["exploration_eps_init"],
                    eps_end=e["exploration_eps_end"], eps_anneal_frames=budget.anneal_frames)
    mse = "mse" if OFF_POLICY_CONF[algorithm]["loss_function"] == "l2" else OFF_POLICY_CONF[algorithm]["loss_function"]
    if algorithm == "iql":
        return conf(gamma=e["gamma"], loss_function=mse, double_dqn=False, share_params=e["share_policy_params"],
                    tau=e["polyak_tau"], eps_init=e["exploration_eps_init"], eps_end=e["exploration_eps_end"],
                    eps_anneal_frames=budget.anneal_frames)
    common = {"gamma": e["gamma"], "loss_function": mse, "share_param_actor": e["share_policy_params"],
              "share_param_critic": OFF_POLICY_CONF[algorithm]["share_param_critic"], "tau": e["polyak_tau"]}
    if algorithm in ("maddpg", "iddpg"):  # BenchMARL's additive Gaussian noise anneals like epsilon
        return conf(**common, sigma_init=e["exploration_eps_init"], sigma_end=e["exploration_eps_end"],
                    sigma_anneal_frames=budget.anneal_frames)
    return conf(**common, num_qvalue_nets=SAC["num_qvalue_nets"], alpha_init=SAC["alpha_init"],
                min_alpha=SAC["min_alpha"], max_alpha=SAC["max_alpha"], fixed_alpha=SAC["fixed_alpha"],
                target_entropy=SAC["target_entropy"])


def run_tdrl(task: str, algorithm: str, budget: Budget, seed: int | Sequence[int], device: str = "cpu",
             time_limit_terminates: bool = False) -> dict:
    """Train and evaluate one tdrl run; returns frames, wall / CPU seconds and the eval return.

    ``seed``: one seed, or several trained as one vectorised model (``SeedAxis``, what
    ``tdrl.marl.runner`` does with ``vectorise_seeds=True``: one env of seed-major blocks of
    ``budget.envs`` sub-envs each, every network stacked over the seeds). One seed is an axis of
    one, built as a single run builds it (``torch.manual_seed(seed)`` just before the networks).
    ``frames`` counts one seed's frames; ``wall_s`` / ``cpu_s`` / ``sim_s`` are the whole run's;
    ``returns`` holds each seed's evaluation return (``budget.eval_episodes`` episodes of its
    own policy) and ``return`` their mean.

    ``time_limit_terminates``: VMAS's time limit also sets ``terminated`` (TorchRL's semantics,
    hence BenchMARL's: no bootstrapping there) instead of only ``truncated`` (tdrl's default).
    """
    from tdrl.core import InitTracker, TransformedEnv
    from tdrl.core.train import SeedAxis
    from tdrl.marl.loops import GroupPolicies, evaluate_per_env, train_off_policy, train_on_policy
    from tdrl.marl.envs import VmasEnv
    from tdrl.marl.vectorised import make_vectorised_groups

    t = benchmarl_task(task)
    conf = tdrl_configs(algorithm, budget, t["max_steps"])
    axis = SeedAxis([seed] if isinstance(seed, int) else list(seed))

    def env(n: int) -> VmasEnv:  # VMAS draws every sub-env from one generator: the axis's first seed
        return VmasEnv(t["scenario"], num_envs=axis.n * n, continuous_actions=conf["continuous"],
                       max_steps=t["max_steps"], seed=axis.seeds[0], device=device,
                       time_limit_terminates=time_limit_terminates, **t["kwargs"])

    train_env, eval_env = env(budget.envs), env(budget.eval_episodes)
    if conf["recurrent"]:  # the hidden states reset at episode starts
        train_env, eval_env = (TransformedEnv(e, InitTracker()) for e in (train_env, eval_env))
    parts = make_vectorised_groups(conf["builder"], train_env, axis.seeds, conf["algorithm"],
                                   num_cells=conf["num_cells"])
    loop = train_on_policy if conf["on_policy"] else train_off_policy
    t0, c0 = time.perf_counter(), time.process_time()
    with SimulatorClock() as sim:
        hist = loop(train_env, parts, conf["train"], n_seeds=axis)
        sync_device(device)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    policy = GroupPolicies({g: p.policy for g, p in parts.items()})
    rets = [float(r.mean()) for r in axis.split(evaluate_per_env(eval_env, policy, t["max_steps"]).reshape(-1))]
    return {"frames": hist[-1]["frames"], "wall_s": wall, "cpu_s": cpu, "sim_s": sim.seconds,
            "return": statistics.mean(rets), "returns": rets}


try:  # only inside .venv-benchmarl; module level so that BenchMARL can pickle it
    from benchmarl.experiment.callback import Callback as Callback
except ImportError:
    Callback = object


class _EvalReturns(Callback):
    """BenchMARL callback: the evaluation episodes' returns, cut at the first done as
    BenchMARL's logger does (sum over time of the mean over agents of the reward)."""

    returns: list[float] = []

    def on_evaluation_end(self, rollouts):
        out = []
        for r in rollouts:  # [T] per episode
            done = r.get(("next", "done")).reshape(r.batch_size[0], -1).any(-1)
            end = int(done.nonzero()[0, 0]) + 1 if bool(done.any()) else r.batch_size[0]
            out.append(float(r.get(("next", "agents", "reward"))[:end].sum(0).mean()))
        _EvalReturns.returns = out


def run_benchmarl(task: str, algorithm: str, budget: Budget, seed: int, device: str = "cpu") -> dict:
    """Runs inside .venv-benchmarl: BenchMARL's Experiment with :func:`benchmarl_overrides`."""
    from benchmarl.algorithms import (IddpgConfig, IppoConfig, IqlConfig, IsacConfig, MaddpgConfig, MappoConfig,
                                      MasacConfig, QmixConfig)
    from benchmarl.environments import VmasTask
    from benchmarl.experiment import Experiment, ExperimentConfig
    from benchmarl.models.gru import GruConfig
    from benchmarl.models.lstm import LstmConfig
    from benchmarl.models.mlp import MlpConfig

    over = benchmarl_overrides(algorithm, budget)
    algorithm = split_algorithm(algorithm)[0]
    cfg = ExperimentConfig.get_from_yaml()
    for k, v in over["experiment"].items():
        if not hasattr(cfg, k):
            raise AttributeError(f"BenchMARL's ExperimentConfig has no field {k!r}")
        setattr(cfg, k, v)
    cfg.sampling_device = cfg.train_device = cfg.buffer_device = device
    cfg.evaluation, cfg.render, cfg.loggers, cfg.create_json = False, False, [], False
    cfg.checkpoint_interval, cfg.checkpoint_at_end = 0, False
    cfg.save_folder = tempfile.mkdtemp(prefix="benchmarl_")
    algo = {"mappo": MappoConfig, "ippo": IppoConfig, "qmix": QmixConfig, "maddpg": MaddpgConfig, "iddpg": IddpgConfig,
            "masac": MasacConfig, "isac": IsacConfig, "iql": IqlConfig}[algorithm].get_from_yaml()
    model_class = {None: MlpConfig, "gru": GruConfig, "lstm": LstmConfig}[over["cell"]]
    model, critic = model_class.get_from_yaml(), model_class.get_from_yaml()  # tdrl: actor and critic both
    for obj, values in ((algo, over["algorithm"]), (model, over["model"]), (critic, over["model"])):
        for k, v in values.items():
            if not hasattr(obj, k):
                raise AttributeError(f"BenchMARL's {type(obj).__name__} has no field {k!r}")
            setattr(obj, k, v)
    values = benchmarl_task(task)
    bm_task = VmasTask[task.upper()].get_from_yaml()
    bm_task.config.update({"max_steps": values["max_steps"], **values["kwargs"]})
    exp = Experiment(task=bm_task, algorithm_config=algo, model_config=model, critic_model_config=critic,
                     seed=seed, config=cfg, callbacks=[_EvalReturns()])
    close, exp.close = exp.close, lambda: None  # keep the test env open past run() for the evaluation
    t0, c0 = time.perf_counter(), time.process_time()
    with SimulatorClock() as sim:
        exp.run()
        sync_device(device)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    exp.evaluate()  # BenchMARL's own evaluation loop (deterministic actions, evaluation_episodes envs)
    close()
    rets = _EvalReturns.returns
    if len(rets) != budget.eval_episodes:
        raise RuntimeError(f"BenchMARL evaluated {len(rets)} episodes, expected {budget.eval_episodes}")
    return {"frames": exp.total_frames, "wall_s": wall, "cpu_s": cpu, "sim_s": sim.seconds,
            "return": sum(rets) / len(rets)}


def run_benchmarl_side(module: str, argv: list[str], what: str) -> dict:
    """``python -m module argv`` in .venv-benchmarl, or ``TDRL_BENCHMARL_PYTHON`` (one thread, without this
    tree on the path: ``marl.benchmarl_env``); the JSON object its last stdout line prints.
    ``what`` names the run in the error."""
    out = subprocess.run(module_command(BENCHMARL_PY, module, *argv), capture_output=True, text=True, env=benchmarl_env(),
                         cwd=tempfile.gettempdir())
    if out.returncode != 0:
        raise RuntimeError(f"BenchMARL side failed ({what}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def benchmarl_subprocess(task: str, algorithm: str, budget: Budget, seed: int, device: str) -> dict:
    argv = ["--side", "benchmarl", "--tasks", task, "--algorithms", algorithm, "--seeds", str(seed),
            "--device", device, *budget_argv(budget)]
    return run_benchmarl_side(__spec__.name, argv, f"{task}, {algorithm}, seed {seed}")


BUDGET_FLAGS = {"envs": "--envs", "frames_per_batch": "--frames", "iters": "--iters", "epochs": "--epochs",
                 "minibatch": "--minibatch", "optimizer_steps": "--optimizer-steps",
                 "train_batch": "--train-batch", "eval_episodes": "--eval-episodes"}


def budget_argv(budget: Budget) -> list[str]:
    return [x for f, flag in BUDGET_FLAGS.items() for x in (flag, str(getattr(budget, f)))]


def mean_std(xs: list[float]) -> str:
    if len(xs) == 1:
        return f"{xs[0]:.3f} (1 seed)"
    return f"{statistics.mean(xs):.3f} ± {statistics.stdev(xs):.3f}"


def summarise(ours: list[dict], theirs: list[dict]) -> dict:
    """Figures of one (task, algorithm) pair from the per-seed runs of both sides.

    Returns:
        ``{"tdrl frames/s", "BenchMARL frames/s", "tdrl return", "BenchMARL return", "seeds"}``
        (frames/s: mean over seeds; return: mean ± std over seeds of the mean evaluation
        return) and ``"ratio"`` / ``"cpu ratio"`` (tdrl / BenchMARL frames/s, wall and CPU).
    """
    fps = lambda runs, k="wall_s": statistics.mean(r["frames"] / r[k] for r in runs)  # noqa: E731
    return {"tdrl frames/s": round(fps(ours)), f"{PEER.split()[0]} frames/s": round(fps(theirs)),
            "tdrl return": mean_std([r["return"] for r in ours]),
            f"{PEER.split()[0]} return": mean_std([r["return"] for r in theirs]),
            "seeds": len(ours), "ratio": fps(ours) / fps(theirs),
            "cpu ratio": fps(ours, "cpu_s") / fps(theirs, "cpu_s"), **own_part(ours, theirs)}


def own_part(ours: list[dict], theirs: list[dict]) -> dict:
    """Where VMAS bounds the ratio: each side's simulator share of its wall time, and the ratio
    of the two sides' own time per frame (wall minus simulator; BenchMARL's / tdrl's, so >1 means
    tdrl's own part is faster). Empty for runs recorded before the simulator was timed."""
    if not all("sim_s" in r for r in (*ours, *theirs)):
        return {}
    own = lambda runs: statistics.mean((r["wall_s"] - r["sim_s"]) / r["frames"] for r in runs)  # noqa: E731
    share = lambda runs: statistics.mean(r["sim_s"] / r["wall_s"] for r in runs)  # noqa: E731
    return {"own ratio": own(theirs) / own(ours), "sim share": (share(ours), share(theirs))}


def row_name(task: str, algorithm: str, budget: Budget, time_limit_terminates: bool = False,
             device: str = "cpu") -> str:
    """The RESULTS row of a pair: ``"MAPPO navigation"`` at the default budget; another budget
    names the fields it changes (``"MAPPO navigation, eval_episodes 200"``), so that a row
    measured at another budget sits beside the default one instead of replacing it; so do a
    row with TorchRL's time-limit semantics on the tdrl side (``", time limit terminates"``)
    and a row measured on another device than the CPU (``", device cuda"``)."""
    default = asdict(Budget())
    changed = [f"{k} {v}" for k, v in asdict(budget).items() if v != default[k]]
    changed += ["time limit terminates"] if time_limit_terminates else []
    changed += [f"device {device}"] if device != "cpu" else []
    return ", ".join([f"{algorithm.upper()} {task}", *changed])


def budget_note(budget: Budget, time_limit_terminates: bool = False) -> str:
    limit = ("Time limit: terminated (no bootstrap) on both sides (tdrl's VmasEnv time_limit_terminates=True, "
             "TorchRL's semantics); " if time_limit_terminates else
             "Not matched: at VMAS's time limit TorchRL reports terminated (no bootstrap) and tdrl truncated "
             "(bootstrapped); ")
    return (f"Budget per run: {budget.frames:,} frames ({budget.iters} iterations x {budget.frames_per_batch:,} "
            f"frames from {budget.envs} envs); MAPPO/IPPO {budget.epochs} epochs x minibatches of "
            f"{budget.minibatch:,}; QMIX {budget.optimizer_steps} gradient steps x {budget.train_batch} "
            f"sampled per iteration, epsilon 0.8 -> 0.01 over {budget.anneal_frames:,} frames, soft target "
            f"tau 0.005, mixer 32 with one-layer hypernetworks (TorchRL's QMixer), discrete VMAS actions "
            f"on both sides; MADDPG/IDDPG Gaussian noise 0.8 -> 0.01 over the same frames, tanh-mapped actions; "
            f"MASAC/ISAC 2 critics, automatic entropy from alpha 1; IQL epsilon as QMIX; their critic loss is "
            f"TorchRL's (x-y)^2 on both sides (tdrl's loss_function='mse'), so the clip acts alike. "
            f"BenchMARL's conf values on both sides (base_experiment / algorithm / "
            f"mlp YAML: gamma 0.99, Adam 5e-5 eps 1e-6, grad-norm clip 5, MLP 256x256 Tanh, shared "
            f"parameters) and its task YAMLs (tdrl.marl.tasks). Return: final deterministic evaluation "
            f"on {budget.eval_episodes} episodes, mean ± std over seeds; frames/s: training loop only, mean "
            f"over seeds; ratio tdrl / BenchMARL (wall clock; CPU time in brackets). {limit}"
            f"tdrl's timed loop includes its first env reset (BenchMARL's collector resets when it is built), "
            f"one reset more of {budget.iters + 1}, which weighs on sampling, whose VMAS reset is slow. "
            f"At this budget the returns measure early learning only.")


RUNS = Path(__file__).resolve().parent / "results" / "marl_table_runs.ndjson"  # not a RESULTS record (*.jsonl)


def _run_key(task: str, algorithm: str, seed: int, budget: Budget, device: str,
             time_limit_terminates: bool = False) -> str:
    extra = ["time_limit_terminates"] if time_limit_terminates else []  # earlier records stay valid
    return json.dumps([task, algorithm, seed, asdict(budget), device, *extra], sort_keys=True)


def load_runs(path: Path) -> dict[str, dict]:
    """Finished seeds of earlier invocations: ``{key: {"tdrl": result, "benchmarl": result}}``."""
    rows = read_keyed(path, lambda r: _run_key(r["task"], r["algorithm"], r["seed"], Budget(**r["budget"]),
                                                r["device"], r.get("time_limit_terminates", False)), "marl_table run")
    return {k: {"tdrl": r["tdrl"], "benchmarl": r["benchmarl"]} for k, r in rows.items()}


def peer_run(runs: dict[str, dict], task: str, algorithm: str, seed: int, budget: Budget,
             device: str) -> dict | None:
    """BenchMARL's result of a seed from a record of either time-limit variant, or None.

    ``--time-limit-terminates`` changes only the tdrl side, and a BenchMARL run is a
    deterministic function of its seed and budget on the CPU (its returns repeat to the last
    digit), so a variant's rows reuse the other's BenchMARL runs instead of rerunning them.
    """
    for tl in (False, True):
        done = runs.get(_run_key(task, algorithm, seed, budget, device, tl))
        if done is not None:
            return done["benchmarl"]
    return None


def append_run(path: Path, task: str, algorithm: str, seed: int, budget: Budget, device: str,
               ours: dict, theirs: dict, time_limit_terminates: bool = False) -> None:
    """Appends one finished seed (one line, flushed): what a resumed invocation reuses."""
    row = {"task": task, "algorithm": algorithm, "seed": seed, "budget": asdict(budget), "device": device,
           "tdrl": ours, "benchmarl": theirs, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    if time_limit_terminates:
        row["time_limit_terminates"] = True
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(row) + "\n")


def add_table_args(p: argparse.ArgumentParser, algorithms: Sequence[str], seeds: list[int], runs: Path,
                   what: str) -> None:
    """The flags both MARL tables take: tasks, algorithms, seeds, the budget, device, record and
    the ``--runs`` file of finished ``what`` (``--fresh`` reruns them)."""
    p.add_argument("--tasks", nargs="+", default=list(TASKS), help=f"of {', '.join(TASKS)}")
    p.add_argument("--algorithms", nargs="+", default=list(algorithms), help=f"of {', '.join(ALGORITHMS)}")
    p.add_argument("--seeds", nargs="+", type=int, default=seeds)
    defaults = Budget()
    for field, flag in BUDGET_FLAGS.items():
        p.add_argument(flag, dest=field, type=int, default=getattr(defaults, field))
    p.add_argument("--device", default="cpu", help="cpu or cuda[:index], both sides")
    p.add_argument("--record", action="store_true", help="write one benchmarks/results record per pair")
    p.add_argument("--runs", type=Path, default=runs, help=f"{what}, appended and reused (see above)")
    p.add_argument("--fresh", action="store_true", help=f"rerun the {what} already in --runs (appends the new ones)")


def checked_budget(args: argparse.Namespace) -> Budget:
    """The parsed tables' flags checked (device, tasks, algorithms) and their :class:`Budget`
    (one torch thread from here on); exits naming what is wrong."""
    check_device(args.device)
    for name, valid in (("tasks", TASKS), ("algorithms", ALGORITHMS)):
        bad = [x for x in getattr(args, name) if x not in valid]
        if bad:
            sys.exit(f"--{name}: unknown {bad}; valid: {', '.join(valid)}.")
    try:
        budget = Budget(**{f: getattr(args, f) for f in BUDGET_FLAGS})
    except ValueError as err:
        sys.exit(str(err))
    torch.set_num_threads(1)
    return budget


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--side", choices=["both", "tdrl", "benchmarl"], default="both")
    add_table_args(p, ALGORITHMS, [0, 1], RUNS, "per-seed results")
    p.add_argument("--time-limit-terminates", action="store_true",
                   help="tdrl side: VMAS's time limit sets terminated, as TorchRL's VmasEnv (BenchMARL) does")
    args = p.parse_args(argv)
    budget = checked_budget(args)
    if args.side != "both":
        run = run_tdrl if args.side == "tdrl" else run_benchmarl
        for task in args.tasks:
            for algorithm in args.algorithms:
                for seed in args.seeds:
                    kw = {"time_limit_terminates": True} if args.time_limit_terminates and run is run_tdrl else {}
                    print(json.dumps(run(task, algorithm, budget, seed, args.device, **kw)), flush=True)
        return
    if not BENCHMARL_PY.exists():
        sys.exit(f"{BENCHMARL_PY} {MISSING_BENCHMARL}")
    runs = load_runs(args.runs)
    for task in args.tasks:
        for algorithm in args.algorithms:
            ours, theirs = [], []
            for seed in args.seeds:  # interleave the sides so that load changes hit both
                tl = args.time_limit_terminates
                done = None if args.fresh else runs.get(_run_key(task, algorithm, seed, budget, args.device, tl))
                if done is not None:
                    ours.append(done["tdrl"])
                    theirs.append(done["benchmarl"])
                    print(f"{task} {algorithm} seed {seed}: reused from {args.runs}", flush=True)
                    continue
                ours.append(run_tdrl(task, algorithm, budget, seed, args.device, **({"time_limit_terminates": True}
                                                                                  if tl else {})))
                peer = None if args.fresh else peer_run(runs, task, algorithm, seed, budget, args.device)
                if peer is not None:
                    print(f"{task} {algorithm} seed {seed}: BenchMARL side reused from the other time-limit "
                          "variant's record", flush=True)
                theirs.append(peer if peer is not None else
                              benchmarl_subprocess(task, algorithm, budget, seed, args.device))
                append_run(args.runs, task, algorithm, seed, budget, args.device, ours[-1], theirs[-1], tl)
                print(f"{task} {algorithm} seed {seed}: tdrl {ours[-1]}  benchmarl {theirs[-1]}", flush=True)
            s = summarise(ours, theirs)
            ratio, cpu_ratio = s.pop("ratio"), s.pop("cpu ratio")
            own, share = s.pop("own ratio", None), s.pop("sim share", None)
            split = ("" if own is None else f"; simulator {share[0]:.0%} / {share[1]:.0%} of the wall time, "
                     f"own part {own:.2f}x")
            print(f"== {algorithm.upper()} {task}: {s}, {ratio:.2f}x ({cpu_ratio:.2f}x CPU){split}", flush=True)
            if args.record:
                from benchmarks.records import write_record

                name = row_name(task, algorithm, budget, args.time_limit_terminates, args.device)
                machine = ("shared 2-core CPU box" if args.device == "cpu" else
                           f"device machine ({torch.cuda.get_device_name(torch.device(args.device))})")
                write_record(SECTION, TABLE, name, s, peer=PEER, ratio=f"{ratio:.2f}x ({cpu_ratio:.2f}x){split}",
                             note=budget_note(budget, args.time_limit_terminates),
                             machine=f"{machine}, one torch thread per side, device {args.device}")


if __name__ == "__main__":
    main()
