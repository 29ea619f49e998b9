"""Gymnasium wrappers: :class:`GymWrapper` (an env object) and :class:`GymEnv` (an env id).

Single envs get ``batch_size=()``; Gymnasium vector envs (``SyncVectorEnv``,
``AsyncVectorEnv``, ``gym.make_vec``) get ``batch_size=(num_envs,)``. Spaces map to specs as
in TorchRL 0.14 (``Box`` -> ``Bounded``/``Unbounded`` with the space's dtype, a 0-d ``Box``
gets shape ``(1,)``; ``Discrete`` -> ``OneHot`` (int64), or ``Categorical`` with
``categorical_action_encoding=True``; ``MultiDiscrete`` -> ``MultiCategorical``;
``MultiBinary`` -> ``Binary``; ``Dict`` -> nested ``Composite``). ``terminated`` and
``truncated`` are kept apart; ``done = terminated | truncated``.

Vector-env autoreset (Gymnasium 1.x) is handled so that no transition is lost or made up:

* ``SAME_STEP``: ``step`` returns the reset observation of finished sub-envs; the wrapper
  puts the true final observation (``info["final_obs"]``) under ``"next"`` and keeps the reset
  observation for the following partial ``reset``, which then costs nothing.
* ``NEXT_STEP`` / ``DISABLED``: the partial ``reset`` calls
  ``env.reset(options={"reset_mask": mask})``, which resets only the finished sub-envs and
  cancels the pending autoreset, so the next ``step`` is a real transition.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch
from tensordict import TensorDictBase

from tdrl.core.td_access import get_entry, new_td, plain_td_maker

from .._optional import missing_message
from ..keys import ACTION, DONE, OBSERVATION, REWARD, TERMINATED, TRUNCATED
from ..specs import Composite, OneHot, TensorSpec, unbatched_spec
from ._fastpath import RowSlab
from .common import RESET_KEY, EnvBase
from .gym_info import InfoReader
from .gym_spaces import action_converter, obs_converter, require_gymnasium, gym_space_to_spec

__all__ = ["GymWrapper", "GymEnv", "gym_space_to_spec", "make_gym"]


def make_gym(env_id: str, make: Callable | None = None, **kwargs):
    """``gymnasium.make(env_id, **kwargs)`` (or ``make``, e.g. ``gym.make_vec``), as a user of
    any Gymnasium package expects it to find the id:

    * an id in an unknown namespace (``MinAtar/Breakout-v1``) registers the plugins that
      packages declare under the ``gymnasium.envs`` entry point for that namespace (Gymnasium
      before 1.0 loaded them on import; MinAtar, ALE and others still declare them), then
      Gymnasium-Robotics' tasks when that package is installed, and tries again;
    * a simulator Gymnasium lacks (MuJoCo) names the extra to install.
    """
    gym = require_gymnasium()
    make = make or gym.make
    try:
        try:
            return make(env_id, **kwargs)
        except (gym.error.NamespaceNotFound, gym.error.NameNotFound):
            if not register_plugins(gym, env_id):
                raise
            return make(env_id, **kwargs)
    except gym.error.DependencyNotInstalled as exc:
        if "mujoco" not in str(exc).lower():
            raise
        raise ModuleNotFoundError(
            missing_message("mujoco", extra="mujoco", what=f"GymEnv({env_id!r})",
                            pip_name='"gymnasium[mujoco]"'),
            name="mujoco",
        ) from exc


def register_plugins(gym, env_id: str) -> bool:
    """Register the environments that installed packages offer for ``env_id``'s namespace
    (their ``gymnasium.envs`` entry points), or else Gymnasium-Robotics' tasks; ``True`` if
    any registration ran."""
    from importlib.metadata import entry_points

    namespace = env_id.split("/", 1)[0] if "/" in env_id else None
    ran = False
    for point in entry_points(group="gymnasium.envs"):
        if namespace is not None and point.name == namespace:
            point.load()()
            ran = True
    if not ran and importlib.util.find_spec("gymnasium_robotics"):
        import gymnasium_robotics

        gym.register_envs(gymnasium_robotics)
        ran = True
    return ran


class GymWrapper(EnvBase):
    """Wrap an existing Gymnasium env or vector env.

    Args:
        env: a ``gymnasium.Env`` or ``gymnasium.vector.VectorEnv``.
        categorical_action_encoding: ``Discrete`` spaces become ``Categorical`` (int index)
            instead of ``OneHot`` (TorchRL's default).
        device: device of the TensorDicts (the env itself runs on the CPU).
        check_actions: check actions against the spec at every step (shape, dtype,
            bounds; the error names the key, the spec and the value). Off by default.
        info_keys: numeric ``info`` entries to write into the TensorDicts: names (scalar
            float32 specs) or ``{name: TensorSpec}``; see :meth:`set_info_keys`.

    Step outputs are fresh tensors each step (rows of preallocated slabs for array
    observations, see :mod:`._fastpath`): a step's tensors never change when a later step
    runs. A single env's done flags are shared constant tensors: treat outputs as read-only.

    Example:
        >>> env = GymWrapper(gymnasium.make("Pendulum-v1"))
        >>> td = env.rollout(10)            # batch size (10,)
        >>> venv = GymWrapper(gymnasium.make_vec("CartPole-v1", 4))
        >>> venv.rollout(10).batch_size     # (4, 10)
    """

    def __init__(
        self,
        env,
        *,
        categorical_action_encoding: bool = False,
        device: torch.device | str = "cpu",
        check_actions: bool = False,
        info_keys: Sequence[str] | Mapping[str, TensorSpec] | None = None,
    ) -> None:
        gym = require_gymnasium()
        self._env = env
        self.is_vector = isinstance(env, gym.vector.VectorEnv)
        batch = (env.num_envs,) if self.is_vector else ()
        super().__init__(batch_size=batch, device=device, check_actions=check_actions)
        obs_space = env.single_observation_space if self.is_vector else env.observation_space
        act_space = env.single_action_space if self.is_vector else env.action_space
        obs_spec = gym_space_to_spec(obs_space, batch, self.device, categorical_action_encoding)
        self.observation_spec = obs_spec
        act_spec = gym_space_to_spec(act_space, batch, self.device, categorical_action_encoding)
        if isinstance(act_spec, Composite):
            self.full_action_spec = Composite({ACTION: act_spec}, shape=batch, device=self.device)
        else:
            self.action_spec = act_spec
        self._obs_is_dict = isinstance(obs_spec, Composite)
        self._obs_conv = obs_converter(obs_spec, len(batch))
        self._single_obs_conv = None  # one sub-env's observation (SAME_STEP final obs)
        if self.is_vector:
            self._single_obs_conv = obs_converter(unbatched_spec(obs_spec), 0)
        self._act_conv = action_converter(self.action_spec if not isinstance(act_spec, Composite)
                                           else act_spec)
        if isinstance(act_space, gym.spaces.Box) and act_space.shape == ():
            # a 0-d Box is exposed as shape (1,) (TorchRL's convention): give gym its shape back
            conv, target = self._act_conv, (*batch, *act_space.shape)
            self._act_conv = lambda a: conv(a).reshape(target)
        self._pending_seed: int | list[int] | None = None
        self._stash: dict | None = None
        self.autoreset_mode = None
        if self.is_vector:
            mode = env.metadata.get("autoreset_mode", gym.vector.AutoresetMode.NEXT_STEP)
            self.autoreset_mode = gym.vector.AutoresetMode(mode)
            self._same_step = self.autoreset_mode == gym.vector.AutoresetMode.SAME_STEP
        self._plain_cpu = self.device.type == "cpu" and not self._obs_is_dict
        false, true = torch.zeros((1,), dtype=torch.bool), torch.ones((1,), dtype=torch.bool)
        self._flag_cache = {
            (te, tr): (true if te or tr else false, true if te else false, true if tr else false)
            for te in (False, True) for tr in (False, True)
        }
        self._make_td = plain_td_maker(self.batch_size, self.device)
        self._gym_obs_spec = obs_spec
        self._info_reader: InfoReader | None = None
        self._slab: RowSlab | None = None
        # whether any sub-env was done at the last step (read by the Collector: a Python
        # bool saves it a tensor reduction per step)
        self._last_any_done: bool | None = None
        self._build_fast_path()
        if info_keys:
            self.set_info_keys(info_keys)

    def _build_fast_path(self) -> None:
        """Pick the step implementation: row slabs for array observations on the CPU."""
        spec = self._gym_obs_spec
        n = self.batch_size
        if not self._plain_cpu or isinstance(spec, OneHot):
            self._slab = None
            self._step_impl = self._step_vector_generic if self.is_vector else self._step_generic
            return
        shapes = {OBSERVATION: tuple(spec.shape), REWARD: (*n, 1)}
        dtypes = {OBSERVATION: spec.dtype, REWARD: torch.float32}
        if self.is_vector:  # a single env's done flags come from _flag_cache instead
            for key in (DONE, TERMINATED, TRUNCATED):
                shapes[key], dtypes[key] = (*n, 1), torch.bool
        self._slab = RowSlab(shapes, dtypes)
        self._step_impl = self._step_vector_slab if self.is_vector else self._step_slab

    def set_info_keys(self, info_keys: Sequence[str] | Mapping[str, TensorSpec] | None) -> None:
        """Write chosen numeric ``info`` entries into the TensorDicts (see :mod:`.gym_info`).

        Args:
            info_keys: names (each a scalar float32 per env, as TorchRL's default info
                reader) or a mapping ``{name: TensorSpec}``; ``None`` or empty removes them.
                The entries join ``observation_spec`` and are written at the root by
                ``reset`` and under ``"next"`` by ``step``; missing entries are zeros.
        """
        old = self._info_reader
        if old is not None:
            for key in old.specs:
                del self._observation_spec[key]
        self._info_reader = None
        if not info_keys:
            return
        reader = InfoReader(info_keys, self.batch_size, self.device, self.is_vector)
        clash = [k for k in reader.specs if k in self._observation_spec.keys()]
        if clash or any(k in (REWARD, DONE, TERMINATED, TRUNCATED, ACTION) for k in reader.specs):
            raise ValueError(f"info_keys {sorted(reader.specs)} collide with existing keys "
                             f"{clash or [REWARD, DONE, TERMINATED, TRUNCATED, ACTION]}.")
        for key, spec in reader.specs.items():
            self._observation_spec[key] = spec
        self._info_reader = reader

    @property
    def info_keys(self) -> list[str]:
        """The ``info`` entries written into the TensorDicts (``set_info_keys``)."""
        return [] if self._info_reader is None else list(self._info_reader.specs)

    @property
    def env(self):
        """The wrapped Gymnasium env."""
        return self._env

    # ------------------------------------------------------------------ conversions
    def _convert_obs(self, obs) -> dict:
        out = self._obs_conv(obs)
        return out if self._obs_is_dict else {OBSERVATION: out}

    def _put(self, source: dict) -> TensorDictBase:
        dev = self.device
        if dev.type != "cpu":
            source = {k: v.to(dev, non_blocking=True) if isinstance(v, torch.Tensor) else v
                      for k, v in source.items()}
        for k, v in source.items():
            if isinstance(v, dict):
                source[k] = new_td(v, self.batch_size, dev)
        return new_td(source, self.batch_size, dev)

    # ------------------------------------------------------------------ EnvBase
    def _reset(self, tensordict: TensorDictBase | None, **kwargs) -> TensorDictBase:
        mask = None if tensordict is None else tensordict.get(RESET_KEY, None)
        return self._put(self._reset_source(mask, **kwargs))

    def _dict_reset(self) -> Callable[[dict], dict] | None:
        """``_reset`` on plain dicts (see :meth:`EnvBase._dict_reset`), where :meth:`dict_stepper`
        serves (array observations on the CPU, no info keys)."""
        if type(self)._reset is not GymWrapper._reset or self.dict_stepper() is None:
            return None
        return lambda root: self._reset_source(root.get(RESET_KEY))

    def _reset_source(self, mask: torch.Tensor | None, **kwargs) -> dict:
        """``_reset`` before the TensorDict is built: ``{key: tensor}`` of what it produces."""
        if mask is not None and self.is_vector and self._pending_seed is None:
            # A partial reset (or all sub-envs done at once): never reset twice a sub-env
            # that Gymnasium already reset (SAME_STEP stash), so RNG streams stay aligned.
            mask_np = mask.reshape(self.batch_size).cpu().numpy().astype(np.bool_)
            stash = self._stash
            if stash is not None and bool(np.all(stash["mask"][mask_np])):
                obs = {k: _clone_nested(v) for k, v in stash["obs"].items()}
                stash["mask"] = stash["mask"] & ~mask_np
                if not stash["mask"].any():
                    self._stash = None
                return obs
            obs, info = self._env.reset(options={"reset_mask": mask_np})
            if self._stash is not None:
                self._stash["mask"] = self._stash["mask"] & ~mask_np
            return self._with_info(self._convert_obs(obs), info)
        seed, self._pending_seed = self._pending_seed, None
        seed = kwargs.pop("seed", seed)  # reset(seed=s), as Gymnasium's reset takes it, is set_seed(s) + reset()
        obs, info = self._env.reset(seed=seed, **kwargs)
        self._stash = None
        return self._with_info(self._convert_obs(obs), info)

    def _with_info(self, source: dict, info, done=None) -> dict:
        if self._info_reader is not None:
            self._info_reader.read(info, source, done)
        return source

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        action = get_entry(tensordict, ACTION)
        return self._step_impl(self._env.step(self._act_conv(action)))

    @property
    def last_any_done(self) -> bool | None:
        """Whether any sub-env was done at the last step (``None`` before the first one)."""
        return self._last_any_done

    def dict_stepper(self) -> Callable[[dict], tuple[dict, bool | None]] | None:
        """``step`` on plain dicts (see :meth:`EnvBase.dict_stepper`) for array observations
        on the CPU without info keys or action checks; ``None`` otherwise."""
        key = (self.check_actions, self._info_reader, self._slab, self._step_impl)
        cached = self.__dict__.get("_stepper_cache")
        if cached is not None and cached[0] == key:
            return cached[1]
        stepper = self._new_dict_stepper()
        self.__dict__["_stepper_cache"] = (key, stepper)
        return stepper

    def _new_dict_stepper(self) -> Callable[[dict], tuple[dict, bool | None]] | None:
        impl = getattr(self._step_impl, "__func__", None)
        if (self.check_actions or self._info_reader is not None or self._slab is None
                or impl not in (GymWrapper._step_slab, GymWrapper._step_vector_slab)
                or type(self).step is not EnvBase.step or type(self)._step is not GymWrapper._step):
            return None
        source = self._step_slab_source if impl is GymWrapper._step_slab else self._step_vector_slab_source
        gym_step, act_conv = self._env.step, self._act_conv

        def stepper(root: dict) -> tuple[dict, bool | None]:
            nxt = source(gym_step(act_conv(root[ACTION])))
            return nxt, self._last_any_done

        return stepper

    def _step_slab(self, out: tuple) -> TensorDictBase:
        """Single env, array observation, CPU: outputs written into slab rows."""
        return self._make_td(self._step_slab_source(out))

    def _step_slab_source(self, out: tuple) -> dict:
        """``_step_slab`` before the TensorDict is built: ``{key: tensor}`` of the ``"next"``
        content (the Collector's single-env loop keeps plain dicts until its final stack)."""
        obs, reward, terminated, truncated, info = out
        slab = self._slab
        i = slab.take()
        views = slab.views
        try:
            slab.np[OBSERVATION][i] = obs
            slab.scalars[REWARD][i] = reward
        except (ValueError, TypeError) as err:
            raise self._output_error(obs, reward, err) from None
        # Done flags of a single env come from a small cache of constant tensors (no
        # allocation per step); like every env output, treat them as read-only.
        terminated, truncated = bool(terminated), bool(truncated)
        self._last_any_done = terminated or truncated
        done, term, trunc = self._flag_cache[terminated, truncated]
        source = {OBSERVATION: views[OBSERVATION][i], REWARD: views[REWARD][i], DONE: done,
                  TERMINATED: term, TRUNCATED: trunc}
        if self._info_reader is not None:
            self._info_reader.read(info, source)
        return source

    def _step_vector_slab(self, out: tuple) -> TensorDictBase:
        """Vector env, array observation, CPU: outputs written into slab rows."""
        return self._make_td(self._step_vector_slab_source(out))

    def _step_vector_slab_source(self, out: tuple) -> dict:
        """``_step_vector_slab`` before the TensorDict is built (see ``_step_slab_source``)."""
        obs, reward, terminated, truncated, info = out
        slab = self._slab
        i = slab.take()
        arrays, views = slab.np, slab.views
        term = np.asarray(terminated, dtype=np.bool_)
        trunc = np.asarray(truncated, dtype=np.bool_)
        done = term | trunc
        try:
            arrays[OBSERVATION][i] = obs
            arrays[REWARD][i, :, 0] = reward
        except (ValueError, TypeError) as err:
            raise self._output_error(obs, reward, err) from None
        arrays[DONE][i, :, 0] = done
        arrays[TERMINATED][i, :, 0] = term
        arrays[TRUNCATED][i, :, 0] = trunc
        source = {OBSERVATION: views[OBSERVATION][i], REWARD: views[REWARD][i],
                  DONE: views[DONE][i], TERMINATED: views[TERMINATED][i],
                  TRUNCATED: views[TRUNCATED][i]}
        return self._vector_finish_source(source, info, done)

    def _step_generic(self, out: tuple) -> TensorDictBase:
        """Single env with dict / one-hot observations, or a non-CPU device."""
        obs, reward, terminated, truncated, info = out
        terminated, truncated = bool(terminated), bool(truncated)
        self._last_any_done = terminated or truncated
        done, term, trunc = self._flag_cache[terminated, truncated]
        source = self._convert_obs(obs)
        source.update({REWARD: torch.from_numpy(np.array((reward,), dtype=np.float32)),
                       DONE: done, TERMINATED: term, TRUNCATED: trunc})
        return self._put(self._with_info(source, info))

    def _step_vector_generic(self, out: tuple) -> TensorDictBase:
        obs, reward, terminated, truncated, info = out
        term = np.asarray(terminated, dtype=np.bool_)
        trunc = np.asarray(truncated, dtype=np.bool_)
        done = term | trunc
        source = self._convert_obs(obs)
        source[REWARD] = torch.from_numpy(np.asarray(reward, dtype=np.float32).reshape(-1, 1))
        source[DONE] = torch.from_numpy(done.reshape(-1, 1))
        source[TERMINATED] = torch.from_numpy(term.reshape(-1, 1).copy())
        source[TRUNCATED] = torch.from_numpy(trunc.reshape(-1, 1).copy())
        return self._vector_finish(source, info, done)

    def _vector_finish(self, source: dict, info: dict, done: np.ndarray) -> TensorDictBase:
        source = self._vector_finish_source(source, info, done)
        if self._slab is not None:
            return self._make_td(source)
        return self._put(source)

    def _vector_finish_source(self, source: dict, info: dict, done: np.ndarray) -> dict:
        """Final observations of finished sub-envs (SAME_STEP) and info entries."""
        any_done = self._last_any_done = bool(done.any())
        if self._same_step and any_done:
            source = self._swap_final_obs(source, info, done)
        if self._info_reader is not None:
            self._info_reader.read(info, source, done if any_done else None)
        return source

    def _output_error(self, obs, reward, err: Exception) -> Exception:
        spec = self._gym_obs_spec
        return ValueError(
            f"{self!r}: the Gymnasium env returned an observation of shape "
            f"{np.shape(obs)} (dtype {getattr(obs, 'dtype', type(obs).__name__)}) and a reward "
            f"of shape {np.shape(reward)}; the observation spec {spec!r} expects shape "
            f"{tuple(spec.shape)} and the reward one float per env ({err})."
        )

    def _swap_final_obs(self, source: dict, info: dict, done: np.ndarray) -> dict:
        """SAME_STEP: put the final obs of finished sub-envs under next, stash the reset obs."""
        stash_obs = {k: _clone_nested(v) for k, v in source.items() if k not in _NEXT_ONLY}
        if self._info_reader is not None:  # values of the reset Gymnasium already did
            self._info_reader.read(info, stash_obs)
        self._stash = {"obs": stash_obs, "mask": done.copy()}
        final, has_final = info.get("final_obs"), info.get("_final_obs")
        if final is None:
            raise RuntimeError("SAME_STEP vector env did not return info['final_obs'].")
        for i in np.nonzero(done)[0]:
            if has_final is not None and not has_final[i]:
                continue
            row = self._single_obs_conv(final[i])
            row = row if self._obs_is_dict else {OBSERVATION: row}
            _write_row(source, row, int(i))
        return source

    def set_sub_env_seeds(self, seeds: list[int]) -> None:
        """Seed every sub-env on its own (the next reset starts from ``seeds[i]`` in sub-env
        ``i``), e.g. the seed-major blocks of :func:`tdrl.core.train.seeds.block_seeds`."""
        n = self.batch_size[0] if self.is_vector else 1
        if len(seeds) != n:
            raise ValueError(f"GymEnv.set_sub_env_seeds: {len(seeds)} seeds for {n} sub-envs.")
        self._pending_seed = [int(s) for s in seeds] if self.is_vector else int(seeds[0])
        self._seeded = True

    def _set_seed(self, seed: int) -> int:
        self._pending_seed = seed
        try:
            self._env.action_space.seed(seed)
        except Exception:  # noqa: BLE001 - seeding the action space is a courtesy
            pass
        return seed + (self.batch_size[0] if self.is_vector else 1)

    def _close(self) -> None:
        self._env.close()


_NEXT_ONLY = (REWARD, DONE, TERMINATED, TRUNCATED)


def _clone_nested(v):
    return {k: _clone_nested(x) for k, x in v.items()} if isinstance(v, dict) else v.clone()


def _write_row(dst: dict, row: dict, i: int) -> None:
    for k, v in row.items():
        if isinstance(v, dict):
            _write_row(dst[k], v, i)
        else:
            dst[k][i] = v


class GymEnv(GymWrapper):
    """Build a Gymnasium env from its id and wrap it.

    Args:
        env_id: e.g. ``"Pendulum-v1"``, ``"CartPole-v1"``, ``"HalfCheetah-v5"``.
        num_envs: if given, a Gymnasium vector env of that many sub-envs
            (``batch_size=(num_envs,)``).
        vectorization_mode: ``"sync"`` or ``"async"`` (vector envs only).
        autoreset_mode: Gymnasium autoreset mode of the vector env (default ``"SameStep"``;
            all modes are handled correctly).
        categorical_action_encoding, device, check_actions, info_keys: see
            :class:`GymWrapper` (e.g. ``info_keys=("x_position",)`` on MuJoCo tasks).
        from_pixels: add the rendered frame as ``"pixels"`` (``uint8 [H, W, 3]``, Gymnasium's
            ``AddRenderObservation`` with ``render_mode="rgb_array"``), as TorchRL's ``GymEnv``.
        pixels_only: with ``from_pixels``: only ``"pixels"`` (default, TorchRL's); ``False``
            keeps the state as ``"observation"`` beside it (no effect without ``from_pixels``).
        **kwargs: passed to ``gymnasium.make`` / ``gymnasium.make_vec``.
    """

    def __init__(
        self,
        env_id: str,
        *,
        num_envs: int | None = None,
        vectorization_mode: str = "sync",
        autoreset_mode: str = "SameStep",
        categorical_action_encoding: bool = False,
        device: torch.device | str = "cpu",
        check_actions: bool = False,
        info_keys: Sequence[str] | Mapping[str, TensorSpec] | None = None,
        from_pixels: bool = False,
        pixels_only: bool = True,
        **kwargs,
    ) -> None:
        if num_envs is not None and (isinstance(num_envs, bool) or not isinstance(num_envs, int)
                                     or num_envs < 1):
            raise ValueError(f"GymEnv({env_id!r}): num_envs must be an int >= 1 (or None for a "
                             f"single env), got {num_envs!r}.")
        gym = require_gymnasium()
        self.env_id = env_id
        wrappers = []
        if from_pixels:  # Gymnasium's own render-as-observation wrapper: "pixels" (H, W, 3) uint8
            if kwargs.setdefault("render_mode", "rgb_array") != "rgb_array":
                raise ValueError(f"GymEnv({env_id!r}, from_pixels=True) renders with render_mode='rgb_array', "
                                 f"got render_mode={kwargs['render_mode']!r}")
            wrappers.append(lambda e: gym.wrappers.AddRenderObservation(e, render_only=False, obs_key=OBSERVATION))
            if pixels_only:
                wrappers.append(lambda e: gym.wrappers.FilterObservation(e, ["pixels"]))
        self.from_pixels = from_pixels
        if num_envs is None:
            env = make_gym(env_id, **kwargs)
            for wrap in wrappers:
                env = wrap(env)
        else:
            env = make_gym(
                env_id,
                gym.make_vec,
                num_envs=num_envs,
                vectorization_mode=vectorization_mode,
                vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode(autoreset_mode)},
                **({"wrappers": wrappers} if wrappers else {}),
                **kwargs,
            )
        super().__init__(
            env,
            categorical_action_encoding=categorical_action_encoding,
            device=device,
            check_actions=check_actions,
            info_keys=info_keys,
        )

    def __repr__(self) -> str:
        return f"GymEnv({self.env_id!r}, batch_size={tuple(self.batch_size)}, device={self.device})"
