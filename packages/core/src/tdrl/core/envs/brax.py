"""Brax: batched JAX physics environments as a tdrl env, tensors passed through DLPack.

:class:`BraxEnv` holds ``num_envs`` copies of a Brax environment
(``brax.envs.get_environment(name, backend=...)``) vectorised with ``jax.vmap`` and stepped by
one jitted function; ``batch_size=(num_envs,)``. On an accelerator, observations, rewards
and flags cross from JAX to torch with ``torch.from_dlpack`` (no copy) and actions the other
way with ``jax.dlpack.from_dlpack``; on the CPU both go through numpy, which is faster there
(each step's outputs are one packed array, copied once). Keys, shapes and dtypes follow the data contract of
:class:`~tdrl.core.envs.GymEnv`: ``"observation"`` ``(num_envs, D)`` float32, ``"action"``
``(num_envs, A)`` in ``[-1, 1]``, ``"reward"`` ``(num_envs, 1)`` (summed over
``action_repeat``), ``"terminated"`` when the physics says the episode ended, ``"truncated"``
at ``episode_length`` steps (Brax's ``EpisodeWrapper`` counts them; a step that both ends
and hits the limit is ``terminated``).

Resets are tdrl's, not Brax's ``AutoResetWrapper``: a partial reset (a ``"_reset"`` mask, as
``step_and_maybe_reset`` and the collectors pass) draws fresh states for the masked
sub-envs only, inside one jitted function, so every ``step`` is a real transition.

Seeding: the env holds a JAX PRNG key; every reset splits it into one key per sub-env.
``set_seed(s)`` sets the key to ``PRNGKey(s)``.

Compilation: the jitted reset / step / partial reset are built once per (environment,
backend, ``num_envs``, ``episode_length``, ``action_repeat``) in a process and shared by
every ``BraxEnv`` of that configuration; the first reset and step compile (seconds to tens
of seconds on a CPU). JAX's CPU threads: set ``XLA_FLAGS`` (e.g.
``--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1``) before the first
``import jax``.

Needs the ``brax`` extra (``pip install "packages/core[brax]"``).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from .._optional import require
from ..keys import ACTION, DONE, OBSERVATION, REWARD, TERMINATED, TRUNCATED
from ..specs import Bounded, Composite, Unbounded
from ._fastpath import merge_reset_rows, plain_td_maker
from .common import RESET_KEY, EnvBase, step_mdp

__all__ = ["BraxEnv"]

BACKENDS = ("generalized", "positional", "spring", "mjx")


def _require_brax():
    return require("brax", extra="brax", what="BraxEnv")


@lru_cache(maxsize=None)
def _compiled(name: str, backend: str, num_envs: int, episode_length: int, action_repeat: int):
    """The vectorised env and its jitted functions, built once per configuration:
    ``reset(key) -> (key, state)`` (the first reset), ``step(state, action) -> (state, packed
    outputs)`` and ``partial_reset(key, mask, state) -> (key, state)`` (fresh states for the
    masked sub-envs, the others kept). The key is split inside: one dispatch per reset, where
    an eager ``jax.random.split`` and separate reset and select calls took three, each
    flattening the whole state tree (a partial reset cost about four steps before)."""
    _require_brax()
    import jax
    import jax.numpy as jnp
    from brax import envs
    from brax.envs.wrappers.training import EpisodeWrapper, VmapWrapper

    env = VmapWrapper(EpisodeWrapper(envs.get_environment(name, backend=backend),
                                     episode_length, action_repeat))  # fmt: skip

    def strong(state):
        # reset builds some leaves from Python scalars (weakly typed); step returns them
        # strongly typed: without this the step compiles twice (once per kind of state)
        return jax.tree.map(lambda x: jax.lax.convert_element_type(x, x.dtype), state)

    def fresh(key):
        key, sub = jax.random.split(key)
        return key, strong(env.reset(jax.random.split(sub, num_envs)))

    def outputs(state):
        # one float32 array [B, D + 4] (observation, reward, done, terminated, truncated):
        # one DLPack hand-over per step instead of five
        done = state.done > 0
        truncated = (state.info["truncation"] > 0) & done
        flags = jnp.stack([done, done & ~truncated, truncated], -1).astype(state.obs.dtype)
        return jnp.concatenate([state.obs, state.reward[:, None], flags], -1)

    def step(state, action):
        state = strong(env.step(state, action))
        return state, outputs(state)

    def partial_reset(key, mask, state):
        key, new = fresh(key)

        def where(new, old):
            return jnp.where(mask.reshape(mask.shape + (1,) * (new.ndim - 1)), new, old)

        return key, jax.tree.map(where, new, state)

    def step_and_reset(key, state, action):
        # step, then (only if a sub-env is done) the partial reset of the done ones, in one
        # call: the same keys and states as step() then reset(mask=done); the packed outputs
        # gain the next root's observation [B, D + 4 + D]
        state = strong(env.step(state, action))
        packed = outputs(state)
        done = state.done > 0
        key, root = jax.lax.cond(done.any(), lambda k, s: partial_reset(k, done, s),
                                 lambda k, s: (k, s), key, state)
        return key, root, jnp.concatenate([packed, root.obs], -1)

    return (env, jax.jit(fresh), jax.jit(step), jax.jit(partial_reset),
            jax.jit(step_and_reset))


class BraxEnv(EnvBase):
    """``num_envs`` Brax environments, vectorised and jitted, as one tdrl env.

    Args:
        env_name: a Brax environment (``brax.envs._envs``: ``"ant"``, ``"halfcheetah"``,
            ``"hopper"``, ``"inverted_pendulum"``, ``"reacher"``, ...).
        num_envs: number of sub-envs; ``batch_size=(num_envs,)``.
        backend: Brax's physics pipeline: ``"generalized"``, ``"positional"``, ``"spring"``
            (fastest to compile and step on a CPU) or ``"mjx"``.
        episode_length: steps before ``truncated`` (Brax's ``EpisodeWrapper``).
        action_repeat: physics steps per action (rewards summed).
        seed: seed of the PRNG key; ``None`` draws one from torch's default generator.
        device: device of the TensorDicts (the arrays come from JAX's default device).
        check_actions: check actions against the spec at every step.

    Example:
        >>> env = BraxEnv("inverted_pendulum", num_envs=8, backend="spring")
        >>> env.rollout(10, break_when_any_done=False).batch_size   # (8, 10)
    """

    def __init__(
        self,
        env_name: str,
        num_envs: int,
        *,
        backend: str = "spring",
        episode_length: int = 1000,
        action_repeat: int = 1,
        seed: int | None = None,
        device: torch.device | str = "cpu",
        check_actions: bool = False,
    ) -> None:
        for arg, value in (("num_envs", num_envs), ("episode_length", episode_length),
                           ("action_repeat", action_repeat)):  # fmt: skip
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"BraxEnv({env_name!r}): {arg} must be an int >= 1, got {value!r}.")
        if backend not in BACKENDS:
            raise ValueError(f"BraxEnv({env_name!r}): backend must be one of {BACKENDS}, got {backend!r}.")
        _require_brax()
        from brax import envs

        known = sorted(envs._envs)
        if env_name not in known:
            raise ValueError(f"BraxEnv: Brax has no environment {env_name!r}; known: {known}.")
        super().__init__(batch_size=(num_envs,), device=device, check_actions=check_actions)
        import jax

        self._jax, self._jnp = jax, jax.numpy
        self._jax_device = jax.devices()[0]
        self.env_name, self.backend, self.num_envs = env_name, backend, num_envs
        self.episode_length, self.action_repeat = episode_length, action_repeat
        env, self._reset_fn, self._step_fn, self._partial_reset_fn, self._step_reset_fn = _compiled(
            env_name, backend, num_envs, episode_length, action_repeat
        )
        if not isinstance(env.observation_size, int):
            raise NotImplementedError(
                f"BraxEnv({env_name!r}): dict observations ({env.observation_size}) are not "
                "supported yet (array observations only).")
        if seed is None:
            seed = int(torch.randint(0, 2**31 - 1, ()).item())
        self._key = jax.random.PRNGKey(seed)
        batch = self.batch_size
        self.observation_spec = Composite(
            {OBSERVATION: Unbounded((*batch, env.observation_size), device=self.device)},
            shape=batch,
        )
        self.action_spec = Bounded(-1.0, 1.0, (*batch, env.action_size), device=self.device)
        self._obs_dim = env.observation_size
        self._make_td = plain_td_maker(batch, self.device)
        self._false = torch.zeros((num_envs, 1), dtype=torch.bool)  # read-only
        self._fuse_reset = False  # set by step_and_maybe_reset around its step()
        self._root_obs = None  # the fused step's next-root observation (numpy), if any was done
        self._state = None

    # ------------------------------------------------------------------ conversions
    def _torch(self, array) -> torch.Tensor:
        """A JAX array as a torch tensor: on the CPU, once computed, copied out through numpy
        (measured here: DLPack's export of a pending result waits far longer than
        ``block_until_ready``, and numpy's view of a JAX array is read-only); elsewhere
        through DLPack on the same device."""
        if self._jax_device.platform == "cpu":
            array.block_until_ready()
            t = torch.from_numpy(np.array(array))
        else:
            t = torch.from_dlpack(array)
        return t if t.device == self.device else t.to(self.device)

    def _jax_array(self, tensor: torch.Tensor):
        """``tensor`` (float32) as an argument of the jitted functions. On the CPU the numpy
        view itself (jit takes it as an uncommitted array, as the reset's state is: a
        committed one, as DLPack gives, would compile the step again; and it is a tenth of
        ``jnp.asarray``'s cost); elsewhere through DLPack, committed to JAX's device as the
        state is."""
        tensor = tensor.detach()
        if tensor.dtype != torch.float32:
            tensor = tensor.float()
        if tensor.device.type == "cpu":
            return tensor.numpy()
        return self._jax.device_put(self._jax.dlpack.from_dlpack(tensor.contiguous()), self._jax_device)

    def _placed(self, state):
        """On an accelerator, the state committed to JAX's device (as the actions are)."""
        return state if self._jax_device.platform == "cpu" else self._jax.device_put(state, self._jax_device)

    # ------------------------------------------------------------------ EnvBase
    def _reset(self, tensordict: TensorDictBase | None, **kwargs) -> TensorDictBase:
        if kwargs:
            raise TypeError(f"BraxEnv.reset takes no keyword arguments, got {sorted(kwargs)}.")
        mask = None if tensordict is None else tensordict.get(RESET_KEY, None)
        if self._state is not None:  # a full reset is a partial one of every row: no new compile
            mask = (torch.ones(self.num_envs, dtype=torch.bool) if mask is None
                    else mask.reshape(self.num_envs))
            self._key, self._state = self._partial_reset_fn(
                self._key, self._jax_array(mask.to(torch.float32)) > 0.5, self._state)
        else:
            self._key, state = self._reset_fn(self._key)
            self._state = self._placed(state)
        return self._make_td({OBSERVATION: self._torch(self._state.obs)})

    def reset(self, tensordict: TensorDictBase | None = None, **kwargs) -> TensorDictBase:
        """:meth:`EnvBase.reset`; a partial reset of a flat CPU TensorDict (what
        ``step_and_maybe_reset`` and the collectors pass) builds its output from the root's
        entries directly (:func:`~tdrl.core.envs._fastpath.merge_reset_rows`: the same
        values as the generic merge, a fraction of its tensor ops)."""
        mask = None
        if (tensordict is not None and not kwargs and type(tensordict) is TensorDict
                and self._state is not None and self.device.type == "cpu"
                and self._jax_device.platform == "cpu"):
            src = tensordict._tensordict
            mask = src.get(RESET_KEY)
            if (mask is None or mask.dtype != torch.bool or mask.device.type != "cpu"
                    or any(isinstance(v, TensorDictBase) for v in src.values())):
                mask = None
        if mask is None:
            return super().reset(tensordict, **kwargs)
        self._assert_open()
        mask_np = mask.numpy().reshape(self.num_envs)
        if mask_np.all() or not mask_np.any():
            return super().reset(tensordict)
        self._key, self._state = self._partial_reset_fn(self._key, mask_np, self._state)
        return self._make_td(merge_reset_rows(
            src, ~mask_np.reshape(self.num_envs, 1), self._torch(self._state.obs), self._false,
            RESET_KEY, (DONE, TERMINATED, TRUNCATED)))

    def step_and_maybe_reset(self, tensordict: TensorDictBase) -> tuple[TensorDictBase, TensorDictBase]:
        """:meth:`EnvBase.step_and_maybe_reset` with the step and the reset of the done
        sub-envs in one jitted call (CPU; the same data as a step then a reset)."""
        if (type(self).step is not EnvBase.step or type(tensordict) is not TensorDict
                or self.device.type != "cpu" or self._jax_device.platform != "cpu"):
            return super().step_and_maybe_reset(tensordict)
        self._fuse_reset, self._root_obs = True, None
        try:
            tensordict = self.step(tensordict)
        finally:
            self._fuse_reset = False
        next_root = step_mdp(tensordict, self.reward_keys)
        if self._root_obs is not None:
            obs, self._root_obs = self._root_obs, None
            src = next_root._tensordict
            keep = ~src[DONE].numpy()
            next_root = self._make_td(merge_reset_rows(
                src, keep, torch.from_numpy(obs), self._false, RESET_KEY, (DONE, TERMINATED, TRUNCATED)))
        return tensordict, next_root

    def _split(self, packed) -> tuple:
        """``(observation, reward, done, terminated, truncated)`` views of a packed
        ``[B, D + 4 (+ D)]`` step output (numpy or torch)."""
        dim = self._obs_dim
        flags = packed[:, dim + 1:dim + 4] > 0.5
        return packed[:, :dim], packed[:, dim:dim + 1], flags[:, 0:1], flags[:, 1:2], flags[:, 2:3]

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        if self._state is None:
            raise RuntimeError(f"{self!r}: call reset() before the first step.")
        action = self._jax_array(tensordict.get(ACTION))
        if self._fuse_reset:  # CPU only (step_and_maybe_reset checks)
            self._key, self._state, packed = self._step_reset_fn(self._key, self._state, action)
        else:
            self._state, packed = self._step_fn(self._state, action)
        if self._jax_device.platform == "cpu":  # split in numpy: its views cost far less
            packed.block_until_ready()
            arr = np.array(packed)
            parts = self._split(arr)
            if self._fuse_reset and parts[2].any():
                self._root_obs = arr[:, self._obs_dim + 4:]
            parts = [torch.from_numpy(x) for x in parts]
            if self.device.type != "cpu":
                parts = [x.to(self.device) for x in parts]
        else:
            parts = self._split(self._torch(packed))
        return self._make_td(dict(zip((OBSERVATION, REWARD, DONE, TERMINATED, TRUNCATED), parts)))

    def _set_seed(self, seed: int) -> int:
        self._key = self._jax.random.PRNGKey(seed)
        return seed + 1

    @property
    def state(self):
        """The current batched Brax ``State`` (a JAX pytree), or None before the first reset."""
        return self._state

    def __repr__(self) -> str:
        return (f"BraxEnv({self.env_name!r}, num_envs={self.num_envs}, backend={self.backend!r}, "
                f"device={self.device})")
