"""Bad settings are refused when the config is built, before any model work (issue 22, item 7).

Each case constructs the config only; the error must name the field and the value.
"""

from __future__ import annotations

import math

import pytest

from tdrl.llm import GRPOConfig, SFTConfig
from tdrl.llm.generation import HFGenerator, check_sampling
from tdrl.llm.losses import GRPOLossConfig

NAN = math.nan

GRPO_BAD = [
    ("checkpoint_every", 0),  # was a ZeroDivisionError after the first round
    ("max_new_tokens", 0),  # was an UnboundLocalError in generation
    ("max_new_tokens", -3),
    ("max_new_tokens", 2.5),
    ("prompts_per_step", 0),  # was a ZeroDivisionError
    ("grad_accum", 0),  # was a ZeroDivisionError in the divisibility check
    ("grad_accum", -1),
    ("steps", 0),
    ("epochs", 0),
    ("minibatch_size", 0),
    ("warmup_steps", -1),
    ("lr", -1e-5),
    ("lr", NAN),
    ("lr", math.inf),
    ("weight_decay", -0.1),
    ("max_grad_norm", 0.0),
    ("max_grad_norm", NAN),
    ("temperature", 0.0),
    ("temperature", -1.0),
    ("temperature", NAN),
    ("top_p", 0.0),
    ("top_p", 1.5),
    ("top_p", NAN),
    ("top_k", -1),
    ("reward_timeout", -1.0),
    ("reward_timeout", NAN),
    ("group_size", 1),
    ("seed", -1),
    ("steps", True),  # a bool is not a count
]


@pytest.mark.parametrize(("field", "value"), GRPO_BAD, ids=[f"{f}={v}" for f, v in GRPO_BAD])
def test_grpo_config_refuses_bad_values(field, value):
    with pytest.raises(ValueError, match=rf"{field}={value!r}"):
        GRPOConfig(**{field: value})


def test_grpo_config_refuses_nan_beta_and_bad_weights():
    with pytest.raises(ValueError, match=r"loss\.beta=nan"):
        GRPOConfig(loss=GRPOLossConfig(beta=NAN))
    with pytest.raises(ValueError, match=r"reward_weights\[1\]=nan"):
        GRPOConfig(reward_weights=[1.0, NAN])


def test_grpo_config_message_says_what_is_allowed():
    with pytest.raises(ValueError, match=r"top_p=1\.5; expected a number in \(0, 1\]"):
        GRPOConfig(top_p=1.5)
    with pytest.raises(ValueError, match=r"checkpoint_every=0: expected an integer >= 1"):
        GRPOConfig(checkpoint_every=0)


def test_grpo_config_accepts_edge_values():
    cfg = GRPOConfig(top_p=1.0, top_k=0, lr=0.0, reward_timeout=None, max_grad_norm=math.inf, steps=1)
    assert cfg.reward_timeout is None
    assert GRPOConfig(reward_timeout=0).reward_timeout == 0  # explicitly no limit
    assert GRPOConfig().reward_timeout == 60.0  # finite by default


SFT_BAD = [("steps", 0), ("batch_size", 0), ("grad_accum", 0), ("lr", -1.0), ("lr", NAN),
           ("checkpoint_every", 0), ("max_grad_norm", -1.0), ("warmup_steps", -2), ("weight_decay", NAN)]


@pytest.mark.parametrize(("field", "value"), SFT_BAD, ids=[f"{f}={v}" for f, v in SFT_BAD])
def test_sft_config_refuses_bad_values(field, value):
    with pytest.raises(ValueError, match=rf"SFTConfig\.{field}={value!r}"):
        SFTConfig(**{field: value})


def test_sft_divisibility_still_checked():
    with pytest.raises(ValueError, match="divisible by grad_accum=3"):
        SFTConfig(batch_size=32, grad_accum=3)


@pytest.mark.parametrize(
    ("kw", "field"),
    [({"max_new_tokens": 0}, "max_new_tokens"), ({"temperature": 0.0}, "temperature"),
     ({"top_p": 2.0}, "top_p"), ({"top_k": -5}, "top_k")],
)
def test_generation_entry_points_validate(kw, field):
    # HFGenerator checks before it touches the model (None stands for it here)
    with pytest.raises(ValueError, match=rf"HFGenerator: {field}="):
        HFGenerator(None, None, **{"max_new_tokens": 4, **kw})
    args = {"max_new_tokens": 4, "temperature": 1.0, "top_p": 1.0, "top_k": 0, **kw}
    with pytest.raises(ValueError, match=rf"evaluate: {field}="):
        check_sampling("evaluate", **args)
