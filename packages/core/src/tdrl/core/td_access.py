"""The one module that reaches into tensordict's internals, for the per-step hot paths.

A plain ``TensorDict`` holds its entries in a dict (``_tensordict``); reading and writing that
dict, and building a TensorDict without re-validating entries the caller guarantees, costs a
fraction of the public API's per-call checks. Every use lives here, behind small functions
that fall back to the public API for any other TensorDictBase, so a tensordict release that
changes these internals is mended in one place (``tests/test_dependency_floor.py`` checks the
lowest supported release).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from tensordict import TensorDict, TensorDictBase

__all__ = ["entries", "get_entry", "set_entry", "new_td", "is_flat_plain", "plain_td_maker"]


def entries(td: TensorDictBase) -> dict:
    """The entries of ``td`` as a dict: a plain TensorDict's own dict (live: a write into it is
    a write into ``td``, unchecked), else a new dict of its top-level items."""
    return td._tensordict if type(td) is TensorDict else dict(td.items())


def get_entry(td: TensorDictBase, key: str, default=...):
    """``td.get(key)`` for a plain string key (``td.get(key, default)`` when a default is given),
    reading a plain TensorDict's dict directly."""
    if type(td) is TensorDict:
        found = td._tensordict.get(key, default)
        if found is not ...:
            return found
    return td.get(key) if default is ... else td.get(key, default)


def set_entry(td: TensorDictBase, key: str, value) -> None:
    """``td[key] = value`` without shape validation (``key`` a plain string; the caller
    guarantees the batch dims)."""
    try:
        td._set_str(key, value, inplace=False, validated=True)
    except (AttributeError, TypeError):  # not a plain TensorDict
        td.set(key, value)


def new_td(source: dict, batch_size, device=None) -> TensorDict:
    """A TensorDict over ``source`` (string keys, values with the leading ``batch_size``; the
    caller guarantees it) without validating the entries."""
    return TensorDict._new_unsafe(source, batch_size=batch_size, device=device)


def is_flat_plain(td: TensorDictBase) -> bool:
    """Whether ``td`` is a plain TensorDict without dim names (its dict can be copied as is)."""
    return type(td) is TensorDict and td._td_dim_names is None


def plain_td_maker(batch_size: torch.Size, device: torch.device | None) -> Callable[[dict], TensorDict]:
    """A function ``dict of tensors -> TensorDict`` that skips every check.

    The caller guarantees that the values are tensors (or TensorDicts) with the leading
    ``batch_size`` on ``device`` and that the keys are strings. The TensorDict is built
    from a template instance's attributes (what ``TensorDict._new_unsafe`` sets), which is
    several times cheaper than ``_new_unsafe`` on tensordict 0.14; if the template trick
    does not reproduce ``_new_unsafe`` on the installed tensordict, ``_new_unsafe`` is used.

    Returns:
        ``make(source: dict) -> TensorDict``; ``source`` must not be reused by the caller.
    """
    batch_size = torch.Size(batch_size)

    def slow(source: dict) -> TensorDict:
        return TensorDict._new_unsafe(source, batch_size=batch_size, device=device, nested=False)

    try:
        proto = slow({})
        state = dict(proto.__dict__)
        store_cls = type(proto._tensordict)
    except (AttributeError, TypeError):
        return slow
    # tensordict 0.15 sets these four attributes, 0.14 also caches whether MPS exists
    known = {"_tensordict", "_device", "_batch_size", "_td_dim_names", "_has_mps_val"}
    if not {"_tensordict", "_device", "_batch_size"} <= set(state) <= known:
        return slow  # a tensordict version with other per-instance state: stay safe
    del state["_tensordict"]
    new = TensorDict.__new__

    def make(source: dict) -> TensorDict:
        td = new(TensorDict)
        d = td.__dict__
        d.update(state)
        d["_tensordict"] = store_cls(source)
        return td

    try:  # the constructed TensorDict must behave like one from _new_unsafe
        x = torch.zeros((*batch_size, 1))
        probe = make({"x": x})
        ok = (probe.batch_size == batch_size and probe.device == proto.device
              and list(probe.keys()) == ["x"] and probe.get("x") is x
              and not probe.is_locked and probe.clone().get("x").shape == x.shape)
    except Exception:  # noqa: BLE001 - any surprise means: use the documented path
        ok = False
    return make if ok else slow
