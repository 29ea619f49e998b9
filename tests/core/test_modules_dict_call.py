"""``ProbabilisticActor.dict_call`` (the collectors' dict loop) writes what the TensorDict
forward writes: the same keys in the same order, the same values and the same random draws,
under every interaction type; what it does not cover goes through the TensorDict forward."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import InteractionType, NormalParamExtractor, TensorDictModule, set_interaction_type
from torch import nn

from tdrl.core.modules import (
    MLP,
    IndependentNormal,
    MaskedCategorical,
    OneHotCategorical,
    ProbabilisticActor,
    TanhNormal,
)

B = torch.Size([5])


def _categorical(cls=MaskedCategorical, masked=False):
    params = TensorDictModule(MLP(3, 4, (8,)), ["observation"], ["logits"])
    in_keys = {"logits": "logits", "mask": "action_mask"} if masked else ["logits"]
    return ProbabilisticActor(params, cls, in_keys=in_keys)


def _gaussian(cls=IndependentNormal, **kw):
    net = nn.Sequential(MLP(3, 4, (8,)), NormalParamExtractor())
    params = TensorDictModule(net, ["observation"], ["loc", "scale"])
    return ProbabilisticActor(params, cls, **kw)


CASES = {
    "categorical": lambda: _categorical(),
    "masked categorical": lambda: _categorical(masked=True),
    "one-hot": lambda: _categorical(OneHotCategorical),
    "independent normal": lambda: _gaussian(),
    "tanh normal": lambda: _gaussian(TanhNormal, distribution_kwargs={"low": -2.0, "high": 2.0}),
    "no log-prob": lambda: _gaussian(return_log_prob=False),
}


def _root(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(*B, 4, generator=g) > 0.3
    mask[:, 0] = True
    return {"observation": torch.randn(*B, 3, generator=g), "action_mask": mask}


@pytest.mark.parametrize("itype", [InteractionType.RANDOM, InteractionType.DETERMINISTIC, None])
@pytest.mark.parametrize("case", list(CASES))
def test_dict_call_equals_the_tensordict_forward(case, itype):
    torch.manual_seed(0)
    actor = CASES[case]()
    fn = actor.dict_call(B, torch.device("cpu"))
    assert fn is not None
    ctx = set_interaction_type(itype) if itype is not None else torch.no_grad()
    for seed in range(3):
        with torch.no_grad(), ctx:
            torch.manual_seed(100 + seed)
            expected = actor(TensorDict(_root(seed), B))
            torch.manual_seed(100 + seed)
            got = fn(_root(seed))
        assert list(got) == list(expected.keys())
        for key in got:
            assert got[key].dtype == expected[key].dtype and torch.equal(got[key], expected[key]), key
        if itype is InteractionType.RANDOM and seed == 0:  # draws really are random: a new seed differs
            with torch.no_grad(), set_interaction_type(itype):
                torch.manual_seed(7)
                other = fn(_root(0))
            assert not torch.equal(other["action"], got["action"])


def test_outputs_that_do_not_fit_the_batch_go_through_the_tensordict():
    """A params module whose output has another batch shape: the dict call defers to the
    TensorDict forward, which raises its own error."""
    params = TensorDictModule(lambda obs: obs[:2], ["observation"], ["logits"])
    actor = ProbabilisticActor(params, MaskedCategorical, in_keys=["logits"])
    with pytest.raises(RuntimeError) as dict_err:
        actor.dict_call(B, torch.device("cpu"))({"observation": torch.randn(*B, 4)})
    with pytest.raises(RuntimeError) as td_err:
        actor(TensorDict({"observation": torch.randn(*B, 4)}, B))
    assert type(dict_err.value) is type(td_err.value)


def test_actors_outside_the_plain_case_have_no_dict_call():
    nested = TensorDictModule(MLP(3, 4, (8,)), [("agents", "observation")], ["logits"])
    assert ProbabilisticActor(nested, MaskedCategorical, in_keys=["logits"]).dict_call(B, torch.device("cpu")) is None

    class Custom(ProbabilisticActor):
        def forward(self, td, *args, **kwargs):
            return super().forward(td, *args, **kwargs)

    params = TensorDictModule(MLP(3, 4, (8,)), ["observation"], ["logits"])
    assert Custom(params, MaskedCategorical, in_keys=["logits"]).dict_call(B, torch.device("cpu")) is None
