"""Specs: shapes, dtypes, sampling inside the spec, membership, projection, expansion, nesting."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdrl.core.specs import (
    Binary,
    Bounded,
    Categorical,
    Composite,
    MultiCategorical,
    OneHot,
    Unbounded,
)


def test_unbounded_shapes_dtypes():
    s = Unbounded((4, 3))
    assert s.shape == (4, 3) and s.dtype == torch.float32
    assert s.rand().shape == (4, 3)
    assert s.rand((5,)).shape == (5, 4, 3)
    assert torch.equal(s.zero(), torch.zeros(4, 3))
    assert s.is_in(torch.randn(4, 3))
    assert not s.is_in(torch.randn(4, 3).double())  # dtype is part of the spec
    assert not s.is_in(torch.randn(4, 2))
    assert Unbounded(2, dtype=torch.int64).rand().dtype == torch.int64
    assert Unbounded((2,), torch.float64).dtype == torch.float64  # dtype given positionally


def test_bounded_rand_is_in_project():
    torch.manual_seed(0)
    s = Bounded(torch.tensor([-1.0, 0.0]), torch.tensor([1.0, 10.0]))
    assert s.shape == (2,)
    x = s.rand((1000,))
    assert s.is_in(x)
    assert (x[:, 1] > 5).any() and (x[:, 0] < 0).any()  # covers the box, not a corner
    assert not s.is_in(torch.tensor([1.5, 3.0]))
    assert torch.equal(s.project(torch.tensor([1.5, -3.0])), torch.tensor([1.0, 0.0]))
    assert s.describe_mismatch(torch.tensor([1.5, 3.0])).startswith("values outside")


def test_bounded_int_and_scalar_bounds():
    torch.manual_seed(0)
    s = Bounded(0, 3, (1000,), dtype=torch.int64)
    x = s.rand()
    assert x.dtype == torch.int64
    assert set(x.tolist()) == {0, 1, 2, 3}  # both ends are inclusive
    with pytest.raises(ValueError, match="low must be <= high"):
        Bounded(1.0, 0.0, (2,))


def test_bounded_infinite_sides_sample_finite():
    s = Bounded(torch.tensor([0.0, -float("inf")]), torch.tensor([float("inf"), 1.0]))
    x = s.rand((100,))
    assert torch.isfinite(x).all() and s.is_in(x)


def test_categorical():
    torch.manual_seed(0)
    s = Categorical(3, (5,))
    x = s.rand((200,))
    assert x.shape == (200, 5) and x.dtype == torch.int64
    assert set(x.flatten().tolist()) == {0, 1, 2}
    assert s.is_in(x) and not s.is_in(torch.full((5,), 3))
    assert torch.equal(s.project(torch.tensor([-1.0, 0.4, 1.6, 2.0, 9.0])), torch.tensor([0, 0, 2, 2, 2]))
    masked = Categorical(3, mask=torch.tensor([True, False, True]))
    draws = masked.rand((300,))
    assert set(draws.tolist()) == {0, 2}
    assert not masked.is_in(torch.tensor(1))
    assert torch.equal(s.to_one_hot(torch.tensor([2])), torch.tensor([[False, False, True]]))


def test_one_hot():
    torch.manual_seed(0)
    s = OneHot(4)
    assert s.shape == (4,) and s.dtype == torch.bool
    x = s.rand((50,))
    assert x.shape == (50, 4) and (x.sum(-1) == 1).all() and s.is_in(x)
    assert not s.is_in(torch.tensor([True, True, False, False]))
    p = s.project(torch.tensor([0.1, 0.7, 0.2, -1.0]))
    assert torch.equal(p, torch.tensor([False, True, False, False]))
    assert OneHot(2, dtype=torch.int64).rand().dtype == torch.int64
    assert s.to_categorical(p).item() == 1
    with pytest.raises(ValueError, match="last dim"):
        OneHot(3, (2, 4))
    m = OneHot(3, mask=torch.tensor([False, True, False]))
    assert torch.equal(m.rand((10,)).long().argmax(-1), torch.ones(10, dtype=torch.long))


def test_binary_and_multicategorical():
    torch.manual_seed(0)
    b = Binary(5)
    x = b.rand((100,))
    assert x.dtype == torch.int8 and x.shape == (100, 5) and b.is_in(x)
    assert not b.is_in(torch.tensor([0, 1, 2, 0, 0], dtype=torch.int8))
    assert torch.equal(b.project(torch.tensor([0.2, 0.9, 0.5, 1.0, -3.0])), torch.tensor([0, 1, 0, 1, 0], dtype=torch.int8))
    m = MultiCategorical([2, 3, 4])
    y = m.rand((500,))
    assert y.shape == (500, 3) and m.is_in(y)
    assert y.max(0).values.tolist() == [1, 2, 3] and y.min(0).values.tolist() == [0, 0, 0]
    assert not m.is_in(torch.tensor([1, 3, 0]))
    assert torch.equal(m.project(torch.tensor([5, -1, 9])), torch.tensor([1, 0, 3]))


@pytest.mark.parametrize(
    "spec",
    [
        Unbounded((3,)),
        Bounded(-1.0, 1.0, (3,)),
        Categorical(4, ()),
        OneHot(4),
        Binary(3),
        MultiCategorical([2, 5]),
    ],
    ids=lambda s: type(s).__name__,
)
def test_expand_clone_to_eq(spec):
    big = spec.expand(2, 5, *spec.shape)
    assert big.shape == (2, 5, *spec.shape)
    x = big.rand()
    assert x.shape == big.shape and big.is_in(x)
    assert spec.expand((7, *spec.shape)).shape == (7, *spec.shape)  # tuple form
    assert spec.clone() == spec and spec.clone() is not spec
    assert spec.to("cpu").device == torch.device("cpu")
    assert spec.rand().device == torch.device("cpu")
    if spec.shape:  # a 0-d spec expands to any shape
        with pytest.raises(ValueError, match="must end with"):
            spec.expand(3, 99)


def test_composite_nested_get_set_keys():
    c = Composite(observation=Unbounded((4, 3)), shape=(4,))
    c["next", "reward"] = Unbounded((4, 1))
    c["agents"] = {"obs": Bounded(0.0, 1.0, (4, 2, 5))}
    assert isinstance(c["next"], Composite) and c["next"].shape == (4,)
    assert c["next", "reward"].shape == (4, 1)
    assert c[("agents", "obs")].dtype == torch.float32
    assert ("next", "reward") in c and "missing" not in c
    assert c.keys() == ["observation", "next", "agents"]
    assert sorted(map(str, c.keys(True, True))) == sorted(
        map(str, ["observation", ("next", "reward"), ("agents", "obs")])
    )
    assert ("next",) not in [(k,) for k in c.keys(True, True)]
    with pytest.raises(KeyError, match="'missing'"):
        c["missing"]
    with pytest.raises(ValueError, match="must start with the composite batch size"):
        c["bad"] = Unbounded((3, 1))
    del c["next", "reward"]
    assert ("next", "reward") not in c


def test_composite_rand_zero_is_in_project():
    torch.manual_seed(0)
    c = Composite(
        {"obs": Bounded(-1.0, 1.0, (2, 3)), "sub": {"act": OneHot(4, (2, 4))}}, shape=(2,)
    )
    td = c.rand()
    assert isinstance(td, TensorDict) and td.batch_size == (2,)
    assert td["sub", "act"].shape == (2, 4) and c.is_in(td)
    big = c.rand((5,))
    assert big.batch_size == (5, 2) and big["obs"].shape == (5, 2, 3)
    z = c.zero()
    assert torch.equal(z["obs"], torch.zeros(2, 3))
    assert not c.is_in(z)  # all-zero one-hot is not a one-hot
    assert "one-hot" in c.describe_mismatch(z)
    td["obs"] = td["obs"] * 10
    assert not c.is_in(td)
    assert c.is_in(c.project(td))
    assert "missing" in c.describe_mismatch(td.exclude("obs"))


def test_composite_expand_to_clone_eq():
    c = Composite({"a": Unbounded((3, 2)), "b": {"c": Categorical(2, (3, 1), dtype=torch.bool)}}, shape=(3,))
    e = c.expand(4, 3)
    assert e.shape == (4, 3) and e["a"].shape == (4, 3, 2) and e["b", "c"].shape == (4, 3, 1)
    assert e["b"].shape == (4, 3)
    assert c.clone() == c and c.clone() is not c
    assert c.to("cpu")["a"].device == torch.device("cpu")
    assert c.select("a").keys() == ["a"]
    assert c.exclude("a").keys() == ["b"]
    with pytest.raises(ValueError, match="must end with"):
        c.expand(4)


def test_composite_keys_follow_every_write_after_being_cached():
    """keys() is cached for the env's per-step reward / done lookups; any write, nested or
    not, must show in the next call."""
    from tdrl.core.specs import Composite, Unbounded

    spec = Composite(a=Unbounded((2,)), shape=())
    assert spec.keys(True, True) == ["a"]
    spec["b", "c"] = Unbounded((1,))  # creates the sub-composite b
    assert spec.keys(True, True) == ["a", ("b", "c")]
    spec["b"]["d"] = Unbounded((1,))  # a write into the nested composite only
    assert spec.keys(True, True) == ["a", ("b", "c"), ("b", "d")]
    del spec["a"]
    assert spec.keys(True, True) == [("b", "c"), ("b", "d")]
    keys = spec.keys()
    keys.append("x")  # the caller's list is its own
    assert spec.keys() == ["b"]
