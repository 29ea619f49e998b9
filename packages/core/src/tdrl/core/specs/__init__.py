"""Specs: what an environment reads and writes (shape, dtype, device, admissible values).

Names and semantics follow TorchRL 0.14 (``Unbounded``, ``Bounded``, ``Categorical``,
``OneHot``, ``Binary``, ``MultiCategorical``, ``Composite``). Every spec has ``shape``,
``dtype``, ``device``, ``rand(shape)``, ``zero(shape)``, ``is_in(x)``, ``project(x)``,
``expand(*shape)`` and ``to(device)``; shapes are full shapes, batch dims first.
"""

from __future__ import annotations

from ._base import TensorSpec
from .batching import unbatched_spec
from .composite import Composite
from .continuous import Bounded, Unbounded
from .discrete import Binary, Categorical, MultiCategorical, MultiOneHot, OneHot

__all__ = [
    "TensorSpec",
    "Unbounded",
    "Bounded",
    "Categorical",
    "OneHot",
    "Binary",
    "MultiCategorical",
    "MultiOneHot",
    "Composite",
    "unbatched_spec",
]
