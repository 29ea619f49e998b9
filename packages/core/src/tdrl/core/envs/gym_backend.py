"""TorchRL's ``set_gym_backend``: which Gym library ``GymEnv`` builds its envs with. tdrl's
``GymEnv`` runs Gymnasium only, so ``set_gym_backend("gymnasium")`` (or the module) is accepted
as a context manager / decorator that changes nothing, and the old ``gym`` package is refused
with the fix named."""

from __future__ import annotations

import contextlib
from typing import Any

__all__ = ["set_gym_backend"]


@contextlib.contextmanager
def _unchanged():
    yield


def set_gym_backend(backend: Any):
    """A context manager (or decorator) for ``backend`` ``"gymnasium"`` or the ``gymnasium``
    module; ``"gym"`` raises ``ValueError``: tdrl's ``GymEnv`` builds Gymnasium envs."""
    name = backend if isinstance(backend, str) else getattr(backend, "__name__", repr(backend))
    if name != "gymnasium":
        raise ValueError(f"set_gym_backend({name!r}): tdrl's GymEnv runs Gymnasium only; use "
                         "'gymnasium' (the old gym API is not supported: port the env to Gymnasium).")
    return _unchanged()
