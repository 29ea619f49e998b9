"""TorchRL's grouped views of an env's specs: ``env.input_spec`` (``full_state_spec`` and
``full_action_spec``), ``env.output_spec`` (``full_observation_spec``, ``full_reward_spec``,
``full_done_spec``) and ``env.specs`` (both), so ``env.specs["input_spec", "full_action_spec",
"action"]`` reads as in TorchRL's scripts. Built fresh on each access from the env's own specs
(clones: editing a view does not change the env)."""

from __future__ import annotations

from .composite import Composite

__all__ = ["input_spec_of", "output_spec_of", "specs_of"]


def input_spec_of(env) -> Composite:
    """``Composite(full_state_spec=..., full_action_spec=...)`` of ``env``."""
    return Composite(full_state_spec=env.full_state_spec.clone(), full_action_spec=env.full_action_spec.clone(),
                     shape=env.batch_size)


def output_spec_of(env) -> Composite:
    """``Composite(full_observation_spec=..., full_reward_spec=..., full_done_spec=...)`` of ``env``."""
    return Composite(full_observation_spec=env.observation_spec.clone(), full_reward_spec=env.full_reward_spec.clone(),
                     full_done_spec=env.full_done_spec.clone(), shape=env.batch_size)


def specs_of(env) -> Composite:
    """``Composite(input_spec=..., output_spec=...)`` of ``env``."""
    return Composite(input_spec=input_spec_of(env), output_spec=output_spec_of(env), shape=env.batch_size)
