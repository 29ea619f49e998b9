"""``NextObservationDelta``: the lossy compact variant of the compact-observation path.

Where ``Collector(compact_obs=True)`` drops ``("next", obs)`` and
:class:`~tdrl.core.replay.NextStateReconstructor` rebuilds it from the trajectory (unknown, NaN,
after a trajectory's last step), this transform keeps the transition itself, in low precision:

* env side (``_step``): ``("next", "delta", k) = (next_obs - obs).to(delta_dtype)`` for each
  observation key ``k``; the full ``("next", k)`` still becomes the root of the next step (the
  policy sees full precision), then it is dropped from the stored step (the env's
  ``unstored_next_keys``), and the delta is never carried into the next root (the env's
  ``step_only_keys``): a collected batch holds ``k`` and ``("next", "delta", k)``;
* replay side (``forward``, a buffer's ``transform=``): ``("next", k) = obs + delta`` in the
  observation's dtype, exact up to the round-off of ``delta_dtype``, at episode ends too (the
  delta is the real last transition, so nothing is unknown).

Round-off: a float16 delta carries 11 significant bits, so the rebuilt next observation is
off by at most ``|next_obs - obs| * 2**-11`` (``2**-25`` for a delta below ``2**-14``, where
float16 is subnormal) plus the round-off of the float32 subtraction and addition (``obs``
itself is kept exactly); a delta beyond float16's range (65504) is refused, not stored as inf. TorchRL 0.14's transform of the same name does the same
arithmetic (tested equal on a real rollout).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from tensordict import TensorDictBase

from ..keys import NEXT
from ..specs import Composite
from .base import DictStep, Transform

__all__ = ["NextObservationDelta", "observation_delta", "next_from_delta", "DELTA"]

DELTA = "delta"
"""The sub-key of ``"next"`` that holds the deltas: ``("next", "delta", *key)`` (TorchRL's)."""

_INTEGER_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.bool)


def observation_delta(obs: torch.Tensor, next_obs: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``(next_obs - obs).to(dtype)``: the difference taken in the observations' own dtype, then
    cast once (fewer bits lost than casting each operand first).

    Args:
        obs, next_obs: ``[*B, *obs_shape]`` floating tensors of one dtype.
        dtype: the floating dtype the delta is stored in.

    Returns:
        ``[*B, *obs_shape]`` in ``dtype``.
    """
    return (next_obs - obs).to(dtype)


def next_from_delta(obs: torch.Tensor, delta: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The next observation ``obs + delta``, both cast to ``dtype`` first.

    Args:
        obs: ``[*B, *obs_shape]``, the observation of step ``t``.
        delta: ``[*B, *obs_shape]``, :func:`observation_delta` of step ``t``.
        dtype: the dtype of the result.

    Returns:
        ``[*B, *obs_shape]`` in ``dtype``.
    """
    return obs.to(dtype) + delta.to(dtype)


def _key_tuple(key) -> tuple:
    return (key,) if isinstance(key, str) else tuple(key)


class NextObservationDelta(Transform):
    """Store ``("next", obs)`` as a low-precision delta ``("next", "delta", obs)`` (TorchRL 0.14).

    Put the same instance (or one with the same ``in_keys``) in the ``TransformedEnv`` and as
    the replay buffer's ``transform=``. See the module docstring for the two sides and the
    round-off.

    Args:
        in_keys: the observation keys to compress. ``None``: every floating observation leaf
            of the env's observation spec (found when the transform joins an env); on a replay
            buffer alone, pass them.

    Keyword Args:
        delta_dtype: the floating dtype of the stored delta (default ``torch.float16``).
        restore_dtype: the dtype of the rebuilt ``("next", k)``: ``"root"`` (default) that of
            the sampled ``k``, or a floating dtype.
        drop_delta: remove ``("next", "delta", k)`` after rebuilding (default True), so the
            sample has the layout of an uncompressed pipeline.
        excluded_dtypes: dtypes skipped when the keys are found from the spec (default: the
            integer and bool dtypes; only floating observations are ever compressed).

    Raises:
        ValueError: a non-floating ``delta_dtype`` / ``restore_dtype`` (at construction); an
            ``in_keys`` entry that is not a floating observation of the env (when it joins the
            env, before any step); a delta that overflows ``delta_dtype`` (at that step); a
            sampled delta whose dtype or shape does not match.

    Put it outside a ``SerialEnv`` / ``ParallelEnv`` (``TransformedEnv(ParallelEnv(...), ...)``),
    as in TorchRL: a batched env moves only spec entries between workers, so one built over
    sub-envs that hold it is refused.

    Example:
        >>> env = TransformedEnv(GymEnv("Pendulum-v1"), NextObservationDelta())
        >>> batch = Collector(env, None, frames_per_batch=200).rollout()
        >>> batch["next", "delta", "observation"].dtype, ("next", "observation") in batch.keys(True)
        (torch.float16, False)
        >>> rb = ReplayBuffer(TensorStorage(1000), transform=NextObservationDelta(["observation"]))
    """

    def __init__(
        self,
        in_keys: Sequence | str | None = None,
        *,
        delta_dtype: torch.dtype = torch.float16,
        restore_dtype: torch.dtype | Literal["root"] = "root",
        drop_delta: bool = True,
        excluded_dtypes: tuple[torch.dtype, ...] = _INTEGER_DTYPES,
    ) -> None:
        if not (isinstance(delta_dtype, torch.dtype) and delta_dtype.is_floating_point):
            raise ValueError(f"NextObservationDelta: delta_dtype must be a floating dtype, got "
                             f"{delta_dtype!r}.")
        if restore_dtype != "root" and not (isinstance(restore_dtype, torch.dtype)
                                            and restore_dtype.is_floating_point):
            raise ValueError(f"NextObservationDelta: restore_dtype must be a floating dtype or "
                             f"'root', got {restore_dtype!r}.")
        self._auto_keys = in_keys is None
        super().__init__(in_keys)
        self.delta_dtype = delta_dtype
        self.restore_dtype = restore_dtype
        self.drop_delta = bool(drop_delta)
        self.excluded_dtypes = tuple(excluded_dtypes)

    # ------------------------------------------------------------------ env side
    def transform_observation_spec(self, spec: Composite) -> Composite:
        """Find (``in_keys=None``) or check the compressed keys: floating observations only,
        refused before the first step otherwise. The spec itself is unchanged: the delta is a
        transition entry, not an observation (it is in no root)."""
        floats = {}
        for key, leaf in spec.items(True, True):
            floats[key] = leaf.dtype is not None and leaf.dtype.is_floating_point
        if self._auto_keys:
            self.in_keys = [k for k, is_float in floats.items()
                            if is_float and spec[k].dtype not in self.excluded_dtypes]
            self.out_keys = list(self.in_keys)
            return spec
        for key in self.in_keys:
            norm = key if isinstance(key, str) or len(key) > 1 else key[0]
            if norm not in floats:
                raise ValueError(f"NextObservationDelta: {key!r} is not an observation of this env "
                                 f"(observations: {list(floats)}).")
            if not floats[norm]:
                raise ValueError(
                    f"NextObservationDelta: observation {key!r} has dtype {spec[norm].dtype}; only "
                    "floating observations are stored as deltas (a difference of integers would "
                    "wrap around). Fix: leave it out of in_keys, or cast it first (DTypeCastTransform).")
        return spec

    def _step(self, td: TensorDictBase, next_td: TensorDictBase) -> TensorDictBase:
        for key in self.in_keys:
            obs, nxt = td.get(key, None), next_td.get(key, None)
            if obs is None or nxt is None:
                continue
            delta = observation_delta(obs, nxt, self.delta_dtype)
            if bool(torch.isinf(delta).any()) and not bool(torch.isinf(nxt - obs).any()):
                big = float((nxt - obs).abs().max())
                raise ValueError(
                    f"NextObservationDelta: a delta of {key!r} ({big:g}) overflows "
                    f"{self.delta_dtype} (largest finite {torch.finfo(self.delta_dtype).max:g}); "
                    "it would be stored as inf. Fix: delta_dtype=torch.bfloat16 or torch.float32, "
                    "or normalise the observation first.")
            next_td.set((DELTA, *_key_tuple(key)), delta)
        return next_td

    def transform_fake_tensordict(self, td: TensorDictBase) -> TensorDictBase:
        """A stored step: ``("next", "delta", k)`` in ``delta_dtype``, no ``("next", k)``."""
        nxt = td.get(NEXT)
        for key in self.in_keys:
            leaf = nxt.get(key, None)
            if leaf is not None:
                nxt.set((DELTA, *_key_tuple(key)), torch.zeros_like(leaf, dtype=self.delta_dtype))
                nxt.del_(key)
        return td

    def _reset(self, td, td_reset):
        return td_reset

    def _call(self, td):
        return td

    def dict_step(self, batch_size: torch.Size, device: torch.device) -> DictStep | None:
        """The default hook (this ``_step`` on dicts); it never changes the done flags."""
        fn, _ = super().dict_step(batch_size, device)
        return fn, True

    def step_only_keys(self) -> list:
        """``["delta"]``: the deltas describe the step; they are not carried into the next root."""
        return [DELTA] if self.in_keys else []

    def unstored_next_keys(self) -> list:
        """The compressed keys: ``("next", k)`` is dropped from the stored step once the next
        root is built from it."""
        return list(self.in_keys)

    # ------------------------------------------------------------------ replay side
    def forward(self, td: TensorDictBase) -> TensorDictBase:
        """Rebuild ``("next", k) = k + ("next", "delta", k)`` (a replay buffer's ``transform=``).

        A batch that already holds ``("next", k)`` and no delta is left as it is; a delta
        without its ``k``, or of another dtype or shape, is refused.
        """
        if not self.in_keys:
            raise ValueError("NextObservationDelta: no in_keys to rebuild. On a replay buffer "
                             "pass them: NextObservationDelta(['observation']).")
        for key in self.in_keys:
            kt = _key_tuple(key)
            delta = td.get((NEXT, DELTA, *kt), None)
            if delta is None:
                if td.get((NEXT, *kt), None) is None:
                    raise KeyError(f"NextObservationDelta: the batch has neither {(NEXT, DELTA, *kt)!r} "
                                   f"nor {(NEXT, *kt)!r}: it was not collected through this transform.")
                continue
            obs = td.get(kt if len(kt) > 1 else kt[0], None)
            if obs is None:
                raise KeyError(f"NextObservationDelta: the batch has {(NEXT, DELTA, *kt)!r} but no "
                               f"{key!r} to add it to.")
            if delta.dtype != self.delta_dtype or delta.shape != obs.shape:
                raise ValueError(
                    f"NextObservationDelta: {(NEXT, DELTA, *kt)!r} is {delta.dtype} of shape "
                    f"{tuple(delta.shape)}; expected {self.delta_dtype} of shape {tuple(obs.shape)} "
                    f"(that of {key!r}). Use a transform with the env's delta_dtype.")
            if not obs.is_floating_point() and self.restore_dtype == "root":
                raise ValueError(f"NextObservationDelta: {key!r} is {obs.dtype}; only floating "
                                 "observations are rebuilt from a delta.")
            dtype = obs.dtype if self.restore_dtype == "root" else self.restore_dtype
            td.set((NEXT, *kt), next_from_delta(obs, delta, dtype))
            if self.drop_delta:
                td.del_((NEXT, DELTA, *kt))
        if self.drop_delta:
            holder = td.get((NEXT, DELTA), None)
            if holder is not None and holder.is_empty():
                td.del_((NEXT, DELTA))
        return td

    def extra_repr(self) -> str:
        return f"in_keys={self.in_keys}, delta_dtype={self.delta_dtype}"
