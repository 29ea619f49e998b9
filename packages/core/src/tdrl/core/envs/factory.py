"""Environments by name, as the apps build them: ``make_env("CartPole-v1", num_envs=8)``.

A Gymnasium id gives a vectorised :class:`GymEnv`; ``tdrl/Pendulum`` the batched pure-torch
:class:`PendulumEnv`, whose whole state travels in the TensorDict (so a run on it resumes
bit-identically: :func:`env_rng_state` checkpoints its reset RNG); ``dmc/<domain>-<task>`` a
DeepMind Control :class:`DMControlEnv` (``dmc/cartpole-balance``; the ``dmc`` extra);
``brax/<name>`` a Brax :class:`~tdrl.core.envs.brax.BraxEnv` (``brax/ant``; the ``brax`` extra).
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Any

from tdrl.core.train.state import GeneratorState

from .common import EnvBase
from .gym import GymEnv, make_gym
from .pendulum import PendulumEnv

__all__ = ["make_env", "TORCH_ENVS", "env_rng_state", "action_kind", "EnvCreator"]

TORCH_ENVS = {"tdrl/Pendulum": PendulumEnv}
"""Batched pure-torch environments by id (``batch_size=(num_envs,)``)."""


def make_env(env_id: str, num_envs: int = 1, transforms: tuple = (), **gym_kwargs: Any) -> EnvBase:
    """The env ``env_id`` with ``num_envs`` sub-envs, wrapped in ``transforms`` (if any).

    Args:
        env_id: a Gymnasium id (``"HalfCheetah-v5"``), one of :data:`TORCH_ENVS`, or
            ``"dmc/<domain>-<task>"`` (a :class:`DMControlEnv`), or ``"brax/<name>"`` (a
            :class:`~tdrl.core.envs.brax.BraxEnv`, the ``brax`` extra).
        num_envs: batch size (Gymnasium: a vector env of that many copies).
        transforms: transforms applied in order (a :class:`TransformedEnv` over a ``Compose``).
        **gym_kwargs: passed to :class:`GymEnv` (e.g. ``categorical_action_encoding``,
            ``wrappers``), :class:`DMControlEnv` (``action_repeat``, ``pixels``, ...) or
            ``BraxEnv`` (``backend``, ``episode_length``, ...);
            ignored for the torch envs.

    Returns:
        The env (a :class:`TransformedEnv` when ``transforms`` is not empty).
    """
    if num_envs < 1:
        raise ValueError(f"make_env({env_id!r}): num_envs={num_envs} is not allowed: expected >= 1.")
    if env_id in TORCH_ENVS:
        base = TORCH_ENVS[env_id](batch_size=(num_envs,))
    elif env_id.startswith("dmc/"):
        from .dm_control import make_dmc

        base = make_dmc(env_id, num_envs, **gym_kwargs)
    elif env_id.startswith("brax/"):
        from .brax import BraxEnv

        base = BraxEnv(env_id[len("brax/"):], num_envs, **gym_kwargs)
    else:
        base = GymEnv(env_id, num_envs=num_envs, **gym_kwargs)
    if not transforms:
        return base
    from tdrl.core.transforms import Compose, TransformedEnv

    return TransformedEnv(base, Compose(*transforms))


@functools.lru_cache(maxsize=64)
def action_kind(env_id: str) -> str:
    """``"discrete"`` or ``"continuous"``: the kind of action ``env_id`` takes, found without a
    run (a Gymnasium env is made and closed, once per id). For a config to refuse an algorithm
    that cannot act in the env before any work or folder.

    Raises:
        ValueError: ``env_id`` names no environment (Gymnasium's message says why).
    """
    if env_id in TORCH_ENVS:
        from tdrl.core.specs import Categorical, OneHot

        spec = TORCH_ENVS[env_id](batch_size=(1,)).action_spec
        return "discrete" if isinstance(spec, (Categorical, OneHot)) else "continuous"
    if env_id.startswith(("dmc/", "brax/")):
        return "continuous"  # DeepMind Control and Brax act with bounded real vectors
    import gymnasium as gym

    try:
        env = make_gym(env_id)
    except Exception as err:  # noqa: BLE001 - gymnasium raises several types for a bad id
        hint = "" if importlib.util.find_spec("gymnasium_robotics") else (
            " (goal tasks such as PointMaze and Fetch need the goal extra: pip install \"packages/core[goal]\")")
        raise ValueError(f"env_id={env_id!r} does not make an environment: {type(err).__name__}: {err}{hint}") from None
    try:
        space = env.action_space
    finally:
        env.close()
    if isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)):
        return "discrete"
    return "continuous" if isinstance(space, gym.spaces.Box) else type(space).__name__


def env_rng_state(env: EnvBase) -> GeneratorState | None:
    """A checkpointable handle on the RNG of a pure-torch env (through transforms), or ``None``
    when the env's state cannot be checkpointed (Gymnasium simulators): then a resumed run
    must start fresh episodes."""
    base = getattr(env, "base_env", env)
    gen = getattr(base, "_generator", None)
    return GeneratorState(gen) if isinstance(base, tuple(TORCH_ENVS.values())) and gen is not None else None


class EnvCreator:
    """A picklable env factory (TorchRL's ``EnvCreator``): ``EnvCreator(fn, kwargs)()`` is
    ``fn(**kwargs)``, for a :class:`~tdrl.core.envs.ParallelEnv` or a multi-process collector
    that builds its envs in each worker.

    Unlike TorchRL's, it does not build an env up front nor share the transforms' statistics
    (a ``VecNorm``'s running moments) between the workers' envs through shared memory: each
    env keeps its own; gather them with ``state_dict`` where they must agree.

    Args:
        create_env_fn: a callable returning an :class:`EnvBase` (a module-level function or
            class, so that it pickles).
        create_env_kwargs: keyword arguments for it.
    """

    def __init__(self, create_env_fn, create_env_kwargs: dict | None = None) -> None:
        if not callable(create_env_fn):
            raise TypeError(f"EnvCreator: create_env_fn must be callable, got {type(create_env_fn).__name__}.")
        self.create_env_fn = create_env_fn
        self.create_env_kwargs = dict(create_env_kwargs or {})

    def __call__(self, **kwargs: Any) -> EnvBase:
        env = self.create_env_fn(**{**self.create_env_kwargs, **kwargs})
        if not isinstance(env, EnvBase):
            raise TypeError(f"EnvCreator: {self.create_env_fn!r} returned {type(env).__name__}, not an EnvBase.")
        return env

    def __repr__(self) -> str:
        return f"EnvCreator({self.create_env_fn!r}, {self.create_env_kwargs!r})"
