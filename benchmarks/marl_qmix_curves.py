"""MARL: QMIX training curves of tdrl and BenchMARL side by side, iteration by iteration.

``marl_parity.py`` shows that one QMIX update from the same state is the same computation;
``marl_table.py`` compares the final returns of whole runs. This script sits between them: both
sides train QMIX on a VMAS task with the table's matched config (``marl_table.tdrl_configs`` /
``benchmarl_overrides``, the same ``Budget``) and every iteration logs, per side,

* ``eps``: the scheduled epsilon the batch was collected with, and ``eps_obs``: the epsilon the
  batch shows (fraction of actions that are not the argmax of the recorded Q values, over
  ``1 - 1/n_actions``);
* ``buffer``: replay size after the batch; ``steps``: gradient steps so far;
* ``loss``, ``q_tot``, ``target``: mean over the iteration's gradient steps of the TD loss (on
  TorchRL's scale ``(x - y)^2``: tdrl's ``0.5 (x - y)^2`` doubled), of the mixed Q of the sampled
  transitions and of their TD targets;
* ``gnorm``: mean gradient norm before clipping (TorchRL's scale), ``clip``: fraction of steps
  that were clipped;
* ``ret``: mean return of the training episodes that ended in the batch, ``eps_n``: how many.

The instrumentation only reads: the loss modules' ``distance_loss`` and (tdrl)
``clip_grad_norm_`` / the collector are wrapped to record what passes through; BenchMARL's
side uses its callbacks (``on_batch_collected``, ``on_train_end``). The printed table is the
mean over ``--seeds`` of each side, then the final greedy evaluation return per seed
(``--eval-episodes``, as in ``marl_table.py``).

    flock /tmp/tdrl-cpu.lock python -u benchmarks/marl_qmix_curves.py --seeds 0 1 2 3
    flock /tmp/tdrl-cpu.lock python -u benchmarks/marl_qmix_curves.py --seeds 0 1 --time-limit-terminates
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import torch
from benchmarks.marl import benchmarl_task
from benchmarks.marl_table import Budget, BUDGET_FLAGS, Callback, budget_argv, benchmarl_overrides, run_benchmarl_side

COLUMNS = ("eps", "eps_obs", "buffer", "steps", "loss", "q_tot", "target", "gnorm", "clip", "ret", "eps_n")


def batch_stats(batch, n_actions: int) -> dict:
    """What a collected batch shows (works with either side's tensordict): observed epsilon,
    ended episodes and their mean return (sum over the episode of the agents' mean reward)."""
    av, act = batch.get(("agents", "action_value")), batch.get(("agents", "action"))
    nongreedy = float((act != av.argmax(-1)).float().mean())
    done = batch.get(("next", "done")).reshape(batch.shape)
    ep = batch.get(("next", "agents", "episode_reward")).mean(-2).reshape(batch.shape)
    rets = ep[done]
    return {"eps_obs": nongreedy / (1.0 - 1.0 / n_actions), "eps_n": int(rets.numel()),
            "ret": float(rets.mean()) if rets.numel() else float("nan")}


class _Steps:
    """Per-gradient-step records of one iteration: loss, q_tot, target, grad norm, clipped."""

    def __init__(self) -> None:
        self.rows: list[dict] = []
        self.total = 0

    def add_loss(self, pred, target) -> None:
        """One step's mixed Q and TD target; the loss on TorchRL's ``(x - y)^2`` scale."""
        pred, target = pred.detach(), target.detach()
        self.rows.append({"q_tot": float(pred.mean()), "target": float(target.mean()),
                          "loss": float((pred - target).pow(2).mean())})
        self.total += 1

    def flush(self) -> dict:
        keys = ("loss", "q_tot", "target", "gnorm", "clip")
        out = {k: statistics.mean(r[k] for r in self.rows if k in r) if any(k in r for r in self.rows)
               else float("nan") for k in keys}
        out["steps"] = self.total
        self.rows = []
        return out


def tdrl_curves(task: str, budget: Budget, seed: int, time_limit_terminates: bool = False,
                init_path: Path | None = None) -> dict:
    """One tdrl run with per-iteration diagnostics; ``{"rows": [...], "return": eval return}``.

    ``init_path``: save the initial Q network and mixer there (TorchRL's parameter layout), for
    a BenchMARL run from the same weights (``--same-init``).
    """
    from benchmarks import marl_table as mt
    from tdrl.core.collectors import Collector
    from tdrl.marl.loops import common as loops_common
    from tdrl.marl.loops import off_policy as trainer_off
    from tdrl.marl.algorithms import ALGORITHMS as BUILDERS
    from tdrl.marl.envs import VmasEnv
    from tdrl.marl.objectives import qmix as qmix_mod
    from tdrl.marl.loops import evaluate

    t = benchmarl_task(task)
    conf = mt.tdrl_configs("qmix", budget, t["max_steps"])
    torch.manual_seed(seed)

    def env(n: int) -> VmasEnv:
        return VmasEnv(t["scenario"], num_envs=n, continuous_actions=False, max_steps=t["max_steps"], seed=seed,
                       time_limit_terminates=time_limit_terminates, **t["kwargs"])

    train_env, eval_env = env(budget.envs), env(budget.eval_episodes)
    parts = BUILDERS["qmix"][0](train_env, conf["algorithm"], num_cells=conf["num_cells"])
    n_actions = train_env.full_action_spec["agents", "action"].n
    if init_path is not None:
        from benchmarks.marl_parity import mixer_state, mlp_state

        torch.save({"q": mlp_state(parts.loss.local_value_network.module), "mixer": mixer_state(parts.loss.mixer)},
                   init_path)
    steps, batches, rows = _Steps(), [], []
    clip_val = conf["train"].max_grad_norm

    orig_dist, orig_clip = qmix_mod.distance_loss, torch.nn.utils.clip_grad_norm_

    def dist(pred, target, kind):
        steps.add_loss(pred, target)
        return orig_dist(pred, target, kind)

    def clip(params, max_norm, *a, **k):
        norm = orig_clip(params, max_norm, *a, **k)
        steps.rows[-1].update(gnorm=2 * float(norm), clip=float(norm > max_norm))  # TorchRL's scale
        return norm

    class RecordingCollector(Collector):
        def rollout(self):
            b = super().rollout()
            batches.append(b)
            return b

    def log(rec: dict) -> None:
        b = batches[-1]
        row = {"eps": eps_at_collection.pop(0), "buffer": rec["frames"], **batch_stats(b, n_actions), **steps.flush()}
        rows.append(row)
        eps_at_collection.append(rec["eps"])

    eps_at_collection = [parts.explore.eps]
    qmix_mod.distance_loss, torch.nn.utils.clip_grad_norm_ = dist, clip
    loops_common.Collector = RecordingCollector  # start_collection builds the loop's collector
    try:
        trainer_off.train_off_policy(train_env, parts, conf["train"], log=log)
    finally:
        qmix_mod.distance_loss, torch.nn.utils.clip_grad_norm_ = orig_dist, orig_clip
        loops_common.Collector = Collector
    assert clip_val is not None
    return {"rows": rows, "return": evaluate(eval_env, parts.policy, t["max_steps"])}


class _Curves(Callback):
    """BenchMARL callback: one row per iteration (the batch's statistics, then the training's)."""

    steps: _Steps
    rows: list[dict] = []
    state: dict = {}

    def on_batch_collected(self, batch):
        explore = self.experiment.group_policies["agents"][-1]
        n_actions = self.experiment.action_spec["agents", "action"].space.n
        _Curves.state["row"] = {"eps": float(explore.eps), **batch_stats(batch, n_actions)}

    def on_train_end(self, training_td, group):
        g = training_td.get("grad_norm_loss")
        row = {**_Curves.state.pop("row"), "buffer": len(self.experiment.replay_buffers[group]),
               **_Curves.steps.flush()}
        row.update(gnorm=float(g.mean()), clip=float((g > 5.0).float().mean()))  # clip_grad_val 5
        _Curves.rows.append(row)


def _load_init(loss, path: Path) -> None:
    """BenchMARL side of ``--same-init``: the tdrl run's initial weights into the QMixerLoss's
    online and target parameters (the collection policy shares the online ones)."""
    saved = torch.load(path)
    with torch.no_grad():
        for name, prefix in (("q", ("module", "0", "mlp")), ("mixer", ("module",))):
            online = getattr(loss, "local_value_network_params" if name == "q" else "mixer_network_params")
            target = getattr(loss, "target_local_value_network_params" if name == "q" else "target_mixer_network_params")
            for k, v in saved[name].items():
                key = (*prefix, *k.split("."))
                online.get(key).data.copy_(v)
                target.get(key).data.copy_(v)
            if len(saved[name]) != len(list(online.keys(True, True))):
                raise RuntimeError(f"--same-init: {name} has {len(list(online.keys(True, True)))} tensors, "
                                   f"the tdrl side saved {len(saved[name])}")


def benchmarl_curves(task: str, budget: Budget, seed: int, init_path: Path | None = None) -> dict:
    """Inside .venv-benchmarl: BenchMARL's Experiment with per-iteration diagnostics
    (``init_path``: start from the tdrl run's saved weights)."""
    from benchmarl.algorithms import QmixConfig
    from benchmarl.environments import VmasTask
    from benchmarl.experiment import Experiment, ExperimentConfig
    from benchmarl.models.mlp import MlpConfig
    from torchrl.objectives.multiagent import qmixer

    from benchmarks import marl_table as mt

    _Curves.steps, _Curves.rows, _Curves.state = _Steps(), [], {}
    orig_dist = qmixer.distance_loss

    def dist(pred, target, kind):
        _Curves.steps.add_loss(pred, target)
        return orig_dist(pred, target, kind)

    over = benchmarl_overrides("qmix", budget)
    cfg = ExperimentConfig.get_from_yaml()
    for k, v in over["experiment"].items():
        setattr(cfg, k, v)
    cfg.evaluation, cfg.render, cfg.loggers, cfg.create_json = False, False, [], False
    cfg.checkpoint_interval, cfg.checkpoint_at_end = 0, False
    cfg.save_folder = tempfile.mkdtemp(prefix="benchmarl_")
    algo, model, critic = QmixConfig.get_from_yaml(), MlpConfig.get_from_yaml(), MlpConfig.get_from_yaml()
    for obj, values in ((algo, over["algorithm"]), (model, over["model"]), (critic, over["model"])):
        for k, v in values.items():
            setattr(obj, k, v)
    values = benchmarl_task(task)
    bm_task = VmasTask[task.upper()].get_from_yaml()
    bm_task.config.update({"max_steps": values["max_steps"], **values["kwargs"]})
    qmixer.distance_loss = dist
    exp = Experiment(task=bm_task, algorithm_config=algo, model_config=model, critic_model_config=critic,
                     seed=seed, config=cfg, callbacks=[_Curves(), mt._EvalReturns()])
    if init_path is not None:
        _load_init(exp.losses["agents"], init_path)
    close, exp.close = exp.close, lambda: None
    exp.run()
    qmixer.distance_loss = orig_dist
    exp.evaluate()
    close()
    rets = mt._EvalReturns.returns
    return {"rows": _Curves.rows, "return": sum(rets) / len(rets)}


def _benchmarl_subprocess(task: str, budget: Budget, seed: int, init_path: Path | None = None) -> dict:
    argv = ["--side", "benchmarl", "--task", task, "--seeds", str(seed), *budget_argv(budget),
            *(["--init", str(init_path)] if init_path is not None else [])]
    return run_benchmarl_side(__spec__.name, argv, f"seed {seed}")


def mean_rows(runs: list[dict]) -> list[dict]:
    """Per-iteration mean over seeds of every column."""
    n = min(len(r["rows"]) for r in runs)
    return [{c: statistics.mean(r["rows"][i][c] for r in runs) for c in COLUMNS} for i in range(n)]


def print_table(name: str, rows: list[dict]) -> None:
    fmt = {"buffer": "{:>7.0f}", "steps": "{:>5.0f}", "eps_n": "{:>5.0f}"}
    print(f"-- {name}")
    print("iter " + " ".join(f"{c:>8}" for c in COLUMNS))
    for i, r in enumerate(rows):
        print(f"{i:>4} " + " ".join(fmt.get(c, "{:>8.3f}").format(r[c]).rjust(8) for c in COLUMNS))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--side", choices=["both", "tdrl", "benchmarl"], default="both")
    p.add_argument("--task", default="balance")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    defaults = Budget(eval_episodes=200)
    for field, flag in BUDGET_FLAGS.items():
        p.add_argument(flag, dest=field, type=int, default=getattr(defaults, field))
    p.add_argument("--time-limit-terminates", action="store_true",
                   help="tdrl side: VMAS's time limit sets terminated, as TorchRL's VmasEnv (BenchMARL) does")
    p.add_argument("--same-init", action="store_true",
                   help="BenchMARL starts from the tdrl run's initial Q network and mixer (a paired comparison)")
    p.add_argument("--init", type=Path, help=argparse.SUPPRESS)  # (--side benchmarl) the saved weights
    p.add_argument("--json", type=Path, help="also write every run's rows here")
    args = p.parse_args(argv)
    budget = Budget(**{f: getattr(args, f) for f in BUDGET_FLAGS})
    torch.set_num_threads(1)
    if args.side == "benchmarl":
        for seed in args.seeds:
            print(json.dumps(benchmarl_curves(args.task, budget, seed, args.init)), flush=True)
        return
    runs: dict[str, list[dict]] = {"tdrl": [], "benchmarl": []}
    tmp = tempfile.TemporaryDirectory()
    for seed in args.seeds:
        init = Path(tmp.name) / f"init_{seed}.pt" if args.same_init else None
        if args.side in ("both", "tdrl"):
            runs["tdrl"].append(tdrl_curves(args.task, budget, seed, args.time_limit_terminates, init))
        if args.side == "both":
            runs["benchmarl"].append(_benchmarl_subprocess(args.task, budget, seed, init))
        print(f"seed {seed}: " + ", ".join(f"{k} {v[-1]['return']:.3f}" for k, v in runs.items() if v), flush=True)
    tmp.cleanup()
    tl = " (tdrl: time limit terminates)" if args.time_limit_terminates else ""
    for side, rs in runs.items():
        if rs:
            print_table(f"{side}{tl if side == 'tdrl' else ''}, mean over seeds {args.seeds}", mean_rows(rs))
            print(f"   final greedy return ({budget.eval_episodes} episodes) per seed: "
                  + ", ".join(f"{r['return']:.3f}" for r in rs))
    if args.json:
        args.json.write_text(json.dumps({"seeds": args.seeds, "budget": budget.__dict__, "same_init": args.same_init,
                                         "time_limit_terminates": args.time_limit_terminates, **runs}))


if __name__ == "__main__":
    main()
