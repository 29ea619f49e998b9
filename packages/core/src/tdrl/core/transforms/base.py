"""``Transform`` (the base of every transform) and ``Compose``.

A transform sits between an environment and its user (see ``TransformedEnv``):

* ``_step(td, next_td)`` rewrites the step output ``next_td`` (``td`` is the root of step
  ``t``, where stateful transforms find their previous value); by default ``_call(next_td)``;
* ``_reset(td, td_reset)`` rewrites a reset output (``td`` is the reset input, possibly
  holding a ``"_reset"`` mask, or ``None``); by default ``_call(td_reset)``;
* ``inv(td)`` rewrites the input of ``step`` on its way to the base env (actions);
* ``transform_*_spec`` rewrite the specs so that the transformed env describes its data
  (``transform_fake_tensordict``: the stored entries no spec describes);
* ``forward(td)`` applies ``_call`` to any TensorDict (e.g. replay-buffer data);
* ``step_only_keys()`` / ``unstored_next_keys()`` name entries of ``"next"`` that are not
  carried into the next root (they describe the step, as the reward does) / that are dropped
  from the stored step once the next root is built from them (``NextObservationDelta``);
* ``dict_step(batch_size, device)`` optionally gives ``_step`` on plain dicts, so that a
  ``TransformedEnv`` can offer its base env's dict stepper (``EnvBase.dict_stepper``);
  ``dict_reset(batch_size, device)`` likewise gives ``_reset`` (``EnvBase.dict_resetter``).

Key names follow TorchRL: ``in_keys``/``out_keys`` for the forward direction,
``in_keys_inv`` (keys the base env reads) / ``out_keys_inv`` (keys the user writes).
Transforms are ``nn.Module``s, so their statistics live in ``state_dict()``.
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Callable, Sequence

import torch
from tensordict import TensorDictBase
from torch import nn

from ..specs import Composite
from ..td_access import entries, plain_td_maker

__all__ = ["Transform", "Compose", "DictStep", "DictReset"]

NestedKey = str | tuple
DictStep = tuple[Callable[[dict, dict], None], bool]
"""``(fn, keeps_done)``: ``fn(root, next)`` does ``_step`` on plain dicts of tensors, rewriting
``next`` in place; ``keeps_done`` says that it never changes the done flags."""
DictReset = Callable[[dict, dict], None]
"""``fn(root, out)`` does ``_reset`` on plain dicts: ``root`` is the reset input (with its
``"_reset"`` mask), ``out`` the reset output before the partial merge, rewritten in place."""


def overrides(obj, cls: type, *names: str) -> bool:
    """Whether ``type(obj)`` overrides any of the methods ``names`` of ``cls`` (then a dict
    hook written for ``cls`` would not do what the subclass does)."""
    return any(getattr(type(obj), n) is not getattr(cls, n) for n in names)


def str_keys(*key_lists) -> bool:
    """Whether every key of every list is a plain string (the dict hooks handle no nesting)."""
    return all(isinstance(k, str) for keys in key_lists for k in keys)


def _as_keys(keys) -> list:
    if keys is None:
        return []
    if isinstance(keys, str | tuple):
        return [keys]
    return list(keys)


def _on_dicts(body: Callable, batch_size: torch.Size, device) -> Callable[[dict, dict], None]:
    """``body(td, out_td)`` (a transform's ``_step`` or ``_reset``) as ``fn(root, out)`` on plain
    dicts: run on TensorDicts made over the dicts without checks, its result written back into
    ``out``."""
    make = plain_td_maker(batch_size, device)

    def fn(root: dict, out: dict) -> None:
        items = entries(body(make(root), make(out)))
        if items is not out:
            out.clear()
            out.update(items)

    return fn


def _rewrite(td, sources: list, targets: list, fn: Callable) -> TensorDictBase | dict:
    """``td[target] = fn(td[source])`` for each pair whose source is present (a transform's
    forward ``_call`` and its ``inv``); ``td`` a TensorDict or a plain dict (a dict hook's
    entries, string keys); returns ``td``."""
    put = td.__setitem__ if type(td) is dict else td.set
    for src, dst in zip(sources, targets, strict=True):
        val = td.get(src, None)
        if val is not None:
            put(dst, fn(val))
    return td


def _in_order(fns: list[Callable[[dict, dict], None]]) -> Callable[[dict, dict], None]:
    """One dict hook running ``fns`` in order on the same two dicts (a Compose's hooks)."""

    def fn(a: dict, b: dict) -> None:
        for f in fns:
            f(a, b)

    return fn


class Transform(nn.Module):
    """Base class of transforms (see the module docstring for the protocol).

    Args:
        in_keys: keys read by the forward transform.
        out_keys: keys written (default: ``in_keys``, in place).
        in_keys_inv: keys the base env reads in ``step`` (written by ``inv``).
        out_keys_inv: keys the user writes (read by ``inv``; default ``in_keys_inv``).
    """

    def __init__(
        self,
        in_keys: Sequence[NestedKey] | NestedKey | None = None,
        out_keys: Sequence[NestedKey] | NestedKey | None = None,
        in_keys_inv: Sequence[NestedKey] | NestedKey | None = None,
        out_keys_inv: Sequence[NestedKey] | NestedKey | None = None,
    ) -> None:
        super().__init__()
        self.in_keys = _as_keys(in_keys)
        self.out_keys = _as_keys(out_keys) or list(self.in_keys)
        self.in_keys_inv = _as_keys(in_keys_inv)
        self.out_keys_inv = _as_keys(out_keys_inv) or list(self.in_keys_inv)
        if len(self.in_keys) != len(self.out_keys):
            raise ValueError(f"{type(self).__name__}: in_keys {self.in_keys} and out_keys "
                             f"{self.out_keys} must have the same length.")
        self._container_ref = None

    # ------------------------------------------------------------------ wiring
    def set_container(self, container) -> None:
        """Called by ``TransformedEnv`` / ``Compose``: the object holding this transform.

        Kept as a weak reference (not a sub-module), so there is no ownership cycle.
        """
        self._container_ref = None if container is None else weakref.ref(container)

    @property
    def container(self):
        return None if self._container_ref is None else self._container_ref()

    @property
    def parent(self):
        """The ``TransformedEnv`` holding this transform (or ``None``)."""
        c = self.container
        while isinstance(c, Transform):
            c = c.container
        return c

    @property
    def has_inv(self) -> bool:
        return bool(self.in_keys_inv)

    def clone(self) -> Transform:
        """A deep copy (its statistics copied, not shared) attached to no env, to put in
        another ``TransformedEnv`` (TorchRL's ``Transform.clone``)."""
        ref, self._container_ref = self._container_ref, None
        try:
            out = copy.deepcopy(self)
        finally:
            self._container_ref = ref
        for module in out.modules():  # a copied Compose holds copied children: rewire them
            if isinstance(module, Compose):
                for child in module.transforms:
                    child.set_container(module)
        return out

    # ------------------------------------------------------------------ data
    def _apply_transform(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def _inv_apply_transform(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def _call(self, td: TensorDictBase) -> TensorDictBase:
        return _rewrite(td, self.in_keys, self.out_keys, self._apply_transform)

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        """Apply the transform to ``td`` (and to ``td["next"]`` if present)."""
        self._call(td)
        nxt = td.get("next", None)
        if isinstance(nxt, TensorDictBase):
            self._call(nxt)
        return td

    def _step(self, td: TensorDictBase, next_td: TensorDictBase) -> TensorDictBase:
        return self._call(next_td)

    def _reset(self, td: TensorDictBase | None, td_reset: TensorDictBase) -> TensorDictBase:
        return self._call(td_reset)

    def inv(self, td: TensorDictBase) -> TensorDictBase:
        """Rewrite the step input ``td`` in place (callers pass a shallow copy)."""
        return _rewrite(td, self.out_keys_inv, self.in_keys_inv, self._inv_apply_transform)

    def dict_step(self, batch_size: torch.Size, device: torch.device) -> DictStep | None:
        """``_step`` on plain dicts (see :data:`DictStep`).

        By default this is the transform's own ``_step``, run on TensorDicts made over the
        dicts without checks (:func:`~tdrl.core.td_access.plain_td_maker`), so a transform
        written the ordinary way (``_apply_transform``, ``_call`` or ``_step``) is on the
        collector's fast path with its one body. It may change any entry, so the env's own
        "any done" answer is not trusted behind it (``keeps_done`` False). A transform may
        return a cheaper hook that does the same on the dicts directly.

        Args:
            batch_size, device: those of the env the transform sits in.
        """
        return _on_dicts(self._step, batch_size, device), False

    def dict_reset(self, batch_size: torch.Size, device: torch.device) -> DictReset | None:
        """``_reset`` on plain dicts (see :data:`DictReset`): by default the transform's own
        ``_reset`` on TensorDicts made over the dicts (as :meth:`dict_step`).

        Args:
            batch_size, device: those of the env the transform sits in.
        """
        return _on_dicts(self._reset, batch_size, device)

    def _own_hook(self, owner: type, name: str, keys: Sequence, body: Callable) -> Callable | None:
        """``body``, the transform's own step or reset body written against the mapping protocol
        (what its ``name`` method runs on TensorDicts), as its dict hook; ``None`` where a
        subclass of ``owner`` overrides ``name`` or a key of ``keys`` is not a string (the dict
        hooks handle no nesting): the caller then takes the default hook, the body adapted."""
        return None if overrides(self, owner, name) or not str_keys(keys) else body

    def step_only_keys(self) -> list:
        """Top-level keys this transform writes under ``"next"`` that describe the step, not
        the state of step ``t + 1``: like the reward, they are not carried into the next root
        (see ``EnvBase.step_only_keys``). None by default."""
        return []

    def unstored_next_keys(self) -> list:
        """Keys of ``"next"`` that build the next root and are then dropped from the stored
        step (TorchRL's post-step-mdp drop; see ``EnvBase.unstored_next_keys``). None by
        default."""
        return []

    # ------------------------------------------------------------------ specs
    def transform_fake_tensordict(self, td: TensorDictBase) -> TensorDictBase:
        """Rewrite the env's ``fake_tensordict`` (what ``check_env_specs`` compares a stored
        step with) for entries no spec describes: a step entry, an unstored one. Unchanged by
        default."""
        return td

    def transform_observation_spec(self, spec: Composite) -> Composite:
        return spec

    def transform_reward_spec(self, spec: Composite) -> Composite:
        return spec

    def transform_done_spec(self, spec: Composite) -> Composite:
        return spec

    def transform_action_spec(self, spec: Composite) -> Composite:
        return spec

    def transform_state_spec(self, spec: Composite) -> Composite:
        return spec

    def extra_repr(self) -> str:
        return f"in_keys={self.in_keys}, out_keys={self.out_keys}"


class Compose(Transform):
    """A sequence of transforms applied in order (inverse transforms in reverse order).

    Args:
        *transforms: the transforms.
    """

    def __init__(self, *transforms: Transform) -> None:
        super().__init__()
        self.transforms = nn.ModuleList()
        for t in transforms:
            self.append(t)

    def append(self, transform: Transform) -> None:
        if not isinstance(transform, Transform):
            raise TypeError(f"Compose takes Transform instances, got {type(transform).__name__}.")
        transform.set_container(self)
        self.transforms.append(transform)

    def insert(self, index: int, transform: Transform) -> None:
        transform.set_container(self)
        self.transforms.insert(index, transform)

    def __getitem__(self, i):
        return self.transforms[i]

    def __len__(self) -> int:
        return len(self.transforms)

    def __iter__(self):
        return iter(self.transforms)

    @property
    def has_inv(self) -> bool:
        return any(t.has_inv for t in self.transforms)

    def _call(self, td):
        for t in self.transforms:
            td = t._call(td)
        return td

    def forward(self, td):
        for t in self.transforms:
            td = t(td)
        return td

    def _step(self, td, next_td):
        for t in self.transforms:
            next_td = t._step(td, next_td)
        return next_td

    def _reset(self, td, td_reset):
        for t in self.transforms:
            td_reset = t._reset(td, td_reset)
        return td_reset

    def dict_step(self, batch_size, device) -> DictStep | None:
        """Every transform's hook in order (a subclass that overrides ``_step``: its own body, adapted)."""
        if overrides(self, Compose, "_step"):
            return Transform.dict_step(self, batch_size, device)
        hooks = [t.dict_step(batch_size, device) for t in self.transforms]
        if any(h is None for h in hooks):
            return None
        return _in_order([fn for fn, _ in hooks]), all(keeps for _, keeps in hooks)

    def dict_reset(self, batch_size, device) -> DictReset | None:
        """Every transform's reset hook in order (a subclass that overrides ``_reset``: its own body, adapted)."""
        if overrides(self, Compose, "_reset"):
            return Transform.dict_reset(self, batch_size, device)
        fns = [t.dict_reset(batch_size, device) for t in self.transforms]
        return None if any(f is None for f in fns) else _in_order(fns)

    def inv(self, td):
        for t in reversed(self.transforms):
            td = t.inv(td)
        return td

    def step_only_keys(self) -> list:
        return [k for t in self.transforms for k in t.step_only_keys()]

    def unstored_next_keys(self) -> list:
        return [k for t in self.transforms for k in t.unstored_next_keys()]

    def transform_fake_tensordict(self, td):
        for t in self.transforms:
            td = t.transform_fake_tensordict(td)
        return td

    def _chain(self, name: str, spec):
        for t in self.transforms:
            spec = getattr(t, name)(spec)
        return spec

    def transform_observation_spec(self, spec):
        return self._chain("transform_observation_spec", spec)

    def transform_reward_spec(self, spec):
        return self._chain("transform_reward_spec", spec)

    def transform_done_spec(self, spec):
        return self._chain("transform_done_spec", spec)

    def transform_action_spec(self, spec):
        # The action travels user -> base env through inv() in reverse order, so the user's
        # action spec is the base action spec rewritten by each transform in forward order.
        return self._chain("transform_action_spec", spec)

    def transform_state_spec(self, spec):
        return self._chain("transform_state_spec", spec)

    def extra_repr(self) -> str:
        return ""
