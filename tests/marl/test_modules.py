"""MultiAgentMLP equals a loop over per-agent MLPs; QMIX is monotonic; VDN sums."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tdrl.marl.modules import MultiAgentMLP, QMixer, VDNMixer


def _agent_net(mlp: MultiAgentMLP, k: int) -> nn.Sequential:
    """A plain nn.Sequential holding agent ``k``'s slice of the stacked parameters."""
    layers = []
    for i, (w, b) in enumerate(zip(mlp.weights, mlp.biases)):
        lin = nn.Linear(w.shape[1], w.shape[2])
        with torch.no_grad():
            lin.weight.copy_(w[k].T)
            lin.bias.copy_(b[k])
        layers.append(lin)
        if i < len(mlp.weights) - 1:
            layers.append(nn.Tanh())
    return nn.Sequential(*layers)


@pytest.mark.parametrize("centralised", [False, True])
@pytest.mark.parametrize("share_params", [False, True])
def test_multiagent_mlp_equals_loop_over_agents(centralised, share_params):
    torch.manual_seed(0)
    n, d_in, d_out = 4, 5, 3
    mlp = MultiAgentMLP(d_in, d_out, n, centralised, share_params, num_cells=(16, 8))
    x = torch.randn(7, 2, n, d_in)
    out = mlp(x)
    assert out.shape == (7, 2, n, d_out)
    ref = []
    for k in range(n):
        net = _agent_net(mlp, 0 if share_params else k)
        inp = x.flatten(-2) if centralised else x[..., k, :]
        ref.append(net(inp))
    torch.testing.assert_close(out, torch.stack(ref, dim=-2), rtol=1e-5, atol=1e-6)
    if share_params:
        assert mlp.weights[0].shape[0] == 1
    else:  # agents have distinct parameters and distinct outputs on the same input
        same = x[..., :1, :].expand_as(x)
        if not centralised:
            o = mlp(same)
            assert not torch.allclose(o[..., 0, :], o[..., 1, :])


def test_multiagent_mlp_gradients_reach_each_agent_only_through_its_output():
    torch.manual_seed(0)
    mlp = MultiAgentMLP(3, 2, 3, centralised=False, share_params=False, num_cells=(8,))
    out = mlp(torch.randn(5, 3, 3))
    out[..., 1, :].sum().backward()
    g = mlp.weights[0].grad
    assert g[1].abs().sum() > 0 and g[0].abs().sum() == 0 and g[2].abs().sum() == 0


def test_multiagent_mlp_bad_input_shape_is_named():
    mlp = MultiAgentMLP(3, 2, 4)
    with pytest.raises(ValueError, match=r"n_agents=4, n_agent_inputs=3.*\(5, 3, 3\)"):
        mlp(torch.zeros(5, 3, 3))


def test_vdn_is_the_sum():
    q = torch.tensor([[[1.0], [2.0], [-0.5]]])
    assert VDNMixer(3)(q).tolist() == [[2.5]]


def test_qmix_monotonic_in_every_agent_q():
    torch.manual_seed(0)
    n, s = 4, 6
    mixer = QMixer(s, n, mixing_embed_dim=8, hypernet_hidden=16)
    q = torch.randn(64, n, 1, requires_grad=True)
    state = torch.randn(64, s)
    q_tot = mixer(q, state)
    assert q_tot.shape == (64, 1)
    (grad,) = torch.autograd.grad(q_tot.sum(), q)
    assert bool((grad >= 0).all())
    # and along a path: raising one agent's Q never lowers Q_tot
    for k in range(n):
        bumped = q.detach().clone()
        bumped[:, k] += torch.rand(64, 1) * 3
        assert bool((mixer(bumped, state) >= q_tot.detach() - 1e-6).all())


def test_qmix_state_of_agent_observations():
    mixer = QMixer((3, 5), 3)
    out = mixer(torch.randn(2, 7, 3, 1), torch.randn(2, 7, 3, 5))
    assert out.shape == (2, 7, 1)
    with pytest.raises(ValueError, match="state"):
        mixer(torch.randn(2, 3, 1), torch.randn(2, 4))


def test_qmix_single_layer_hypernets_follow_torchrl_formula():
    """hypernet_hidden=None: one linear layer per hypernetwork (TorchRL's QMixer, BenchMARL's QMIX):
    Q_tot = elu(q^T |A s + a| + (B s + b)) . |C s + c| + V(s), checked by hand on a 2-agent case."""
    torch.manual_seed(0)
    mixer = QMixer(3, 2, mixing_embed_dim=4, hypernet_hidden=None)
    assert isinstance(mixer.hyper_w1, torch.nn.Linear) and isinstance(mixer.hyper_w2, torch.nn.Linear)
    assert mixer.hyper_w1.out_features == 4 * 2 and mixer.hyper_w2.out_features == 4
    q, s = torch.tensor([[[0.5], [-1.0]]]), torch.tensor([[0.2, -0.3, 0.7]])
    w1 = (s @ mixer.hyper_w1.weight.T + mixer.hyper_w1.bias).abs().view(2, 4)
    b1 = s @ mixer.hyper_b1.weight.T + mixer.hyper_b1.bias
    hidden = torch.nn.functional.elu(0.5 * w1[0] - 1.0 * w1[1] + b1[0])
    w2 = (s @ mixer.hyper_w2.weight.T + mixer.hyper_w2.bias).abs()[0]
    expected = (hidden * w2).sum() + mixer.value(s)[0, 0]
    torch.testing.assert_close(mixer(q, s), expected.reshape(1, 1))
    with pytest.raises(ValueError, match="hypernet_hidden must be >= 1 or None"):
        QMixer(3, 2, hypernet_hidden=0)
