"""Brax: batched JAX physics environments as a tdrl env, tensors passed through DLPack.

:class:`BraxEnv` holds ``num_envs`` copies of a Brax environment
(``brax.envs.get_environment(name, backend=...)``) vectorised with ``jax.vmap`` and stepped by
one jitted function; ``batch_size=(num_envs,)``. Each step's outputs are one packed uint8
array (the bytes of observation and reward, one byte per done flag). On an accelerator it
crosses from JAX to torch with ``torch.from_dlpack`` (no copy) and actions the other way with
``jax.dlpack.from_dlpack``; on the CPU both go through numpy, which is faster there: the
action as the numpy view of the torch tensor, the packed outputs copied into a fresh row of a
preallocated slab whose torch views (observation, reward, flags) were made when the slab was
(one copy and no torch call per step; a row is never reused). The Brax ``State`` is held as
its leaves packed into one array per dtype (its flax dataclass costs Python callbacks on
every jitted call, and every array argument costs the dispatch) and donated to each call;
:attr:`BraxEnv.state` rebuilds it. Keys, shapes and dtypes follow the data contract of
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

from tdrl.core.td_access import entries, get_entry, plain_td_maker

from .._optional import require
from ..keys import ACTION, DONE, NEXT, OBSERVATION, REWARD, TERMINATED, TRUNCATED
from ..specs import Bounded, Composite, Unbounded
from ._fastpath import RowSlab, merge_reset_rows
from .common import RESET_KEY, EnvBase, step_mdp
from .seeding import seed_from_torch

__all__ = ["BraxEnv"]

BACKENDS = ("generalized", "positional", "spring", "mjx")
_SLAB_BYTES = 1 << 18  # at most this many bytes per _OutSlab (and at most 256 rows)


def _require_brax():
    return require("brax", extra="brax", what="BraxEnv")


@lru_cache(maxsize=None)
def _compiled(name: str, backend: str, num_envs: int, episode_length: int, action_repeat: int):
    """The vectorised env and its jitted functions, built once per configuration.

    Returns ``(env, treedef, packer, reset, step, partial_reset, step_and_reset)``. The
    functions take and return the batched Brax ``State`` as a short list of arrays, its
    leaves packed by :class:`_StatePacker` (one ``[B, n]`` array per dtype; ``treedef`` and
    ``packer.unpack`` rebuild the state): Brax's ``State`` is a flax dataclass whose flatten
    and unflatten run Python callbacks on every jitted call, for the input and the output,
    and each array argument and result costs XLA's CPU dispatch time (29 leaves at
    inverted_pendulum, 48 at ant; packed, the jitted step at inverted_pendulum, 8 sub-envs,
    went from ~355 to ~250 us), where one array a dtype costs neither; the tree is rebuilt
    inside the trace. The packed state is donated to each call (XLA writes the new state
    into the old one's buffers: ~40 us a step less at inverted_pendulum, 8 sub-envs, in one CPU run):

    - ``reset(key) -> (key, leaves)`` (the first reset);
    - ``step(leaves, action) -> (leaves, packed outputs)``;
    - ``partial_reset(key, mask, leaves) -> (key, leaves)`` (fresh states for the masked
      sub-envs, the others kept; the key is split inside: one dispatch per reset, where an
      eager ``jax.random.split`` and separate reset and select calls took three);
    - ``step_and_reset(key, leaves, action) -> (key, leaves, packed)``.
    """
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

    def fresh_state(key):
        key, sub = jax.random.split(key)
        return key, strong(env.reset(jax.random.split(sub, num_envs)))

    shapes = jax.eval_shape(fresh_state, jax.random.PRNGKey(0))[1]
    treedef = jax.tree.structure(shapes)
    obs_leaf = jax.tree.unflatten(treedef, list(range(treedef.num_leaves))).obs
    packer = _StatePacker(jax.tree.leaves(shapes), num_envs, obs_leaf)

    def unflatten(flat):
        return jax.tree.unflatten(treedef, packer.unpack(flat))

    def leaves(state):
        return packer.pack(jax.tree.leaves(state))

    def fresh(key):
        key, state = fresh_state(key)
        return key, leaves(state)

    def outputs(state):
        # the step's outputs as one uint8 array [B, 4 * (D + 2)]: the bytes of observation and
        # reward (float32), then done, terminated, truncated (one byte each, 0 / 1: a bool
        # view) and any(done) over the batch (every row): one copy into a row of _OutSlab,
        # whose torch views are ready, instead of a split and five conversions per step
        done = state.done > 0
        truncated = (state.info["truncation"] > 0) & done
        values = jnp.concatenate([state.obs, state.reward[:, None]], -1).astype(jnp.float32)
        flags = jnp.stack([done, done & ~truncated, truncated,
                           jnp.broadcast_to(done.any(), done.shape)], -1).astype(jnp.uint8)
        return jnp.concatenate([_bytes(values), flags], -1)

    def _bytes(x):
        return jax.lax.bitcast_convert_type(x, jnp.uint8).reshape(x.shape[0], -1)

    def step(flat, action):
        state = strong(env.step(unflatten(flat), action))
        return leaves(state), outputs(state)

    def select(key, mask, state):
        key, new = fresh_state(key)

        def where(new, old):
            return jnp.where(mask.reshape(mask.shape + (1,) * (new.ndim - 1)), new, old)

        return key, jax.tree.map(where, new, state)

    def partial_reset(key, mask, flat):
        key, state = select(key, mask, unflatten(flat))
        return key, leaves(state)

    def step_and_reset(key, flat, action):
        # step, then (only if a sub-env is done) the partial reset of the done ones, in one
        # call: the same keys and states as step() then reset(mask=done); the packed outputs
        # gain the bytes of the next root's observation and its (False) done flags
        # [B, 4 * (D + 2) + 4 * D + 4]
        state = strong(env.step(unflatten(flat), action))
        packed = outputs(state)
        done = state.done > 0
        key, root = jax.lax.cond(done.any(), lambda k, s: select(k, done, s),
                                 lambda k, s: (k, s), key, state)
        zeros = jnp.zeros((num_envs, 4), jnp.uint8)  # the next root's done flags (and a pad byte)
        return key, leaves(root), jnp.concatenate([packed, _bytes(root.obs.astype(jnp.float32)), zeros], -1)

    return (env, treedef, packer, jax.jit(fresh), jax.jit(step, donate_argnums=0),
            jax.jit(partial_reset, donate_argnums=2), jax.jit(step_and_reset, donate_argnums=1))


class _StatePacker:
    """The batched state's leaves as a few arrays: the leaves with the leading batch
    dimension, flattened to ``[B, n]`` and concatenated, one array per dtype (in order of
    first appearance), then any other leaf as it is.

    Args:
        specs: the leaves' shapes and dtypes (``jax.ShapeDtypeStruct``), in tree order.
        num_envs: the batch size ``B``.
        obs_leaf: the index of the observation among the leaves.
    """

    def __init__(self, specs: list, num_envs: int, obs_leaf: int) -> None:
        self.shapes = [tuple(x.shape) for x in specs]
        groups: dict = {}
        odd = []
        for i, (shape, x) in enumerate(zip(self.shapes, specs, strict=True)):
            (groups.setdefault(x.dtype, []) if shape[:1] == (num_envs,) else odd).append(i)
        self.groups, self.odd, self.num_envs = list(groups.values()), odd, num_envs
        self.where: dict[int, tuple] = {}  # leaf -> (array, first column, end column or None)
        for pos, idx in enumerate(self.groups):
            col = 0
            for i in idx:
                width = int(np.prod(self.shapes[i][1:], dtype=np.int64))
                self.where[i] = (pos, col, col + width)
                col += width
        for pos, i in enumerate(odd, len(self.groups)):
            self.where[i] = (pos, 0, None)
        self.obs_leaf = obs_leaf

    def pack(self, leaves: list) -> list:
        """Leaves -> packed arrays (traced inside the jitted functions)."""
        import jax.numpy as jnp

        b = self.num_envs
        return [jnp.concatenate([leaves[i].reshape(b, -1) for i in idx], -1) if len(idx) > 1
                else leaves[idx[0]].reshape(b, -1) for idx in self.groups] + [leaves[i] for i in self.odd]

    def unpack(self, flat: list) -> list:
        """Packed arrays -> leaves (inside a trace, or eagerly for :attr:`BraxEnv.state`)."""
        out = [None] * len(self.shapes)
        for i, (pos, lo, hi) in self.where.items():
            out[i] = flat[pos] if hi is None else flat[pos][:, lo:hi].reshape(self.shapes[i])
        return out

    def observation(self, flat: list) -> np.ndarray:
        """The observation leaf of a computed CPU state, copied out as a numpy array."""
        pos, lo, hi = self.where[self.obs_leaf]
        array = np.asarray(flat[pos])
        return np.array(array if hi is None else array[:, lo:hi].reshape(self.shapes[self.obs_leaf]))


def _unpack(raw: torch.Tensor, dim: int, root: bool) -> tuple:
    """Views of packed step outputs (``raw``: uint8 ``[..., B, 4 * (D + 2) (+ 4 * D)]``, the
    layout of ``_compiled``'s ``outputs``): ``(observation, reward, done, terminated,
    truncated)`` plus, if ``root``, the next root's observation and done, terminated,
    truncated (all False); no copy."""
    values, flags = raw.view(torch.float32), raw.view(torch.bool)
    at = 4 * (dim + 1)
    out = (values[..., :dim], values[..., dim:dim + 1], flags[..., at:at + 1],
           flags[..., at + 1:at + 2], flags[..., at + 2:at + 3])
    if not root:
        return out
    at = 4 * (2 * dim + 2)
    return out + (values[..., dim + 2:2 * dim + 2], flags[..., at:at + 1], flags[..., at + 1:at + 2],
                  flags[..., at + 2:at + 3])


def _host_view(array) -> np.ndarray:
    """A single-device CPU JAX array's buffer as a read-only numpy array, once computed: the
    C++ method behind ``np.asarray(array)``, called directly (``np.asarray`` goes through
    ``__array__`` and ``_value``: several Python frames, each costing several
    microseconds right after XLA ran); ``np.asarray`` if this JAX lacks it."""
    try:
        return array._single_device_array_to_np_array_did_copy()[0]
    except AttributeError:
        return np.asarray(array)


class _OutSlab(RowSlab):
    """A :class:`~tdrl.core.envs._fastpath.RowSlab` of packed CPU step outputs: each step
    copies its packed array into a fresh row (one numpy assignment) and hands out that row's
    torch views (see :func:`_unpack`), made for every row at once when a slab is allocated.
    A row is never reused, so a returned tensor never changes when a later step runs."""

    def __init__(self, batch: int, width: int, dim: int, root: bool) -> None:
        super().__init__({"packed": (batch, width)}, {"packed": torch.uint8},
                         rows=max(1, min(256, _SLAB_BYTES // (batch * width))))
        self.dim, self.root = dim, root
        self._any_at = 4 * (dim + 1) + 3
        self.any_done = None  # whether any sub-env was done at the last put()

    def _refill(self) -> None:
        super()._refill()
        buf = torch.from_numpy(self.np["packed"])
        self._unpacked = list(zip(*(v.unbind(0) for v in _unpack(buf, self.dim, self.root))))

    def put(self, packed) -> tuple:
        """Copy ``packed`` (a JAX array ``[B, width]`` uint8) into a fresh row; its views."""
        i = self.take()
        row = self.np["packed"][i]
        row[...] = _host_view(packed)
        self.any_done = bool(row[0, self._any_at])
        return self._unpacked[i]


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
        (env, self._treedef, self._packer, self._reset_fn, self._step_fn, self._partial_reset_fn,
         self._step_reset_fn) = _compiled(env_name, backend, num_envs, episode_length, action_repeat)
        if not isinstance(env.observation_size, int):
            raise NotImplementedError(
                f"BraxEnv({env_name!r}): dict observations ({env.observation_size}) are not "
                "supported yet (array observations only).")
        if seed is None:
            seed = seed_from_torch()
        self._seeded = True
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
        self._root_parts = None  # the fused step's next-root observation and flags, if any was done
        self._last_any_done = None
        width = 4 * (self._obs_dim + 2)
        self._slab = _OutSlab(num_envs, width, self._obs_dim, root=False)
        self._slab_root = _OutSlab(num_envs, width + 4 * self._obs_dim + 4, self._obs_dim, root=True)
        self._leaves = None  # the batched Brax State, its leaves packed (see _compiled)

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

    def _observation(self) -> torch.Tensor:
        """The current state's observation as a torch tensor (a copy on the CPU)."""
        if self._jax_device.platform == "cpu":
            t = torch.from_numpy(self._packer.observation(self._leaves))
            return t if t.device == self.device else t.to(self.device)
        return self._torch(self._packer.unpack(self._leaves)[self._packer.obs_leaf])

    def _jax_array(self, tensor: torch.Tensor):
        """``tensor`` (float32) as an argument of the jitted functions. On the CPU the numpy
        view itself (jit takes it as an uncommitted array, as the reset's state is: a
        committed one, as DLPack gives, would compile the step again; and it is a tenth of
        ``jnp.asarray``'s cost); elsewhere through DLPack, committed to JAX's device as the
        state is."""
        try:  # the common case (a CPU float32 tensor without grad) in as few calls as possible
            array = tensor.numpy()
        except (RuntimeError, TypeError):  # needs grad, or not on the CPU
            array = None
        if array is not None and array.dtype == np.float32:
            return array
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
        if self._leaves is not None:  # a full reset is a partial one of every row: no new compile
            mask = (torch.ones(self.num_envs, dtype=torch.bool) if mask is None
                    else mask.reshape(self.num_envs))
            self._key, self._leaves = self._partial_reset_fn(
                self._key, self._jax_array(mask.to(torch.float32)) > 0.5, self._leaves)
        else:
            self._key, leaves = self._reset_fn(self._key)
            self._leaves = self._placed(leaves)
        return self._make_td({OBSERVATION: self._observation()})

    def reset(self, tensordict: TensorDictBase | None = None, **kwargs) -> TensorDictBase:
        """:meth:`EnvBase.reset`; a partial reset of a flat CPU TensorDict (what
        ``step_and_maybe_reset`` and the collectors pass) builds its output from the root's
        entries directly (:func:`~tdrl.core.envs._fastpath.merge_reset_rows`: the same
        values as the generic merge, a fraction of its tensor ops)."""
        mask = None
        if (tensordict is not None and not kwargs and type(tensordict) is TensorDict
                and self._leaves is not None and self.device.type == "cpu"
                and self._jax_device.platform == "cpu"):
            src = entries(tensordict)
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
        self._key, self._leaves = self._partial_reset_fn(self._key, mask_np, self._leaves)
        return self._make_td(merge_reset_rows(
            src, ~mask_np.reshape(self.num_envs, 1), self._observation(), self._false,
            RESET_KEY, (DONE, TERMINATED, TRUNCATED)))

    def step_and_maybe_reset(self, tensordict: TensorDictBase) -> tuple[TensorDictBase, TensorDictBase]:
        """:meth:`EnvBase.step_and_maybe_reset` with the step and the reset of the done
        sub-envs in one jitted call (CPU; the same data as a step then a reset). For a plain,
        unlocked TensorDict without a ``"next"`` entry and no action check, the next root is
        built from the step's dict directly (as :class:`~tdrl.core.envs.EnvPoolEnv` does): the
        step's entries but the reward, with the done sub-envs' fresh observations; its done
        flags are all False (a sub-env was not done, or it was reset)."""
        if (type(self).step is not EnvBase.step or type(tensordict) is not TensorDict
                or self.device.type != "cpu" or self._jax_device.platform != "cpu"):
            return super().step_and_maybe_reset(tensordict)
        src = entries(tensordict)
        if (not self.check_actions and NEXT not in src and not tensordict.is_locked
                and type(self)._step is BraxEnv._step):
            action = src.get(ACTION)
            if action is None:
                action = tensordict.get(ACTION)  # raises the usual KeyError
            nxt = self._step_source(action, True)
            src[NEXT] = self._make_td(nxt)
            root = {k: v for k, v in nxt.items() if k != REWARD}
            if self._root_parts is not None:
                root[OBSERVATION], root[DONE], root[TERMINATED], root[TRUNCATED] = self._root_parts
                self._root_parts = None
            return tensordict, self._make_td(root)
        self._fuse_reset, self._root_parts = True, None
        try:
            tensordict = self.step(tensordict)
        finally:
            self._fuse_reset = False
        root, self._root_parts = self._root_parts, None
        next_root = step_mdp(tensordict, self.reward_keys)
        if root is not None:
            src = entries(next_root)
            keep = ~src[DONE].numpy()
            next_root = self._make_td(merge_reset_rows(
                src, keep, root[0], self._false, RESET_KEY, (DONE, TERMINATED, TRUNCATED)))
        return tensordict, next_root

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        action = get_entry(tensordict, ACTION)
        return self._make_td(self._step_source(action, self._fuse_reset))

    def _step_source(self, action: torch.Tensor, fused: bool) -> dict:
        """One step -> the ``"next"`` content as ``{key: tensor}``; ``fused`` (CPU only):
        also reset the sub-envs that are done, their fresh observations and (False) flags in
        ``self._root_parts`` (None if no sub-env was done)."""
        if self._leaves is None:
            raise RuntimeError(f"{self!r}: call reset() before the first step.")
        action = self._jax_array(action)
        if fused:
            self._key, self._leaves, packed = self._step_reset_fn(self._key, self._leaves, action)
        else:
            self._leaves, packed = self._step_fn(self._leaves, action)
        if self._jax_device.platform == "cpu":
            slab = self._slab_root if fused else self._slab
            parts = slab.put(packed)
            any_done = slab.any_done
            if self.device.type != "cpu":
                parts = tuple(x.to(self.device) for x in parts)
        else:
            raw = self._torch(packed)
            parts = _unpack(raw, self._obs_dim, fused)
            any_done = bool(raw[0, 4 * (self._obs_dim + 1) + 3])
        self._last_any_done = any_done
        if fused and any_done:
            self._root_parts = parts[5:]
        return {OBSERVATION: parts[0], REWARD: parts[1], DONE: parts[2], TERMINATED: parts[3],
                TRUNCATED: parts[4]}

    def dict_stepper(self):
        """``step`` on plain dicts (see :meth:`EnvBase.dict_stepper`) without action checks;
        ``None`` otherwise."""
        if self.check_actions or type(self).step is not EnvBase.step or type(self)._step is not BraxEnv._step:
            return None
        source = self._step_source

        def stepper(root: dict) -> tuple[dict, bool | None]:
            return source(root[ACTION], False), self._last_any_done

        return stepper

    @property
    def last_any_done(self) -> bool | None:
        """Whether any sub-env was done at the last step (None before the first)."""
        return self._last_any_done

    def _set_seed(self, seed: int) -> int:
        self._key = self._jax.random.PRNGKey(seed)
        return seed + 1

    @property
    def state(self):
        """The current batched Brax ``State`` (a JAX pytree), or None before the first reset.

        Rebuilt from the packed arrays the env holds (see ``_compiled``): a snapshot, which
        later steps do not change."""
        if self._leaves is None:
            return None
        return self._jax.tree.unflatten(self._treedef, self._packer.unpack(self._leaves))

    def __repr__(self) -> str:
        return (f"BraxEnv({self.env_name!r}, num_envs={self.num_envs}, backend={self.backend!r}, "
                f"device={self.device})")
