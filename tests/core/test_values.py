"""Value estimators: hand-computed trajectories, parity with naive loops, module keys."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule

from tdrl.core.values import (
    GAE,
    TD0,
    TDLambda,
    VTrace,
    discounted_cumsum,
    gae,
    kernels_available,
    td0_return,
    td_lambda_return,
    vtrace,
)
from tdrl.core.values.functional import _scan_loop


def col(*xs, dtype=torch.float32):
    return torch.tensor(xs, dtype=dtype).reshape(-1, 1)


# Trajectory of 4 steps: step 1 is truncated (done, not terminated), step 3 terminated.
R = col(1.0, 2.0, 3.0, 4.0)
V = col(0.5, 1.0, 1.5, 2.0)
NV = col(1.0, 10.0, 2.0, 7.0)  # NV[1] = value of the truncated step's final observation
DONE = col(False, True, False, True, dtype=torch.bool)
TERM = col(False, False, False, True, dtype=torch.bool)
G, L = 0.5, 0.5


@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_gae_hand_computed_truncated_bootstraps_terminated_does_not(backend):
    # deltas: r + g * (1 - term) * nv - v
    d0 = 1 + 0.5 * 1.0 - 0.5  # 1.0
    d1 = 2 + 0.5 * 10.0 - 1.0  # 6.0  truncated: bootstraps from NV[1]
    d2 = 3 + 0.5 * 2.0 - 1.5  # 2.5
    d3 = 4 + 0.0 - 2.0  # 2.0   terminated: no bootstrap
    a3 = d3
    a2 = d2 + 0.25 * a3  # 3.0
    a1 = d1  # done at 1: trace stops
    a0 = d0 + 0.25 * a1  # 2.5
    adv, target = gae(R, V, NV, DONE, TERM, G, L, backend=backend)
    torch.testing.assert_close(adv, col(a0, a1, a2, a3))
    torch.testing.assert_close(target, col(a0, a1, a2, a3) + V)


def test_td0_hand_computed():
    target = td0_return(R, NV, TERM, G)
    torch.testing.assert_close(target, col(1 + 0.5, 2 + 5.0, 3 + 1.0, 4.0))


def test_td_lambda_hand_computed():
    g3 = 4.0  # terminated
    g2 = 3 + 0.5 * (0.5 * 2.0 + 0.5 * g3)  # 5.5
    g1 = 2 + 0.5 * 10.0  # truncated: full bootstrap from NV[1] = 7.0
    g0 = 1 + 0.5 * (0.5 * 1.0 + 0.5 * g1)  # 3.0
    out = td_lambda_return(R, NV, DONE, TERM, G, L)
    torch.testing.assert_close(out, col(g0, g1, g2, g3))


def test_td_lambda_equals_gae_target_when_values_consistent():
    torch.manual_seed(0)
    r, v_all = torch.randn(3, 9, 1), torch.randn(3, 10, 1)
    v, nv = v_all[:, :-1], v_all[:, 1:]
    done = torch.rand(3, 9, 1) < 0.2
    term = done & (torch.rand(3, 9, 1) < 0.5)
    nv = torch.where(done, torch.randn(3, 9, 1), nv)  # reset: next obs is a fresh episode's
    _, target = gae(r, v, nv, done, term, 0.9, 0.8)
    # after a done, V(s_{t+1}) != next_value[t]: only compare the consistent case
    v2 = torch.cat([v[:, :1], nv[:, :-1]], dim=1)
    _, target2 = gae(r, v2, nv, done, term, 0.9, 0.8)
    lam = td_lambda_return(r, nv, done, term, 0.9, 0.8)
    torch.testing.assert_close(lam, target2)
    assert target.shape == lam.shape


@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_discounted_cumsum_hand_computed(backend):
    x = col(1.0, 1.0, 1.0, 1.0)
    out = discounted_cumsum(x, 0.5, DONE, backend=backend)
    torch.testing.assert_close(out, col(1.5, 1.0, 1.5, 1.0))
    torch.testing.assert_close(discounted_cumsum(x, 0.5, backend=backend), col(1.875, 1.75, 1.5, 1.0))


@pytest.mark.parametrize(
    "shape,gamma",
    [((3, 7, 1), 0.9), ((2, 3, 300, 1), 0.99 * 0.95), ((5, 64, 1), 0.3), ((4, 1, 1), 0.9),
     ((4, 33, 1), 1.0), ((2, 20, 1), 0.0)],
)
def test_torch_scan_matches_loop(shape, gamma):
    torch.manual_seed(1)
    x = torch.randn(shape)
    done = torch.rand(shape) < 0.05
    done[..., 13 % shape[-2], :] = True  # a done that may end a chunk exactly
    torch.testing.assert_close(
        discounted_cumsum(x, gamma, done, backend="torch"), _scan_loop(x, gamma, done),
        rtol=1e-5, atol=1e-5,
    )
    torch.testing.assert_close(
        discounted_cumsum(x.double(), gamma, None, backend="torch"),
        _scan_loop(x.double(), gamma, None),
    )


@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_gae_matches_naive_loop(backend):
    torch.manual_seed(2)
    shape = (4, 200, 1)
    r, v, nv = torch.randn(shape), torch.randn(shape), torch.randn(shape)
    done = torch.rand(shape) < 0.03
    term = done & (torch.rand(shape) < 0.5)
    adv = torch.zeros(4, 1)
    expected = torch.zeros(shape)
    for t in reversed(range(200)):
        delta = r[:, t] + 0.99 * nv[:, t] * (~term[:, t]) - v[:, t]
        adv = delta + 0.99 * 0.95 * (~done[:, t]) * adv
        expected[:, t] = adv
    out, _ = gae(r, v, nv, done, term, 0.99, 0.95, backend=backend)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not kernels_available("gae"), reason="tdrl.kernels.gae not installed")
def test_kernels_dispatch_agrees_with_fallback():
    torch.manual_seed(3)
    shape = (3, 50, 1)
    r, v, nv = torch.randn(shape), torch.randn(shape), torch.randn(shape)
    done = torch.rand(shape) < 0.1
    term = done & (torch.rand(shape) < 0.5)
    a_k, t_k = gae(r, v, nv, done, term, 0.9, 0.9, backend="kernels")
    a_t, t_t = gae(r, v, nv, done, term, 0.9, 0.9, backend="torch")
    torch.testing.assert_close(a_k, a_t, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(t_k, t_t, rtol=1e-5, atol=1e-5)
    if kernels_available("discounted_cumsum"):
        torch.testing.assert_close(
            discounted_cumsum(r, 0.9, done, backend="kernels"),
            discounted_cumsum(r, 0.9, done, backend="torch"), rtol=1e-5, atol=1e-5,
        )


def test_vtrace_on_policy_equals_td_lambda_one():
    # with pi == mu and lambda=1, V-trace targets are n-step (Monte Carlo) returns
    log_rho = torch.zeros_like(R)
    adv, vs = vtrace(R, V, NV, DONE, TERM, log_rho, G)
    expected = td_lambda_return(R, NV, DONE, TERM, G, 1.0)
    torch.testing.assert_close(vs, expected)
    # advantage = r + g * v_{t+1} - V, with v_{t+1} -> NV after a done
    vs_next = col(vs[1].item(), NV[1].item(), vs[3].item(), 0.0)
    torch.testing.assert_close(adv, R + G * vs_next - V)


def test_vtrace_hand_computed_with_clipping():
    r, v, nv = col(1.0, 1.0), col(0.0, 0.0), col(0.0, 2.0)
    done = term = col(False, False, dtype=torch.bool)
    log_rho = torch.log(col(2.0, 0.5))  # rho = c = (1.0, 0.5)
    adv, vs = vtrace(r, v, nv, done, term, log_rho, 1.0)
    d1 = 0.5 * (1 + 2.0 - 0)  # 1.5
    d0 = 1.0 * (1 + 0.0 - 0)  # 1.0
    vs1 = 0 + d1
    vs0 = 0 + d0 + 1.0 * 1.0 * (vs1 - 0.0)
    torch.testing.assert_close(vs, col(vs0, vs1))
    torch.testing.assert_close(adv, col(1.0 * (1 + vs1 - 0), 0.5 * (1 + 2.0 - 0)))


def _rollout():
    td = TensorDict(
        {
            "observation": torch.arange(4.0).reshape(4, 1),
            "state_value": V.clone(),
            "next": {
                "observation": torch.arange(1.0, 5.0).reshape(4, 1),
                "state_value": NV.clone(),
                "reward": R.clone(),
                "done": DONE.clone(),
                "terminated": TERM.clone(),
            },
        },
        batch_size=[4],
    )
    return td


def test_gae_module_matches_function_and_value_network():
    td = _rollout()
    GAE(G, L)(td)
    adv, target = gae(R, V, NV, DONE, TERM, G, L)
    torch.testing.assert_close(td["advantage"], adv)
    torch.testing.assert_close(td["value_target"], target)
    # with a value network: V(obs) = 2 * obs, computed for root and "next"
    net = TensorDictModule(lambda o: 2 * o, in_keys=["observation"], out_keys=["state_value"])
    td2 = _rollout().exclude("state_value", ("next", "state_value"))
    GAE(G, L, value_network=net)(td2)
    obs = td2["observation"]
    adv2, _ = gae(R, 2 * obs, 2 * td2["next", "observation"], DONE, TERM, G, L)
    torch.testing.assert_close(td2["advantage"], adv2)


def test_td0_tdlambda_vtrace_modules_and_set_keys():
    td = _rollout().rename_key_("state_value", "v")
    td.rename_key_(("next", "state_value"), ("next", "v"))
    TD0(G).set_keys(value="v", advantage="adv0")(td)
    torch.testing.assert_close(td["adv0"], td0_return(R, NV, TERM, G) - V)
    TDLambda(G, L).set_keys(value="v")(td)
    torch.testing.assert_close(td["value_target"], td_lambda_return(R, NV, DONE, TERM, G, L))
    td["action_log_prob"] = torch.zeros(4)
    td["target_log_prob"] = torch.zeros(4, 1)
    VTrace(G).set_keys(value="v")(td)
    torch.testing.assert_close(td["value_target"], vtrace(R, V, NV, DONE, TERM, 0 * R, G)[1])


def test_estimator_missing_key_names_it_and_keys_found():
    td = _rollout().exclude(("next", "terminated"))
    with pytest.raises(KeyError, match=r"\('next', 'terminated'\).*Keys found"):
        GAE(0.9, 0.9)(td)
    with pytest.raises(KeyError, match=r"GAE.set_keys: unknown names \['valu'\]; valid names: \['advantage'"):
        GAE(0.9, 0.9).set_keys(valu="x")


def test_bad_shapes_are_explained():
    with pytest.raises(ValueError, match=r"\[\.\.\., T, 1\]"):
        gae(torch.zeros(4), torch.zeros(4), torch.zeros(4), torch.zeros(4, dtype=torch.bool),
            torch.zeros(4, dtype=torch.bool), 0.9, 0.9)
    with pytest.raises(ValueError, match="must match"):
        gae(R, V[:3], NV, DONE, TERM, 0.9, 0.9)


def test_gae_module_on_env_by_time_batch_and_differentiable_critic():
    torch.manual_seed(4)
    B, T = 3, 6
    td = TensorDict(
        {
            "observation": torch.randn(B, T, 2),
            "next": {
                "observation": torch.randn(B, T, 2),
                "reward": torch.randn(B, T, 1),
                "done": torch.rand(B, T, 1) < 0.3,
                "terminated": torch.zeros(B, T, 1, dtype=torch.bool),
            },
        },
        batch_size=[B, T],
    )
    net = TensorDictModule(torch.nn.Linear(2, 1), in_keys=["observation"], out_keys=["state_value"])
    est = GAE(0.9, 0.8, value_network=net, differentiable=True, average_advantage=True)
    est(td)
    adv = td["advantage"]
    assert adv.shape == (B, T, 1)
    torch.testing.assert_close(adv.mean(), torch.tensor(0.0), atol=1e-6, rtol=0)
    td["value_target"].sum().backward()  # the graph reaches the critic
    assert net.module.weight.grad is not None


def test_vtrace_module_with_actor_network_computes_log_rho():
    from tdrl.core.modules import MaskedCategorical, ProbabilisticActor

    logits = torch.nn.Linear(1, 3)
    actor = ProbabilisticActor(
        TensorDictModule(logits, in_keys=["observation"], out_keys=["logits"]),
        MaskedCategorical, in_keys=["logits"],
    )
    td = _rollout()
    td["action"] = torch.tensor([0, 1, 2, 1])
    td["action_log_prob"] = torch.log(torch.full((4,), 0.5))
    VTrace(G, actor_network=actor, rho_bar=1.0, c_bar=1.0)(td)
    with torch.no_grad():
        target_lp = torch.log_softmax(logits(td["observation"]), -1).gather(
            -1, td["action"].unsqueeze(-1)
        )
    log_rho = target_lp - torch.log(torch.tensor(0.5))
    adv, vs = vtrace(R, V, NV, DONE, TERM, log_rho, G)
    torch.testing.assert_close(td["value_target"], vs)
    torch.testing.assert_close(td["advantage"], adv)
