"""Gymnasium spaces as tdrl specs, and the converters between Gymnasium's numpy values and
tensors (observations in, actions out), used by :mod:`.gym` and :mod:`.envpool`."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from ..specs import (
    Binary,
    Bounded,
    Categorical,
    Composite,
    MultiCategorical,
    OneHot,
    Unbounded,
)
from .._optional import require

__all__ = ["gym_space_to_spec"]


def require_gymnasium():
    return require("gymnasium", extra="gym", what="GymEnv", pip_name='"gymnasium[classic-control]"')


_NP_TO_TORCH = {
    np.dtype(np.float16): torch.float16,
    np.dtype(np.float32): torch.float32,
    np.dtype(np.float64): torch.float64,
    np.dtype(np.int8): torch.int8,
    np.dtype(np.int16): torch.int16,
    np.dtype(np.int32): torch.int32,
    np.dtype(np.int64): torch.int64,
    np.dtype(np.uint8): torch.uint8,
    np.dtype(np.bool_): torch.bool,
}


def _torch_dtype(np_dtype) -> torch.dtype:
    try:
        return _NP_TO_TORCH[np.dtype(np_dtype)]
    except KeyError:
        raise TypeError(f"Unsupported numpy dtype {np_dtype} in a Gymnasium space.") from None


def gym_space_to_spec(space, batch=(), device=None, categorical_action_encoding: bool = False):
    """Map a Gymnasium space to a tdrl spec of shape ``(*batch, *space_shape)``.

    Args:
        space: a ``gymnasium.spaces`` instance (Box, Discrete, MultiDiscrete, MultiBinary, Dict).
        batch: leading batch dims (``(num_envs,)`` for vector envs).
        device: spec device.
        categorical_action_encoding: ``Discrete`` -> ``Categorical`` instead of ``OneHot``.
    """
    gym = require_gymnasium()
    sp = gym.spaces
    batch = tuple(batch)
    if isinstance(space, sp.Box):
        dtype = _torch_dtype(space.dtype)
        shape = space.shape or (1,)
        low = torch.as_tensor(np.asarray(space.low)).reshape(shape).to(dtype)
        high = torch.as_tensor(np.asarray(space.high)).reshape(shape).to(dtype)
        if dtype.is_floating_point and bool(torch.isinf(low).all()) and bool(torch.isinf(high).all()):
            return Unbounded((*batch, *shape), device, dtype)
        return Bounded(low.expand(*batch, *shape), high.expand(*batch, *shape), (*batch, *shape),
                       device, dtype)
    if isinstance(space, sp.Discrete):
        if space.start != 0:
            raise NotImplementedError("Discrete spaces with start != 0 are not supported.")
        if categorical_action_encoding:
            return Categorical(int(space.n), batch, device, _torch_dtype(space.dtype))
        return OneHot(int(space.n), (*batch, int(space.n)), device, _torch_dtype(space.dtype))
    if isinstance(space, sp.MultiDiscrete):
        nvec = torch.as_tensor(space.nvec)
        return MultiCategorical(nvec.expand(*batch, *nvec.shape), (*batch, *nvec.shape), device,
                                _torch_dtype(space.dtype))
    if isinstance(space, sp.MultiBinary):
        shape = (space.n,) if isinstance(space.n, int | np.integer) else tuple(space.n)
        return Binary(shape[-1], (*batch, *shape), device, _torch_dtype(space.dtype))
    if isinstance(space, sp.Dict):
        return Composite(
            {k: gym_space_to_spec(v, batch, device, categorical_action_encoding)
             for k, v in space.spaces.items()},
            shape=batch,
            device=device,
        )
    raise NotImplementedError(f"Gymnasium space {type(space).__name__} is not supported yet.")


def obs_converter(spec, batch_ndim: int) -> Callable:
    """A function numpy observation -> a new tensor matching ``spec`` (no checks)."""
    if isinstance(spec, Composite):
        convs = {k: obs_converter(v, batch_ndim) for k, v in spec.items()}
        return lambda obs: {k: c(obs[k]) for k, c in convs.items()}
    dtype, shape = spec.dtype, spec.shape
    if isinstance(spec, OneHot):
        n = spec.n
        return lambda obs: torch.nn.functional.one_hot(torch.as_tensor(obs).long(), n).to(dtype)

    def conv(obs):
        # a copy: an env may return the same array every step and mutate it in place
        t = torch.from_numpy(np.array(obs)) if isinstance(obs, np.ndarray) else torch.as_tensor(obs)
        if t.dtype != dtype:
            t = t.to(dtype)
        if t.shape != shape:
            t = t.reshape(shape)
        return t

    return conv


def action_converter(spec) -> Callable:
    """A function action tensor -> what ``gym_env.step`` expects."""
    if isinstance(spec, Composite):
        convs = {k: action_converter(v) for k, v in spec.items()}
        return lambda td: {k: c(td.get(k)) for k, c in convs.items()}
    if isinstance(spec, OneHot):
        return one_hot_to_index(spec, single=spec.ndim == 1)
    if isinstance(spec, Categorical):
        if spec.ndim == 0:
            return lambda a: int(a)
        return to_numpy

    return to_numpy


def one_hot_to_index(spec: OneHot, single: bool = False) -> Callable[[torch.Tensor], np.ndarray | int]:
    """The converter of a ``OneHot`` action spec: a one-hot ``(*batch, n)`` -> its index
    (``(*batch,)`` numpy, or an ``int`` with ``single``), after checking the action's shape.

    An index handed to a ``OneHot`` env would otherwise be read by ``argmax`` as action 0 at
    every step (a policy that cannot learn, and no error); it is refused instead, naming the fix.
    """
    shape = tuple(spec.shape)

    def conv(a: torch.Tensor):
        if tuple(a.shape) != shape:
            raise ValueError(one_hot_refusal(spec, a))
        idx = to_numpy(a).argmax(-1)
        return int(idx) if single else idx

    return conv


def one_hot_refusal(spec: OneHot, action) -> str:
    """What an env with a ``OneHot`` action spec says to an action of another shape."""
    shape = tuple(getattr(action, "shape", ()))
    dtype = getattr(action, "dtype", type(action).__name__)
    what = ("an index (an int action, e.g. QValueModule's default)"
            if shape == tuple(spec.shape[:-1]) else "not a one-hot of the spec's shape")
    return (f"the action has shape {shape} and dtype {dtype}, but the env's action spec is "
            f"OneHot(n={spec.n}) of shape {tuple(spec.shape)}: {what}; read by argmax it would "
            f"be action 0 at every step. Write one-hot actions (QValueModule(spec=env.action_spec) "
            f"or QValueActor(net, spec=env.action_spec); OneHot.encode(index) for a hand-made "
            f"action), or build the env with categorical_action_encoding=True to step it with "
            f"integer indices.")


def to_numpy(a: torch.Tensor) -> np.ndarray:
    try:
        return a.numpy()  # CPU tensor without grad: a zero-copy view
    except (RuntimeError, TypeError):  # requires grad, or not on the CPU
        return a.detach().cpu().numpy()
