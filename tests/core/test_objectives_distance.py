"""The critic distances: tdrl's ``"l2"`` is half of TorchRL's, ``"mse"`` is TorchRL's ``"l2"``
(hand-computed here; against TorchRL's own losses where it is installed, e.g. .venv-bench)."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torch import nn

from tdrl.core.objectives import DISTANCE_KINDS, DQNLoss, distance_loss
from tdrl.core.modules import QValueActor


def test_distances_by_hand():
    pred, target = torch.tensor([3.0, -1.0, 0.5]), torch.tensor([1.0, 1.0, 0.0])
    assert distance_loss(pred, target, "l2").tolist() == [2.0, 2.0, 0.125]
    assert distance_loss(pred, target, "mse").tolist() == [4.0, 4.0, 0.25]
    assert distance_loss(pred, target, "l1").tolist() == [2.0, 2.0, 0.5]
    assert distance_loss(pred, target, "smooth_l1").tolist() == [1.5, 1.5, 0.125]
    assert set(DISTANCE_KINDS) == {"l2", "mse", "l1", "smooth_l1"}
    with pytest.raises(ValueError, match="'mse'"):
        distance_loss(pred, target, "l3")


def _batch(seed: int = 0) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    n = 6
    return TensorDict({
        "observation": torch.randn(n, 3, generator=g),
        "action": nn.functional.one_hot(torch.randint(0, 2, (n,), generator=g), 2),
        "next": {"observation": torch.randn(n, 3, generator=g), "reward": torch.randn(n, 1, generator=g),
                 "done": torch.zeros(n, 1, dtype=torch.bool), "terminated": torch.zeros(n, 1, dtype=torch.bool)},
    }, [n])


def test_dqn_mse_is_twice_l2_by_hand():
    torch.manual_seed(0)
    net = nn.Linear(3, 2)
    td = _batch()
    l2 = DQNLoss(QValueActor(net), gamma=0.9, double_dqn=False, loss_function="l2")(td.clone())["loss"]
    mse = DQNLoss(QValueActor(net), gamma=0.9, double_dqn=False, loss_function="mse")(td.clone())["loss"]
    with torch.no_grad():  # the TD target by hand: r + 0.9 max_a' Q(s', a')
        q = net(td["observation"]).gather(-1, td["action"].argmax(-1, keepdim=True))
        target = td["next", "reward"] + 0.9 * net(td["next", "observation"]).max(-1, keepdim=True).values
        want = (q - target).pow(2).mean()
    torch.testing.assert_close(mse.detach(), want)
    torch.testing.assert_close(l2.detach(), want / 2)


def test_dqn_mse_equals_torchrls_l2():
    tm = pytest.importorskip("torchrl.modules", reason="compares with TorchRL (benchmarks/setup_peers.sh)")
    to = pytest.importorskip("torchrl.objectives")
    from torchrl.data import OneHot as TorchRLOneHot

    torch.manual_seed(0)
    net = nn.Linear(3, 2)
    td = _batch(1)
    theirs = to.DQNLoss(tm.QValueActor(net, in_keys=["observation"], spec=TorchRLOneHot(2)),
                        action_space="one_hot", delay_value=False, loss_function="l2")
    theirs.make_value_estimator(gamma=0.9)
    ours = DQNLoss(QValueActor(net), gamma=0.9, double_dqn=False, loss_function="mse")
    torch.testing.assert_close(ours(td.clone())["loss"], theirs(td.clone())["loss"])
