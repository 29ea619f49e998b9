"""How an estimator runs its value network over a rollout: chunked, and shifted.

* :func:`chunked_values` runs the network over the ``[*B, T]`` steps flattened, at most
  ``chunk_size`` rows per call, which caps the activations' memory;
* :func:`shifted_values` runs it once over each trajectory's ``T + 1`` observations (the
  ``T`` observations of the rollout and the last step's next observation) instead of twice
  over ``2 T`` (the observations and the next observations): ``value[t] = v[t]`` and
  ``next_value[t] = v[t + 1]``. Where step ``t`` is done, ``v[t + 1]`` is the next episode's
  first value, not ``V(s_{t+1})``: a terminated step needs none (its next value is masked),
  a truncated one gets its own forward over its next observation (a few rows).
"""

from __future__ import annotations

from typing import Callable

import torch
from tensordict import TensorDictBase
from torch import Tensor

from ..keys import NEXT

__all__ = ["chunked_values", "shifted_values", "without_nan"]


def without_nan(td: TensorDictBase) -> TensorDictBase:
    """A copy of ``td`` whose float NaNs are 0: the rebuilt next observations of a compact
    batch are NaN where unknown, and a NaN input poisons the weight gradients of the rows the
    targets mask out (``0 * NaN``), so a differentiable run feeds the network zeros there."""
    return td.apply(lambda x: x.masked_fill(torch.isnan(x), 0) if x.is_floating_point() else x)


def _run(net: Callable, td: TensorDictBase) -> TensorDictBase:
    """``net(td)``; a network that writes in place and returns ``None`` leaves it in ``td``."""
    out = net(td)
    return td if out is None else out


def chunked_values(net: Callable[[TensorDictBase], TensorDictBase], td: TensorDictBase,
                   out_key, chunk_size: int | None = None) -> Tensor:
    """``net``'s ``out_key`` over every step of ``td``, shaped ``[*td.batch_size, ...]``.

    Args:
        net: a TensorDict module writing ``out_key``.
        td: the steps (any batch shape).
        out_key: the key the network writes (the state value).
        chunk_size: at most this many steps per call (``None``: one call on ``td`` itself,
            which then holds ``out_key``).

    Returns:
        The values, one per step of ``td``.
    """
    n = td.batch_size.numel()
    if chunk_size is None or n <= chunk_size:
        return _run(net, td).get(out_key)
    flat = td.reshape(-1)
    parts = [_run(net, flat[i:i + chunk_size]).get(out_key) for i in range(0, n, chunk_size)]
    out = torch.cat(parts, 0)
    return out.reshape(*td.batch_size, *out.shape[1:])


def shifted_values(net: Callable[[TensorDictBase], TensorDictBase], td: TensorDictBase,
                   in_keys: list, out_key, done: Tensor, terminated: Tensor,
                   chunk_size: int | None = None, nan_to_zero: bool = False) -> tuple[Tensor, Tensor]:
    """``(value, next_value)`` of a ``[*B, T]`` rollout from one pass over ``T + 1`` steps.

    Args:
        net: a TensorDict module reading ``in_keys`` and writing ``out_key``.
        td: the rollout; its root holds ``in_keys`` and its ``"next"`` too.
        in_keys: what the network reads.
        out_key: the key it writes.
        done, terminated: ``[*B, T, 1]`` bool flags of the steps.
        chunk_size: see :func:`chunked_values`.
        nan_to_zero: feed the network 0 where an input is NaN (:func:`without_nan`).

    Returns:
        ``value`` and ``next_value``, each ``[*B, T, ...]`` as the network writes them; the
        next value of a terminated step is 0 (the targets never read it).
    """
    nxt = td.get(NEXT)
    # the T observations and the last step's next one, along time
    steps = torch.cat([td.select(*in_keys), nxt[..., -1:].select(*in_keys)], td.batch_dims - 1)
    if nan_to_zero:
        steps = without_nan(steps)
    v = chunked_values(net, steps, out_key, chunk_size)
    dim, T = td.batch_dims - 1, td.batch_size[-1]
    value, next_value = v.narrow(dim, 0, T), v.narrow(dim, 1, T)

    def wide(mask: Tensor) -> Tensor:  # [*B, T] -> broadcastable against the values
        return mask.reshape(*mask.shape, *[1] * (next_value.dim() - mask.dim()))

    term = terminated.reshape(td.batch_size).bool()
    trunc = done.reshape(td.batch_size).bool() & ~term
    trunc[..., -1] = False  # the last step's next observation was in the pass
    if bool(trunc.any()):  # the real next observation of a truncation: its own forward
        fill = torch.zeros_like(next_value)
        rows = nxt[trunc].select(*in_keys)
        fill[trunc] = chunked_values(net, without_nan(rows) if nan_to_zero else rows, out_key,
                                     chunk_size)
        next_value = torch.where(wide(trunc), fill, next_value)
    return value, next_value.masked_fill(wide(term), 0.0)
