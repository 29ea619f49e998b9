"""Recurrent (GRU) MAPPO / IPPO: the hidden state is zeroed exactly at episode starts, the
update's replay of whole trajectories reproduces the rollout (ratio == 1 before the first
step, with resets inside the batch), tiny runs on VMAS and PettingZoo train the GRUs, a
resumed recurrent benchmark equals the uninterrupted one, and bad setups are refused."""

from __future__ import annotations

import json

import pytest
import torch
from tensordict import TensorDict
from torch import nn

from tdrl.core import InitTracker, TransformedEnv
from tdrl.core.envs import SerialEnv
from tdrl.core.objectives._nets import get_dist
from tdrl.marl.algorithms import make_groups, make_ippo, make_mappo
from tdrl.marl.envs import PettingZooEnv, VmasEnv
from tdrl.marl.modules import MultiAgentGRU, MultiAgentLSTM
from tdrl.marl.objectives import IPPOConfig, MAPPOConfig
from tdrl.marl.runner import BenchConfig, run_benchmark
from tdrl.marl.loops import TrainConfig, collect, train_on_policy

OBS, FEAT, STATE = ("agents", "observation"), ("agents", "features"), ("agents", "state")


def _reference(gru: nn.GRU, x: torch.Tensor, h0: torch.Tensor, init: torch.Tensor) -> torch.Tensor:
    """Hand-rolled GRU cell over ``x [N, T, F]`` from ``h0 [N, H]``, ``h`` set to 0 where
    ``init [N, T]``; returns every step's new state ``[N, T, H]``."""
    cell = nn.GRUCell(gru.input_size, gru.hidden_size)
    with torch.no_grad():
        for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            getattr(cell, name).copy_(getattr(gru, f"{name}_l0"))
    h, out = h0, []
    for t in range(x.shape[1]):
        h = cell(x[:, t], torch.where(init[:, t, None], torch.zeros_like(h), h))
        out.append(h)
    return torch.stack(out, 1)


@pytest.mark.parametrize("centralised", [False, True])
@pytest.mark.parametrize("share", [True, False])
def test_hidden_state_is_zeroed_exactly_where_is_init(centralised, share):
    torch.manual_seed(0)
    E, T, n, F, H = 2, 6, 3, 4, 5
    m = MultiAgentGRU(F, H, n, centralised, share, OBS, FEAT, STATE)
    x = torch.randn(E, T, n, F)
    init = torch.zeros(E, T, 1, dtype=torch.bool)
    init[0, 3] = init[1, 0] = True  # row 0: a new episode at t=3; row 1: at t=0
    s0 = torch.randn(E, T, n, 1, H)  # a non-zero carried state (only t=0 is read)
    td = TensorDict({OBS: x, "is_init": init, STATE: s0}, batch_size=[E, T])
    with torch.no_grad():
        seq = m.set_recurrent_mode(True)(td.clone())
        for k in range(n):  # agent k against the hand-rolled cell with its own weights
            gru = m.module.cells[0 if share else k]
            xk = x.flatten(-2) if centralised else x[:, :, k]
            h0 = s0[:, 0, 0 if centralised and share else k, 0]
            ref = _reference(gru, xk, h0, init[..., 0])
            torch.testing.assert_close(seq[FEAT][:, :, k], ref)
            torch.testing.assert_close(seq["next", *STATE][:, :, k, 0], ref)
        # where is_init, the output is the zero state's, whatever state came in (step mode)
        step = m(TensorDict({OBS: x[:, 3], "is_init": init[:, 3], STATE: s0[:, 0]}, batch_size=[E]))
        zero = m(TensorDict({OBS: x[:, 3], "is_init": init[:, 3], STATE: torch.zeros_like(s0[:, 0])},
                            batch_size=[E]))
    torch.testing.assert_close(step[FEAT][0], zero[FEAT][0])  # row 0 starts an episode at t=3
    assert not torch.allclose(step[FEAT][1], zero[FEAT][1])  # row 1 carries its state on
    # recurrent mode == the same steps taken one by one in step mode
    state, outs = s0[:, 0], []
    with torch.no_grad():
        for t in range(T):
            out = m(TensorDict({OBS: x[:, t], "is_init": init[:, t], STATE: state}, batch_size=[E]))
            outs.append(out[FEAT])
            state = out["next", *STATE]
    torch.testing.assert_close(torch.stack(outs, 1), seq[FEAT])


def _lstm_reference(lstm: nn.LSTM, x, h0, c0, init):
    """Hand-rolled LSTM cell over ``x [N, T, F]`` from ``(h0, c0) [N, H]``, both zeroed where
    ``init [N, T]``; returns every step's ``(h, c)``, each ``[N, T, H]``."""
    cell = nn.LSTMCell(lstm.input_size, lstm.hidden_size)
    with torch.no_grad():
        for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            getattr(cell, name).copy_(getattr(lstm, f"{name}_l0"))
    h, c, hs, cs = h0, c0, [], []
    for t in range(x.shape[1]):
        z = init[:, t, None]
        h, c = cell(x[:, t], (torch.where(z, 0.0, h), torch.where(z, 0.0, c)))
        hs.append(h)
        cs.append(c)
    return torch.stack(hs, 1), torch.stack(cs, 1)


@pytest.mark.parametrize("centralised", [False, True])
@pytest.mark.parametrize("share", [True, False])
def test_lstm_states_are_zeroed_exactly_where_is_init(centralised, share):
    """BenchMARL's layers/lstm: two states (h, c), both reset at episode starts, each agent's
    cell equal to a hand-rolled LSTMCell, recurrent mode equal to the steps taken one by one."""
    torch.manual_seed(0)
    E, T, n, F, H = 2, 6, 3, 4, 5
    SH, SC = ("agents", "h"), ("agents", "c")
    m = MultiAgentLSTM(F, H, n, centralised, share, OBS, FEAT, (SH, SC))
    assert m.in_keys == [OBS, "is_init", SH, SC] and m.out_keys == [FEAT, ("next", *SH), ("next", *SC)]
    x = torch.randn(E, T, n, F)
    init = torch.zeros(E, T, 1, dtype=torch.bool)
    init[0, 3] = init[1, 0] = True
    h0, c0 = torch.randn(E, T, n, 1, H), torch.randn(E, T, n, 1, H)
    td = TensorDict({OBS: x, "is_init": init, SH: h0, SC: c0}, batch_size=[E, T])
    with torch.no_grad():
        seq = m.set_recurrent_mode(True)(td.clone())
        for k in range(n):
            lstm = m.module.cells[0 if share else k]
            xk = x.flatten(-2) if centralised else x[:, :, k]
            a = 0 if centralised and share else k
            ref_h, ref_c = _lstm_reference(lstm, xk, h0[:, 0, a, 0], c0[:, 0, a, 0], init[..., 0])
            torch.testing.assert_close(seq[FEAT][:, :, k], ref_h)
            torch.testing.assert_close(seq["next", *SH][:, :, k, 0], ref_h)
            torch.testing.assert_close(seq["next", *SC][:, :, k, 0], ref_c)
        h, c, outs = h0[:, 0], c0[:, 0], []
        for t in range(T):
            out = m(TensorDict({OBS: x[:, t], "is_init": init[:, t], SH: h, SC: c}, batch_size=[E]))
            outs.append(out[FEAT])
            h, c = out["next", *SH], out["next", *SC]
    torch.testing.assert_close(torch.stack(outs, 1), seq[FEAT])
    with pytest.raises(ValueError, match="two state keys"):
        MultiAgentLSTM(F, H, n, centralised, share, OBS, FEAT, (SH,))


def _nav(num_envs: int, seed: int, max_steps: int = 4):
    return TransformedEnv(VmasEnv("navigation", num_envs=num_envs, max_steps=max_steps, seed=seed, n_agents=2),
                          InitTracker())


@pytest.mark.parametrize("make, config", [
    (make_mappo, MAPPOConfig(recurrent=True, rnn_hidden=16)),
    (make_mappo, MAPPOConfig(recurrent=True, rnn="lstm", rnn_hidden=16)),
    (make_ippo, IPPOConfig(recurrent=True, rnn_hidden=16, share_param_actor=False, share_param_critic=False)),
])
def test_replay_reproduces_the_rollout_before_the_first_step(make, config):
    """The loss recomputes the collected log-probs (ratio == 1) and the critic's values on a
    batch whose GRU state was carried in from the previous batch and that holds resets."""
    torch.manual_seed(0)
    env = _nav(3, seed=0)
    parts = make(env, config, num_cells=(16,))
    assert parts.recurrent
    _, td = collect(env, parts.policy, env.reset(), 3)
    batch, _ = collect(env, parts.policy, td, 6)  # episodes of 4 steps: t=1 and t=5 are starts
    assert batch["is_init"][:, :, 0].tolist() == [[False, True, False, False, False, True]] * 3
    state = ("agents", "actor_recurrent_state" + ("_h" if config.rnn == "lstm" else ""))
    assert batch[state][:, 0].abs().sum() > 0  # carried, not zero
    parts.estimator(batch)
    root = batch.exclude("next")
    with torch.no_grad():
        lp = get_dist(parts.loss.actor, root.clone()).log_prob(root["agents", "action"])
        values = parts.critic(root.clone())["agents", "state_value"]
        out = parts.loss(root)
    torch.testing.assert_close(lp, root["agents", "action_log_prob"], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(values, root["agents", "state_value"], rtol=1e-4, atol=1e-5)
    assert float(out["ratio_mean"]) == pytest.approx(1.0, abs=1e-5)
    assert float(out["kl_approx"]) == pytest.approx(0.0, abs=1e-6)
    # the sequence replay is not a step-by-step recomputation in disguise: dropping the resets
    # changes the log-probs after the first episode start
    with torch.no_grad():
        no_reset = root.clone().set("is_init", torch.zeros_like(root["is_init"]))
        lp_no_reset = get_dist(parts.loss.actor, no_reset).log_prob(root["agents", "action"])
    torch.testing.assert_close(lp_no_reset[:, :1], lp[:, :1])
    assert not torch.allclose(lp_no_reset[:, 1:], lp[:, 1:], atol=1e-4)


def _gru_weights(parts) -> list[torch.Tensor]:
    return [p.detach().clone() for name, p in parts.loss.named_parameters() if ".cells." in name]


def test_tiny_recurrent_mappo_on_vmas_trains_both_grus():
    torch.manual_seed(0)
    env, eval_env = _nav(4, seed=0, max_steps=6), _nav(2, seed=1, max_steps=6)
    parts = make_mappo(env, MAPPOConfig(recurrent=True, rnn_hidden=16), num_cells=(16,))
    before = _gru_weights(parts)
    assert len(before) == 8  # actor and critic GRUs: 4 tensors each
    cfg = TrainConfig(frames_per_batch=40, n_iters=2, num_epochs=2, minibatch_size=20, lr=1e-3,
                      eval_interval=1, max_steps=6)
    hist = train_on_policy(env, parts, cfg, eval_env=eval_env)
    assert [h["frames"] for h in hist] == [40, 80] and all(torch.isfinite(torch.tensor(h["loss"])) for h in hist)
    assert all(not torch.equal(a, b) for a, b in zip(before, _gru_weights(parts)))


def test_tiny_recurrent_ippo_on_pettingzoo_tictactoe():
    """Turn-based (agent masks), multi-dim observations flattened in front of the GRU,
    action masks; one group per player."""
    torch.manual_seed(0)

    def make(n):
        return TransformedEnv(SerialEnv(n, lambda: PettingZooEnv("tictactoe_v3", seed=0, group_map={
            "player_1": ["player_1"], "player_2": ["player_2"]})),
                              InitTracker())

    env = make(2)
    parts = make_groups("ippo", env, IPPOConfig(recurrent=True, rnn_hidden=8), num_cells=(8,))
    assert set(parts) == {"player_1", "player_2"}
    before = {g: _gru_weights(p) for g, p in parts.items()}
    cfg = TrainConfig(frames_per_batch=24, n_iters=2, num_epochs=1, minibatch_size=12, lr=1e-3,
                      eval_interval=1, max_steps=9)
    hist = train_on_policy(env, parts, cfg, eval_env=make(1))
    assert hist[-1]["frames"] == 48 and "eval_return/player_1" in hist[-1]
    for g, p in parts.items():
        assert all(not torch.equal(a, b) for a, b in zip(before[g], _gru_weights(p))), g


def test_resumed_recurrent_benchmark_equals_the_uninterrupted_run(tmp_path):
    """A recurrent benchmark stopped after its first pair and resumed trains only the second,
    and ends with the same evaluations as the run that was never interrupted."""
    tiny = dict(tasks=("navigation",), seeds=(0,), num_envs=2, frames_per_batch=12, n_iters=2, num_epochs=1,
                minibatch_size=12, num_cells=(8,), eval_envs=2, eval_interval=1, max_steps=6,
                recurrent=True, rnn_hidden=8)
    full = run_benchmark(BenchConfig(algorithms=("mappo", "ippo"), out_dir=str(tmp_path / "full"), **tiny))
    part = tmp_path / "part"
    run_benchmark(BenchConfig(algorithms=("mappo",), out_dir=str(part), **tiny))  # "stopped" here
    resumed = run_benchmark(BenchConfig(algorithms=("mappo", "ippo"), out_dir=str(part), resume=True, **tiny))

    def evaluations(folder):
        rows = [json.loads(x) for x in (folder / "evaluations.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if k != "time_s"} for r in rows]

    assert evaluations(part) == evaluations(tmp_path / "full")
    assert [s["final_return_mean"] for s in resumed["summary"]] == [s["final_return_mean"] for s in full["summary"]]


def test_recurrent_setups_that_cannot_work_are_refused():
    env = VmasEnv("navigation", num_envs=2, max_steps=4, seed=0, n_agents=2)  # no InitTracker
    parts = make_mappo(env, MAPPOConfig(recurrent=True, rnn_hidden=8), num_cells=(8,))
    with pytest.raises(ValueError, match="InitTracker"):
        train_on_policy(env, parts, TrainConfig(frames_per_batch=8, n_iters=1, eval_interval=0))
    with pytest.raises(KeyError, match="InitTracker"):
        parts.policy(env.reset())
    # several recurrent seeds are no longer refused: they train as one vectorised model
    # (tests/marl/test_vectorised_recurrent.py), or one after another when asked
    assert BenchConfig(algorithms=("mappo",), seeds=(0, 1), recurrent=True).vectorise_seeds
    assert not BenchConfig(algorithms=("mappo",), seeds=(0, 1), recurrent=True, vectorise_seeds=False).vectorise_seeds
    with pytest.raises(ValueError, match="mappo / ippo / qmix / vdn only"):
        BenchConfig(algorithms=("mappo", "iql"), recurrent=True)
    with pytest.raises(ValueError, match="rnn_hidden"):
        MAPPOConfig(recurrent=True, rnn_hidden=0)
    with pytest.raises(ValueError, match="'gru' or 'lstm'"):
        MAPPOConfig(recurrent=True, rnn="rnn")
    with pytest.raises(ValueError, match="set recurrent=True too"):
        BenchConfig(algorithms=("mappo",), rnn="lstm")  # not silently an MLP


def test_recurrent_vdn_bootstraps_one_step_past_the_replayed_states():
    """Recurrent VDN on stored trajectories [B, T]: Q(s_t) comes from the replayed hidden states
    (each row from its stored first state, reset at is_init), and the target's next value is one
    step of the target network past the state *it* reached at t, as an unbroken rollout computes
    it, recomputed here step by step by hand. A batch of single transitions is refused."""
    from _cue_env import CueEnv

    from tdrl.marl.algorithms import make_vdn
    from tdrl.marl.loops.common import as_groups, joint_policy, start_collection
    from tdrl.marl.modules import recurrent_view
    from tdrl.marl.objectives import VDNConfig

    torch.manual_seed(0)
    env = TransformedEnv(CueEnv(4, 0), InitTracker())
    parts = make_vdn(env, VDNConfig(recurrent=True, rnn_hidden=8, gamma=0.9), num_cells=(8,))
    groups = as_groups(parts, "agents")
    collector, _ = start_collection(env, groups, joint_policy(groups), 5)
    collector.rollout()
    batch = collector.rollout()  # [4, 5]: rows start mid-episode, with a carried (non-zero) state
    assert batch["agents", "q_recurrent_state"][:, 0].abs().sum() > 0 and batch["is_init"][:, 1:].any()
    loss = parts.loss
    with torch.no_grad():
        for p in loss.target_local_value_network.parameters():
            p.add_(0.3 * torch.randn_like(p))  # a target that differs from the online net
        out = loss(batch)
        online, target = (recurrent_view(n, False) for n in (loss.local_value_network, loss.target_local_value_network))
        q_tot, targets = [], []
        h_on, h_tg = (batch["agents", "q_recurrent_state"][:, 0],) * 2
        for t in range(batch.shape[1]):
            root = batch[:, t].exclude("next")
            on = online(root.clone().set(("agents", "q_recurrent_state"), h_on))
            tg = target(root.clone().set(("agents", "q_recurrent_state"), h_tg))
            h_on, h_tg = on["next", "agents", "q_recurrent_state"], tg["next", "agents", "q_recurrent_state"]
            q = on["agents", "action_value"].gather(-1, root["agents", "action"].unsqueeze(-1))
            q_tot.append(q.sum(-2))
            nxt = batch[:, t]["next"].clone().set(("agents", "q_recurrent_state"), h_tg)
            nxt.set("is_init", torch.zeros_like(root["is_init"]))
            next_v = target(nxt)["agents", "action_value"].max(-1).values.sum(-1, keepdim=True)
            reward = batch[:, t]["next", "agents", "reward"].mean(-2)
            not_term = (~batch[:, t]["next", "terminated"]).float()
            targets.append(reward + 0.9 * not_term * next_v)
    torch.testing.assert_close(out["q_tot_mean"], torch.stack(q_tot).mean())
    torch.testing.assert_close(out["target_mean"], torch.stack(targets).mean())
    with pytest.raises(ValueError, match=r"trajectories \[B, T\]"):
        loss(batch.reshape(-1))
