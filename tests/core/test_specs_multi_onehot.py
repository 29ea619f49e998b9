"""``MultiOneHot`` (TorchRL's spec for several one-hot segments side by side), hand-checked."""

from __future__ import annotations

import pytest
import torch

from tdrl.core import MultiCategorical, MultiOneHot


def test_rand_is_one_hot_in_every_segment_and_covers_every_category():
    spec = MultiOneHot([2, 3])
    assert spec.shape == (5,) and spec.dtype == torch.bool
    x = spec.rand((400,))
    assert x.shape == (400, 5) and spec.is_in(x)
    assert x[:, :2].sum(-1).eq(1).all() and x[:, 2:].sum(-1).eq(1).all()
    assert x.float().mean(0).gt(0.2).all()  # every category drawn (p = 1/2 or 1/3)


def test_is_in_encode_project_and_categorical():
    spec = MultiOneHot([2, 3], dtype=torch.int64)
    assert spec.encode([1, 2]).tolist() == [0, 1, 0, 0, 1]
    assert spec.encode(torch.tensor([[0, 0], [1, 1]])).tolist() == [[1, 0, 1, 0, 0], [0, 1, 0, 1, 0]]
    assert spec.is_in(torch.tensor([1, 0, 0, 0, 1]))
    assert not spec.is_in(torch.tensor([1, 1, 0, 0, 1]))  # two set in the first segment
    assert not spec.is_in(torch.tensor([1, 0, 0, 0, 0]))  # none set in the second
    assert spec.project(torch.tensor([0.2, 0.9, 0.1, 0.5, 0.3])).tolist() == [0, 1, 0, 1, 0]
    assert spec.to_categorical(torch.tensor([0, 1, 0, 0, 1])).tolist() == [1, 2]
    cat = spec.to_categorical_spec()
    assert isinstance(cat, MultiCategorical) and cat.nvec.tolist() == [2, 3]
    with pytest.raises(ValueError, match="out of"):
        spec.encode([2, 0])
    with pytest.raises(ValueError, match="sum\\(nvec\\)=5"):
        MultiOneHot([2, 3], shape=(4,))


def test_expand_keeps_the_segments():
    spec = MultiOneHot([3, 1]).expand(4, 4)
    assert spec.shape == (4, 4) and spec.nvec == [3, 1]
    assert spec.rand().shape == (4, 4) and spec.is_in(spec.rand())
