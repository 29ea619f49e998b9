"""A spec without its leading batch dims: what one sub-env of a batched env reads and writes
(TorchRL's ``*_spec_unbatched``)."""

from __future__ import annotations

from .composite import Composite
from .continuous import Bounded, Unbounded
from .discrete import Binary, Categorical, MultiCategorical, MultiOneHot, OneHot

__all__ = ["unbatched_spec"]


def unbatched_spec(spec, n: int = 1):
    """``spec`` with its first ``n`` dims (batch dims) dropped; ``n=0`` returns it unchanged."""
    for _ in range(n):
        spec = _drop_first_dim(spec)
    return spec


def _drop_first_dim(spec):
    shape = spec.shape[1:]
    if isinstance(spec, Composite):
        return Composite({k: _drop_first_dim(v) for k, v in spec.items()}, shape=shape, device=spec.device)
    if isinstance(spec, Bounded):
        return Bounded(spec.low[0], spec.high[0], shape, spec.device, spec.dtype)
    if isinstance(spec, OneHot):
        return OneHot(spec.n, shape, spec.device, spec.dtype)
    if isinstance(spec, MultiOneHot):
        return MultiOneHot(spec.nvec, shape, spec.device, spec.dtype)
    if isinstance(spec, Categorical):
        return Categorical(spec.n, shape, spec.device, spec.dtype)
    if isinstance(spec, MultiCategorical):
        return MultiCategorical(spec.nvec[0], shape, spec.device, spec.dtype)
    if isinstance(spec, Binary):
        return Binary(spec.n, shape, spec.device, spec.dtype)
    return Unbounded(shape, spec.device, spec.dtype)
