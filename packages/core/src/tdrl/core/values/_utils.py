"""Small helpers shared by value estimators and losses: key look-up with clear errors."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from tensordict import TensorDictBase

NestedKey = Any


def _fmt(key: NestedKey) -> str:
    return repr(key if isinstance(key, str) else tuple(key))


def require(td: TensorDictBase, key: NestedKey, owner: str) -> torch.Tensor:
    """``td[key]``, or a ``KeyError`` that names the key, its owner and the keys found.

    Args:
        td: the input TensorDict.
        key: a (nested) key.
        owner: who needs it (e.g. ``"PPOLoss"``), for the message.

    Returns:
        The tensor stored under ``key``.
    """
    value = td.get(key, None)
    if value is None:
        found = sorted(
            _fmt(k) for k in td.keys(include_nested=True, leaves_only=True)
        )
        raise KeyError(
            f"{owner} needs the key {_fmt(key)}, which the input TensorDict does not have. "
            f"Keys found: [{', '.join(found)}]. Rebind the key with "
            f"{owner}.set_keys(...) if your data names it differently."
        )
    return value


def as_time_column(x: torch.Tensor, batch_shape: torch.Size, name: str) -> torch.Tensor:
    """Return ``x`` with shape ``[*batch_shape, 1]`` (adds the trailing 1 if missing)."""
    if x.shape == batch_shape:
        return x.unsqueeze(-1)
    if x.shape == (*batch_shape, 1):
        return x
    raise ValueError(
        f"{name} has shape {tuple(x.shape)}; expected {(*batch_shape, 1)} "
        f"(the TensorDict's batch shape {tuple(batch_shape)} plus a trailing 1)."
    )


def rebind_keys(keys: Any, owner: str, **kwargs: NestedKey) -> Any:
    """A copy of the keys dataclass ``keys`` with the names in ``kwargs`` rebound: the one
    ``set_keys`` of the losses and the value estimators (``owner`` names the caller in the
    ``KeyError`` an unknown name raises)."""
    fields = {f.name for f in dataclasses.fields(keys)}
    unknown = set(kwargs) - fields
    if unknown:
        raise KeyError(f"{owner}.set_keys: unknown names {sorted(unknown)}; valid names: {sorted(fields)}.")
    return dataclasses.replace(keys, **kwargs)
