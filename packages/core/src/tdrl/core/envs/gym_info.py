"""Reading chosen entries of Gymnasium's ``info`` dict into TensorDict entries.

``GymEnv(..., info_keys=("x_position",))`` (or ``env.set_info_keys(...)``) writes the
named numeric ``info`` entries next to the observations, under ``"next"`` after a step and
at the root after a reset, like TorchRL's ``set_info_dict_reader(default_info_dict_reader(
keys))``. The keys join ``observation_spec``.

* A sequence of names gives each a scalar float32 spec (shape ``batch_size``), as TorchRL's
  default reader does.
* A mapping ``{name: spec}`` sets the spec (dtype and shape) of each entry; a spec whose
  shape does not start with the env's batch dims gets them prepended.
* An entry missing from an ``info`` dict (e.g. a step-only entry after a reset, or a
  sub-env of a vector env that did not report it) is written as zeros.
* Vector envs in ``SameStep`` autoreset mode: for sub-envs that just finished, the value
  comes from ``info["final_info"]`` (the last step of the episode), not from the reset.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from ..specs import Composite, TensorSpec, Unbounded

__all__ = ["InfoReader"]


class InfoReader:
    """Convert the chosen entries of a Gymnasium ``info`` dict into tensors.

    Args:
        info_keys: names (scalar float32 specs) or a mapping ``{name: TensorSpec}``.
        batch_size: the env's batch size (``()`` or ``(num_envs,)``).
        device: the env's device.
        vector: whether the env is a Gymnasium vector env (``info`` values have a leading
            ``num_envs`` dim and a ``"_name"`` mask).
    """

    def __init__(self, info_keys: Sequence[str] | Mapping[str, TensorSpec], batch_size: torch.Size,
                 device: torch.device, vector: bool) -> None:
        batch = tuple(batch_size)
        if isinstance(info_keys, str):
            raise TypeError(f"info_keys must be a sequence of names or a mapping name -> spec, "
                            f"got the string {info_keys!r} (did you mean ({info_keys!r},)?).")
        if isinstance(info_keys, Mapping):
            items = list(info_keys.items())
        else:
            items = [(k, None) for k in info_keys]
        self.specs: dict[str, TensorSpec] = {}
        for key, spec in items:
            if not isinstance(key, str):
                raise TypeError(f"info key {key!r} must be a string.")
            if spec is None:
                spec = Unbounded(batch, device, torch.float32)
            elif not isinstance(spec, TensorSpec) or isinstance(spec, Composite):
                raise TypeError(f"The spec of info key {key!r} must be a leaf TensorSpec, got {spec!r}.")
            elif tuple(spec.shape[: len(batch)]) != batch:
                spec = spec.expand(*batch, *spec.shape)
            self.specs[key] = spec.to(device)
        self.batch = batch
        self.vector = vector
        self.device = device

    @property
    def spec(self) -> Composite:
        """The info entries' specs as a Composite of shape ``batch_size``."""
        return Composite(dict(self.specs), shape=self.batch, device=self.device)

    def read(self, info: dict | None, out: dict, done: np.ndarray | None = None) -> dict:
        """Write one tensor per info key into ``out`` (fresh tensors, never views of ``info``).

        Args:
            info: the ``info`` dict of ``step`` or ``reset`` (``None``: all zeros).
            out: the dict the entries are written into.
            done: vector envs: bool ``(num_envs,)`` of the sub-envs that just finished
                (their values are read from ``info["final_info"]`` when present).

        Returns:
            ``out``.
        """
        info = info or {}
        for key, spec in self.specs.items():
            val = info.get(key)
            if val is None:
                out[key] = spec.zero()
                continue
            arr = np.array(val, dtype=_np_dtype(spec.dtype))  # a copy: info arrays get reused
            if self.vector:
                arr = self._vector_value(key, arr, info, done)
            try:
                arr = arr.reshape(spec.shape)
            except ValueError:
                raise ValueError(
                    f"info[{key!r}] has shape {arr.shape}; its spec {spec!r} expects shape "
                    f"{tuple(spec.shape)} ({int(np.prod(spec.shape))} values). Pass "
                    f"info_keys={{{key!r}: Unbounded(shape)}} with the right per-env shape."
                ) from None
            out[key] = torch.from_numpy(arr).to(self.device)
        return out

    def _vector_value(self, key: str, arr: np.ndarray, info: dict, done) -> np.ndarray:
        mask = info.get("_" + key)
        if mask is not None:  # sub-envs that did not report the key get zeros
            m = np.asarray(mask, dtype=np.bool_)
            arr[~m] = 0
        final = info.get("final_info")
        if done is not None and isinstance(final, dict) and key in final:
            fmask = np.asarray(final.get("_" + key, done), dtype=np.bool_) & done
            if fmask.any():
                arr[fmask] = np.asarray(final[key], dtype=arr.dtype)[fmask]
        return arr


_TORCH_TO_NP = {
    torch.float16: np.float16, torch.float32: np.float32, torch.float64: np.float64,
    torch.int8: np.int8, torch.int16: np.int16, torch.int32: np.int32, torch.int64: np.int64,
    torch.uint8: np.uint8, torch.bool: np.bool_,
}


def _np_dtype(dtype: torch.dtype):
    try:
        return _TORCH_TO_NP[dtype]
    except KeyError:
        raise TypeError(f"info entries of dtype {dtype} are not supported; use one of "
                        f"{sorted(str(d) for d in _TORCH_TO_NP)}.") from None
