"""MARL: one update of tdrl's MAPPO and QMIX against TorchRL's losses (BenchMARL's), same weights, same batch.

``marl_table.py`` compares whole runs, whose returns differ by seed; this script checks that one
update is the same computation, so that a gap in returns cannot come from the losses. The tdrl
side builds the table's parts (``marl_table.tdrl_configs``) on a VMAS task, collects a batch,
computes its advantages / TD targets, loss and gradients, and saves them with the weights; the
BenchMARL side (``.venv-benchmarl``, a subprocess) builds TorchRL's networks as BenchMARL does
(``MultiAgentMLP``, ``NormalParamExtractor("biased_softplus_1.0")`` + ``TanhNormal``, ``QMixer``),
loads the weights and computes ``ClipPPOLoss`` + ``GAE`` and ``QMixerLoss`` + ``TD0`` on the same
batch. Printed: relative errors of the advantages, value targets, losses and gradients (TorchRL's
``"l2"`` is ``(x - y)^2``, tdrl's ``0.5 (x - y)^2``: tdrl's QMIX loss and gradients are doubled
before the comparison, its MAPPO critic coefficient is 2, as in the table).

The QMIX batch crosses VMAS's time limit; TorchRL reports it as ``terminated`` and tdrl as
``truncated``, so the QMIX comparison is made twice: with tdrl's termination flags (the same
computation) and with TorchRL's (which shows what that one unmatched semantic changes). The MAPPO
actor's gradients differ only where an action saturates (pre-tanh ``|u| > 7``): TorchRL clamps
``tanh`` at ``1 - 1e-6`` before the log-prob, tdrl at float32's ``1 - 1.2e-7``; at the table's
policies this does not occur (``--loc-shift 4`` forces it: actor gradients then differ by ~40%).

Measured 2026-12-02 (seed 0): MAPPO advantages, value targets, both losses and all gradients
agree to <= 2e-7; QMIX loss and gradients with tdrl's flags agree exactly, with TorchRL's
time-limit flags they differ by 0.4% (Q net) and 2% (mixer) on a batch holding 7 time-limit ends
in 1,920 transitions.

    python -m benchmarks.marl_parity            # both sides; needs .venv-benchmarl
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

import torch
from benchmarks.records import module_command
from benchmarks.marl import BENCHMARL_PY, MISSING_BENCHMARL, benchmarl_env

STEPS = {"mappo": 50, "qmix": 120}  # rollout steps: MAPPO's stay inside an episode, QMIX's cross the limit
TASKS = {"mappo": "navigation", "qmix": "balance"}


def mlp_state(mlp) -> dict:
    """tdrl's shared-parameter ``MultiAgentMLP`` as TorchRL's ``MultiAgentMLP`` state (``params.<2i>.*``)."""
    out = {f"params.{2 * i}.weight": w[0].T.detach().clone() for i, w in enumerate(mlp.weights)}
    out.update({f"params.{2 * i}.bias": b[0].detach().clone() for i, b in enumerate(mlp.biases)})
    return out


def _mlp_grads(mlp) -> dict:
    return {f"params.{2 * i}.weight": w.grad[0].T.clone() for i, w in enumerate(mlp.weights)}


def mixer_state(q) -> dict:
    """tdrl's one-layer-hypernetwork ``QMixer`` as TorchRL's ``QMixer`` state."""
    pairs = {"hyper_w_1": q.hyper_w1, "hyper_w_final": q.hyper_w2, "hyper_b_1": q.hyper_b1,
             "V.0": q.value[0], "V.2": q.value[2]}
    return {f"{k}.{p}": getattr(m, p).detach().clone() for k, m in pairs.items() for p in ("weight", "bias")}


def tdrl_side(algorithm: str, seed: int = 0, envs: int = 16, loc_shift: float = 0.5) -> dict:
    """Build, collect, and compute one tdrl update; returns the tensors the other side needs.

    ``loc_shift``: MAPPO only, added (from ``-loc_shift`` to ``+loc_shift``) to the actor's output
    biases; a large one saturates actions, where the two log-probs differ (see the module doc).
    """
    from benchmarks import marl_table as mt
    from tdrl.core.objectives import total_loss
    from tdrl.marl.algorithms import ALGORITHMS
    from tdrl.marl.envs import VmasEnv
    from tdrl.marl.loops import collect

    task = mt.benchmarl_task(TASKS[algorithm])
    conf = mt.tdrl_configs(algorithm, mt.Budget(), task["max_steps"])
    torch.manual_seed(seed)
    env = VmasEnv(task["scenario"], num_envs=envs, continuous_actions=conf["continuous"],
                  max_steps=task["max_steps"], seed=seed, **task["kwargs"])
    parts = ALGORITHMS[algorithm].build(env, conf["algorithm"], num_cells=conf["num_cells"])
    loss = parts.loss
    if algorithm == "mappo":
        actor_mlp, critic_mlp = loss.actor.module[0].module[0], loss.critic.module
        with torch.no_grad():  # move the actor's outputs off their init (locs != 0, scales != 1)
            actor_mlp.biases[-1].add_(loc_shift * torch.linspace(-1.0, 1.0, actor_mlp.biases[-1].shape[-1]))
    else:
        with torch.no_grad():  # targets != online nets, so that using the targets is checked
            for p in [*loss.target_local_value_network.parameters(), *loss.target_mixer.parameters()]:
                p.add_(0.05 * torch.randn_like(p))
    batch, _ = collect(env, parts.policy, env.reset(), STEPS[algorithm])
    if algorithm == "mappo":
        parts.estimator(batch)
        batch_in = batch.exclude("next").reshape(-1)
    else:
        batch_in = batch.reshape(-1)
    out = loss(batch_in)
    total_loss(out).backward()
    keys = {"obs": ("agents", "observation"), "action": ("agents", "action"),
            "next_obs": ("next", "agents", "observation"), "reward": ("next", "agents", "reward"),
            "done": ("next", "done"), "terminated": ("next", "terminated")}
    if algorithm == "mappo":
        keys.update(log_prob=("agents", "action_log_prob"), advantage=("agents", "advantage"),
                    value_target=("agents", "value_target"))
        spec = env.full_action_spec["agents", "action"]
        saved = {"actor": mlp_state(actor_mlp), "critic": mlp_state(critic_mlp),
                 "g_actor": _mlp_grads(actor_mlp), "g_critic": _mlp_grads(critic_mlp),
                 "low": spec.low[0, 0].clone(), "high": spec.high[0, 0].clone()}
    else:
        qnet, target_qnet = loss.local_value_network.module, loss.target_local_value_network.module
        saved = {"q": mlp_state(qnet), "target_q": mlp_state(target_qnet), "mixer": mixer_state(loss.mixer),
                 "target_mixer": mixer_state(loss.target_mixer), "g_q": _mlp_grads(qnet),
                 "g_w1": loss.mixer.hyper_w1.weight.grad.clone()}
    saved["data"] = {k: batch.get(v).detach().clone() for k, v in keys.items()}
    saved["terms"] = {k: float(v.detach()) for k, v in out.items()}
    saved["algorithm"] = algorithm
    return saved


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def _load_state(module, state: dict) -> None:
    with torch.no_grad():
        for k, v in state.items():
            module.get_parameter(k).copy_(v)


def benchmarl_side(saved: dict) -> dict:
    """Inside .venv-benchmarl: TorchRL's loss on the saved weights and batch; relative errors."""
    from tensordict import TensorDict
    from tensordict.nn import NormalParamExtractor, TensorDictModule, TensorDictSequential
    from torchrl.modules import MultiAgentMLP, ProbabilisticActor, QMixer, QValueModule, TanhNormal
    from torchrl.objectives import ClipPPOLoss, QMixerLoss, ValueEstimators

    d, tanh = saved["data"], torch.nn.Tanh
    n_envs, n_steps, n, obs_dim = d["obs"].shape
    res: dict = {}
    if saved["algorithm"] == "mappo":
        act = d["action"].shape[-1]
        amlp = MultiAgentMLP(obs_dim, 2 * act, n, centralised=False, share_params=True, num_cells=[256, 256],
                             activation_class=tanh)
        cmlp = MultiAgentMLP(obs_dim, 1, n, centralised=True, share_params=True, num_cells=[256, 256],
                             activation_class=tanh)
        _load_state(amlp, saved["actor"])
        _load_state(cmlp, saved["critic"])
        g = "agents"
        actor = ProbabilisticActor(
            TensorDictSequential(
                TensorDictModule(amlp, in_keys=[(g, "observation")], out_keys=[(g, "logits")]),
                TensorDictModule(NormalParamExtractor(scale_mapping="biased_softplus_1.0"), in_keys=[(g, "logits")],
                                 out_keys=[(g, "loc"), (g, "scale")])),
            in_keys=[(g, "loc"), (g, "scale")], out_keys=[(g, "action")], distribution_class=TanhNormal,
            distribution_kwargs={"low": saved["low"], "high": saved["high"]}, return_log_prob=True,
            log_prob_key=(g, "log_prob"))
        critic = TensorDictModule(cmlp, in_keys=[(g, "observation")], out_keys=[(g, "state_value")])
        loss = ClipPPOLoss(actor=actor, critic=critic, clip_epsilon=0.2, entropy_coeff=0.0, critic_coeff=1.0,
                           loss_critic_type="l2", normalize_advantage=False)  # BenchMARL's Mappo._get_loss
        loss.set_keys(reward=(g, "reward"), action=(g, "action"), done=(g, "done"), terminated=(g, "terminated"),
                      advantage=(g, "advantage"), value_target=(g, "value_target"), value=(g, "state_value"),
                      sample_log_prob=(g, "log_prob"))
        loss.make_value_estimator(ValueEstimators.GAE, gamma=0.99, lmbda=0.9)
        per_agent = lambda x: x.unsqueeze(-1).expand(n_envs, n_steps, n, 1)  # noqa: E731  (Mappo.process_batch)
        td = TensorDict({g: {"observation": d["obs"], "action": d["action"], "log_prob": d["log_prob"]},
                         "next": {g: {"observation": d["next_obs"], "reward": d["reward"],
                                      "done": per_agent(d["done"]), "terminated": per_agent(d["terminated"])},
                                  "done": d["done"], "terminated": d["terminated"]}}, batch_size=[n_envs, n_steps])
        with torch.no_grad():
            loss.value_estimator(td, params=loss.critic_network_params, target_params=loss.target_critic_network_params)
        res["advantage"] = _rel(d["advantage"], td.get((g, "advantage")))
        res["value_target"] = _rel(d["value_target"], td.get((g, "value_target")))
        out = loss(td.reshape(-1))
        (out["loss_objective"] + out["loss_critic"]).backward()
        res["loss_objective"] = abs(saved["terms"]["loss_objective"] - float(out["loss_objective"])) / abs(
            float(out["loss_objective"]))
        res["loss_critic"] = abs(saved["terms"]["loss_critic"] - float(out["loss_critic"])) / abs(float(out["loss_critic"]))
        res["actor_grads"] = max(_rel(v, amlp.get_parameter(k).grad) for k, v in saved["g_actor"].items())
        res["critic_grads"] = max(_rel(v, cmlp.get_parameter(k).grad) for k, v in saved["g_critic"].items())
        return res
    n_actions = saved["q"]["params.4.weight"].shape[0]
    mlp = MultiAgentMLP(obs_dim, n_actions, n, centralised=False, share_params=True, num_cells=[256, 256],
                        activation_class=tanh)
    _load_state(mlp, saved["q"])
    g = "agents"
    from torchrl.data import Categorical

    spec = Categorical(n_actions, shape=(n,))
    qnet = TensorDictSequential(
        TensorDictModule(mlp, in_keys=[(g, "observation")], out_keys=[(g, "action_value")]),
        QValueModule(action_value_key=(g, "action_value"), spec=spec, action_space=None,
                     out_keys=[(g, "action"), (g, "action_value"), (g, "chosen_action_value")]))
    mixer = QMixer(state_shape=(n, obs_dim), mixing_embed_dim=32, n_agents=n, device="cpu")
    _load_state(mixer, saved["mixer"])
    mix = TensorDictModule(mixer, in_keys=[(g, "chosen_action_value"), (g, "observation")],
                           out_keys=["chosen_action_value"])
    loss = QMixerLoss(qnet, mix, delay_value=True, loss_function="l2", action_space=spec)  # BenchMARL's Qmix._get_loss
    loss.set_keys(reward="reward", action=(g, "action"), done="done", terminated="terminated",
                  action_value=(g, "action_value"), local_value=(g, "chosen_action_value"),
                  global_value="chosen_action_value", priority="td_error")
    loss.make_value_estimator(ValueEstimators.TD0, gamma=0.99)
    with torch.no_grad():
        for k, v in saved["target_q"].items():
            loss.target_local_value_network_params.set(("module", "0", "module", *k.split(".")), v.clone())
        for k, v in saved["target_mixer"].items():
            loss.target_mixer_network_params.set(("module", *k.split(".")), v.clone())
    for name, terminated in (("tdrl_flags", d["terminated"]), ("torchrl_flags", d["done"])):
        for p in loss.parameters():
            p.grad = None
        td = TensorDict({g: {"observation": d["obs"], "action": d["action"]},
                         "next": {g: {"observation": d["next_obs"], "reward": d["reward"]},
                                  "reward": d["reward"].mean(-2), "done": d["done"], "terminated": terminated}},
                        batch_size=[d["obs"].shape[0]])  # Qmix.process_batch: the team reward is the agents' mean
        out = loss(td)["loss"]
        out.backward()
        res[f"loss ({name})"] = abs(2 * saved["terms"]["loss_qvalue"] - float(out)) / float(out)
        res[f"q_grads ({name})"] = max(_rel(2 * v, mlp.get_parameter(k).grad) for k, v in saved["g_q"].items())
        res[f"mixer_grad ({name})"] = _rel(2 * saved["g_w1"], mixer.hyper_w_1.weight.grad)
    return res


def run(algorithm: str, seed: int = 0, loc_shift: float = 0.5) -> dict:
    """Both sides for ``algorithm``: ``{quantity: relative error}`` (needs .venv-benchmarl)."""
    if not BENCHMARL_PY.exists():
        raise FileNotFoundError(f"{BENCHMARL_PY} {MISSING_BENCHMARL}")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{algorithm}.pt"
        torch.save(tdrl_side(algorithm, seed, loc_shift=loc_shift), path)
        out = subprocess.run(module_command(BENCHMARL_PY, __spec__.name, "--side", "benchmarl", "--saved", path),
                             capture_output=True, text=True, env=benchmarl_env(), cwd=tmp)
    if out.returncode != 0:
        raise RuntimeError(f"BenchMARL side failed ({algorithm}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--side", choices=["both", "benchmarl"], default="both")
    p.add_argument("--saved", type=Path, help="(--side benchmarl) the tdrl side's saved tensors")
    p.add_argument("--algorithms", nargs="+", default=["mappo", "qmix"], choices=["mappo", "qmix"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--loc-shift", type=float, default=0.5, help="MAPPO: shift of the actor's output biases")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    if args.side == "benchmarl":
        print(json.dumps(benchmarl_side(torch.load(args.saved))))
        return
    for algorithm in args.algorithms:
        res = run(algorithm, args.seed, args.loc_shift)
        print(f"{algorithm} ({TASKS[algorithm]}), relative error tdrl vs TorchRL:",
              ", ".join(f"{k} {v:.1e}" for k, v in res.items()))


if __name__ == "__main__":
    main()
