"""Small checkpointable holders for run state that has no ``state_dict`` of its own."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["GeneratorState", "StateBox"]


class GeneratorState:
    """``state_dict`` / ``load_state_dict`` of a ``torch.Generator`` (so a resumed run draws
    the same numbers as an uninterrupted one)."""

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator

    def state_dict(self) -> dict:
        return {"state": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["state"])


class StateBox:
    """A checkpointable slot for a plain value (tensors, TensorDicts, numbers, lists, dicts,
    ``None``): ``box.value`` is saved and restored as it is."""

    def __init__(self, value: Any = None) -> None:
        self.value = value

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = state["value"]
