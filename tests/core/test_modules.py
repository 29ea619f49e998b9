"""Networks, distributions, actors and Q heads."""

from __future__ import annotations

import pytest
import torch
import torch.distributions as D
from tensordict import TensorDict
from tensordict.nn import InteractionType, TensorDictModule, set_interaction_type
from torch import nn

from tdrl.core.modules import (
    MLP,
    ConvNet,
    DuelingHead,
    IndependentNormal,
    MaskedCategorical,
    NormalParamExtractor,
    OneHotCategorical,
    ProbabilisticActor,
    QValueActor,
    QValueModule,
    TanhNormal,
    ValueOperator,
)


def test_mlp_shapes_concat_and_init():
    mlp = MLP(5, (2, 3), num_cells=(8, 8), orthogonal_init=True)
    out = mlp(torch.randn(4, 7, 2), torch.randn(4, 7, 3))  # concatenated inputs
    assert out.shape == (4, 7, 2, 3)
    assert torch.count_nonzero(mlp[0].bias) == 0
    lazy = MLP(None, 1, num_cells=(4,))
    assert lazy(torch.randn(3, 6)).shape == (3, 1)


def test_convnet_batch_dims_and_uint8():
    net = ConvNet(3, channels=(4, 8), kernel_sizes=(3, 3), strides=(2, 1), out_features=16)
    x = torch.randint(0, 255, (2, 5, 3, 16, 16), dtype=torch.uint8)
    assert net(x).shape == (2, 5, 16)
    with pytest.raises(ValueError, match="one entry per layer"):
        ConvNet(3, channels=(4,), kernel_sizes=(3, 3), strides=(1,))


def test_tanh_normal_matches_transformed_distribution():
    loc, scale = torch.randn(6, 2), torch.rand(6, 2) + 0.2
    ours = TanhNormal(loc, scale, low=-2.0, high=3.0)
    ref = D.TransformedDistribution(
        D.Independent(D.Normal(loc, scale), 1),
        [D.TanhTransform(), D.AffineTransform(0.5, 2.5)],
    )
    a = ref.sample()
    torch.testing.assert_close(ours.log_prob(a), ref.log_prob(a), rtol=1e-4, atol=1e-4)
    sample, lp = ours.rsample_with_log_prob((3,))
    assert sample.shape == (3, 6, 2) and lp.shape == (3, 6)
    assert (sample > -2).all() and (sample < 3).all()
    torch.testing.assert_close(ours.deterministic_sample, 0.5 + 2.5 * torch.tanh(loc))
    # the cached pre-tanh value is used for the last rsample: exact even when saturated
    sat = TanhNormal(torch.full((1, 1), 12.0), torch.full((1, 1), 0.01))
    s = sat.rsample()
    assert torch.isfinite(sat.log_prob(s)).all()


def test_masked_categorical_never_samples_masked_actions():
    logits = torch.zeros(1000, 4)
    mask = torch.tensor([True, False, True, False]).expand(1000, 4)
    dist = MaskedCategorical(logits=logits, mask=mask)
    samples = dist.sample()
    assert set(samples.unique().tolist()) == {0, 2}
    torch.testing.assert_close(dist.entropy(), torch.full((1000,), torch.log(torch.tensor(2.0)).item()))
    logits2 = torch.tensor([[5.0, 9.0, 1.0, 0.0]])
    det = MaskedCategorical(logits=logits2, mask=torch.tensor([[True, False, True, True]]))
    assert det.deterministic_sample.item() == 0
    with pytest.raises(ValueError, match="no allowed action"):
        MaskedCategorical(logits=logits2, mask=torch.zeros(1, 4, dtype=torch.bool))


def test_one_hot_categorical():
    dist = OneHotCategorical(logits=torch.tensor([[0.0, 3.0, 1.0]]))
    torch.testing.assert_close(dist.deterministic_sample, torch.tensor([[0.0, 1.0, 0.0]]))
    assert dist.sample((5,)).sum(-1).eq(1).all()


def _actor(dist_cls, **kw):
    net = TensorDictModule(
        nn.Sequential(MLP(3, 4, num_cells=(8,)), NormalParamExtractor()),
        in_keys=["observation"], out_keys=["loc", "scale"],
    )
    return ProbabilisticActor(net, dist_cls, **kw)


def test_probabilistic_actor_random_vs_deterministic():
    actor = _actor(TanhNormal, distribution_kwargs={"low": -2.0, "high": 2.0})
    td = TensorDict(observation=torch.randn(5, 3), batch_size=[5])
    with set_interaction_type(InteractionType.DETERMINISTIC):
        a1 = actor(td.clone())
        a2 = actor(td.clone())
    torch.testing.assert_close(a1["action"], a2["action"])
    torch.testing.assert_close(a1["action"], 2 * torch.tanh(a1["loc"]))
    with set_interaction_type(InteractionType.RANDOM):
        r = actor(td.clone())
    assert not torch.allclose(r["action"], a1["action"])
    dist = actor.get_dist(r)
    torch.testing.assert_close(r["action_log_prob"], dist.log_prob(r["action"]))
    normal = _actor(IndependentNormal)
    with set_interaction_type(InteractionType.DETERMINISTIC):
        out = normal(td.clone())
    torch.testing.assert_close(out["action"], out["loc"])


def test_masked_actor_reads_action_mask():
    net = TensorDictModule(MLP(3, 4, num_cells=(8,)), in_keys=["observation"], out_keys=["logits"])
    actor = ProbabilisticActor(net, MaskedCategorical,
                               in_keys={"logits": "logits", "mask": "action_mask"})
    mask = torch.zeros(200, 4, dtype=torch.bool)
    mask[:, 3] = True
    td = TensorDict(observation=torch.randn(200, 3), action_mask=mask, batch_size=[200])
    assert (actor(td)["action"] == 3).all()
    torch.testing.assert_close(td["action_log_prob"], torch.zeros(200))


def test_value_operator_state_action():
    q = ValueOperator(MLP(5, 1, num_cells=(8,)), in_keys=["observation", "action"],
                      out_keys=["state_action_value"])
    td = TensorDict(observation=torch.randn(4, 3), action=torch.randn(4, 2), batch_size=[4])
    assert q(td)["state_action_value"].shape == (4, 1)


def test_dueling_head_advantages_have_zero_mean():
    head = DuelingHead(6, 3, num_cells=(8,))
    x = torch.randn(10, 6)
    q = head(x)
    torch.testing.assert_close(q.mean(-1, keepdim=True), head.value(x), rtol=1e-5, atol=1e-5)


def test_qvalue_module_greedy_masked_and_one_hot():
    td = TensorDict(action_value=torch.tensor([[1.0, 5.0, 2.0], [0.0, 1.0, 9.0]]),
                    action_mask=torch.tensor([[True, False, True], [True, True, True]]),
                    batch_size=[2])
    QValueModule(action_mask_key="action_mask")(td)
    assert td["action"].tolist() == [2, 2]
    torch.testing.assert_close(td["chosen_action_value"], torch.tensor([[2.0], [9.0]]))
    QValueModule(one_hot=True)(td)
    torch.testing.assert_close(td["action"], torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]))
    actor = QValueActor(MLP(3, 2, num_cells=(4,)))
    out = actor(TensorDict(observation=torch.randn(7, 3), batch_size=[7]))
    assert out["action"].shape == (7,) and out["action_value"].shape == (7, 2)
