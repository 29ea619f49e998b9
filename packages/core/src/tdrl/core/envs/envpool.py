"""EnvPool: a batch of C++ environments stepped by a thread pool, as one tdrl env.

:class:`EnvPoolEnv` builds ``envpool.make(env_id, env_type="gymnasium", ...)`` in
synchronous mode (every ``step`` steps all ``num_envs`` sub-envs; results in env order) and
gives it ``batch_size=(num_envs,)``. Specs come from EnvPool's Gymnasium spaces through the
same mapping as :class:`~tdrl.core.envs.GymEnv` (``gym_space_to_spec``: ``Discrete`` ->
``OneHot`` or ``Categorical``, ``Box`` -> ``Bounded`` / ``Unbounded`` with the space's dtype).

Auto-reset. EnvPool resets a finished sub-env on the *next* ``step`` call (the action is
ignored and the step returns the reset observation with reward 0: a transition that never
happened). tdrl resets finished sub-envs itself (``step_and_maybe_reset``, the collectors):
the partial ``reset`` calls ``pool.reset(env_ids)``, which resets exactly those sub-envs and
cancels EnvPool's pending auto-reset, so every ``step`` is a real transition, as with
Gymnasium's ``NEXT_STEP`` mode in :mod:`.gym`. A ``step`` while a finished sub-env has not
been reset raises instead of recording EnvPool's made-up transition.

Speed. ``step`` and the partial reset call EnvPool's C++ methods directly where the pool
allows (:class:`_Channel`: EnvPool's own Python layer costs ~15-20 us a step, a third of a
CartPole step at 8 sub-envs), and ``step_and_maybe_reset`` builds the step's ``"next"``,
the next root and the reset of finished sub-envs in one pass. The numbers are in
``python -m benchmarks.envpool_step`` (tdrl against raw EnvPool's public API and against the same
loop on its C++ calls).

Seeding: EnvPool seeds sub-env ``i`` with ``seed + i`` when the pool is built, so
``set_seed(seed)`` rebuilds the pool at the next reset and returns ``seed + num_envs``.

Needs the ``envpool`` extra (``pip install "packages/core[envpool]"``).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from tdrl.core.td_access import entries, get_entry, plain_td_maker, set_entry

from .._optional import require
from ..keys import ACTION, DONE, NEXT, OBSERVATION, REWARD, TERMINATED, TRUNCATED
from ..specs import Composite, OneHot
from ._fastpath import merge_reset_rows
from .common import RESET_KEY, EnvBase, step_mdp
from .gym_spaces import gym_space_to_spec, one_hot_to_index, to_numpy
from .seeding import seed_from_torch

__all__ = ["EnvPoolEnv"]


def _require_envpool():
    return require("envpool", extra="envpool", what="EnvPoolEnv")


def _check_int(name: str, value, low: int, env_id: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
        raise ValueError(f"EnvPoolEnv({env_id!r}): {name} must be an int >= {low}, got {value!r}.")


@contextlib.contextmanager
def _quiet_spaces():
    """EnvPool builds float32 Boxes from float64 bounds; Gymnasium warns about each one."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*precision lowered by casting")
        yield


class _Channel:
    """A synchronous pool's step and partial reset as numpy calls.

    EnvPool's public ``step`` / ``reset(ids)`` wrap its C++ ``_send`` / ``_reset`` /
    ``_recv`` in a Python layer that, per call, rebuilds the config dict (twice), infers
    multi-player ids, casts the action and unflattens the state into a Gymnasium tuple:
    ~18 us of a ~45 us CartPole step at 8 sub-envs (envpool 1.2.5). For the pools that layer
    does nothing for (one player per env, the action one array, an ``obs`` array state) the
    channel calls the C++ methods with the arrays that layer would build (all env ids, the
    action cast to the spec's dtype, C order) and reads ``obs`` / ``reward`` / ``done`` /
    ``trunc`` / ``info:env_id`` from the state list, with ``terminated = done & ~trunc`` as
    EnvPool's Gymnasium layer computes it. Any other pool goes through the public methods.
    """

    def __init__(self, pool, num_envs: int, direct: bool = True) -> None:
        self.pool = pool
        self.direct = False
        if not direct:
            return
        try:
            keys = list(pool._state_keys)
            act_spec = pool._spec._action_spec
            ok = (list(pool._action_keys) == ["env_id", "players.env_id", "action"]
                  and pool.config.get("max_num_players", 1) == 1 and not pool.is_async
                  and {"obs", "reward", "done", "trunc", "info:env_id"} <= set(keys)
                  and not any(k.startswith("obs:") for k in keys)
                  and all(callable(getattr(pool, m, None)) for m in ("_send", "_recv", "_reset")))
        except (AttributeError, TypeError, IndexError):
            return
        if not ok:
            return
        self._send, self._recv, self._reset = pool._send, pool._recv, pool._reset
        self._ids = np.arange(num_envs, dtype=np.int32)
        self._act_dtype = np.dtype(act_spec[-1][0])
        act_shape = tuple(act_spec[-1][1])  # per-env shape, after a leading -1 if any
        self._act_shape = (num_envs, *(act_shape[1:] if act_shape[:1] == (-1,) else act_shape))
        self._i = {k: keys.index(k) for k in ("obs", "reward", "done", "trunc", "info:env_id")}
        self.direct = True

    def step(self, action: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(obs, reward, terminated, truncated)`` of one step of every sub-env."""
        if not self.direct:
            obs, reward, term, trunc, _ = self.pool.step(action)
            return obs, reward, term, trunc
        if action.shape != self._act_shape:
            raise ValueError(f"EnvPool action of shape {action.shape}, expected {self._act_shape}.")
        ids = self._ids
        self._send([ids, ids, action.astype(self._act_dtype, order="C")])
        s, i = self._recv(), self._i
        trunc = s[i["trunc"]]
        return s[i["obs"]], s[i["reward"]], s[i["done"]] & ~trunc, trunc

    def reset(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Reset sub-envs ``ids`` (int32): ``(obs rows, their env ids)``."""
        if not self.direct:
            rows, info = self.pool.reset(ids)
            return rows, np.asarray(info["env_id"])
        self._reset(ids)
        s, i = self._recv(), self._i
        return s[i["obs"]], s[i["info:env_id"]]


class EnvPoolEnv(EnvBase):
    """``num_envs`` EnvPool environments stepped by ``num_threads`` C++ threads.

    Args:
        env_id: an EnvPool task id (``envpool.list_all_envs()``), e.g. ``"CartPole-v1"``,
            ``"HalfCheetah-v5"``.
        num_envs: number of sub-envs; ``batch_size=(num_envs,)``.
        num_threads: EnvPool's worker threads (``None``: EnvPool's default, one per core up
            to ``num_envs``; benchmarks and tests here use 1).
        seed: seed of sub-env 0 (sub-env ``i`` gets ``seed + i``); ``None`` draws one from
            torch's default generator, so ``torch.manual_seed`` makes a run repeatable.
        categorical_action_encoding: ``Discrete`` actions become ``Categorical`` (an int
            index) instead of ``OneHot`` (TorchRL's default).
        device: device of the TensorDicts (EnvPool itself runs on the CPU).
        check_actions: check actions against the spec at every step.
        **kwargs: EnvPool task options passed to ``envpool.make`` (``max_episode_steps``,
            ``frame_skip``, ...).

    Step outputs are fresh tensors each step (EnvPool returns new arrays, which are wrapped
    without a copy).

    Example:
        >>> env = EnvPoolEnv("CartPole-v1", num_envs=8, num_threads=1)
        >>> env.rollout(10, break_when_any_done=False).batch_size   # (8, 10)
    """

    # step and partial reset through EnvPool's C++ calls where the pool allows (_Channel);
    # False: through its public step / reset (tests compare the two)
    _direct_channel = True

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        *,
        num_threads: int | None = None,
        seed: int | None = None,
        categorical_action_encoding: bool = False,
        device: torch.device | str = "cpu",
        check_actions: bool = False,
        **kwargs,
    ) -> None:
        _check_int("num_envs", num_envs, 1, env_id)
        if num_threads is not None:
            _check_int("num_threads", num_threads, 1, env_id)
        self._envpool = _require_envpool()
        if env_id not in self._envpool.list_all_envs():
            known = [e for e in self._envpool.list_all_envs() if env_id.split("-")[0].lower() in e.lower()]
            raise ValueError(f"EnvPoolEnv: EnvPool has no task {env_id!r}"
                             + (f"; similar ids: {known[:8]}" if known else "")
                             + " (envpool.list_all_envs() lists them all).")
        super().__init__(batch_size=(int(num_envs),), device=device, check_actions=check_actions)
        self.env_id = env_id
        self.num_envs = int(num_envs)
        self.num_threads = num_threads
        self._make_kwargs = kwargs
        self._seed = seed_from_torch(self.num_envs) if seed is None else int(seed)
        self._seeded = True
        self._pool = self._build(self._seed)
        self._chan = _Channel(self._pool, self.num_envs, self._direct_channel)
        batch = self.batch_size
        obs_space, act_space = self._pool.observation_space, self._pool.action_space
        obs_spec = gym_space_to_spec(obs_space, batch, self.device)
        if isinstance(obs_spec, Composite) or isinstance(obs_spec, OneHot):
            raise NotImplementedError(
                f"EnvPoolEnv({env_id!r}): observation space {obs_space} is not supported yet "
                "(array observations only).")
        act_spec = gym_space_to_spec(act_space, batch, self.device, categorical_action_encoding)
        if isinstance(act_spec, Composite):
            raise NotImplementedError(
                f"EnvPoolEnv({env_id!r}): dict action spaces are not supported yet ({act_space}).")
        self.observation_spec = obs_spec
        self.action_spec = act_spec
        self._obs_dtype = obs_spec.dtype
        self._obs_shape = tuple(obs_spec.shape)
        self._act_conv = self.action_converter(act_spec)
        self._make_td = plain_td_maker(batch, self.device)
        self._on_cpu = self.device.type == "cpu"
        self._pending_seed: int | None = None
        self._last_obs: np.ndarray | None = None
        self._unreset: np.ndarray | None = None  # sub-envs done at the last step, not reset yet
        self._last_any_done: bool | None = None
        self._false = torch.zeros((self.num_envs, 1), dtype=torch.bool)  # read-only
        self._env_ids = np.arange(self.num_envs, dtype=np.int32)

    # ------------------------------------------------------------------ pool
    def _build(self, seed: int):
        """A new synchronous pool seeded with ``seed`` (sub-env ``i``: ``seed + i``)."""
        extra = {} if self.num_threads is None else {"num_threads": self.num_threads}
        with _quiet_spaces():
            pool = self._envpool.make(
                self.env_id, env_type="gymnasium", num_envs=self.num_envs,
                batch_size=self.num_envs, seed=seed, **extra, **self._make_kwargs)
            pool.observation_space, pool.action_space  # noqa: B018 - built (and cached) here
        return pool

    @property
    def pool(self):
        """The wrapped EnvPool object."""
        return self._pool

    @staticmethod
    def action_converter(spec) -> Callable[[torch.Tensor], np.ndarray]:
        if isinstance(spec, OneHot):
            return one_hot_to_index(spec)  # refuses an index, naming the fix
        return to_numpy  # Categorical indices, Box arrays

    # ------------------------------------------------------------------ EnvBase
    def _reset_rows(self, mask_np: np.ndarray, prev_obs: np.ndarray) -> np.ndarray:
        """Reset the sub-envs in ``mask_np`` (some or all): ``prev_obs`` with their rows replaced."""
        obs_rows, env_ids = self._chan.reset(self._env_ids[mask_np])
        obs = prev_obs.copy()
        obs[env_ids] = obs_rows
        self._last_obs = obs
        if self._unreset is not None:
            self._unreset &= ~mask_np
            if not np.count_nonzero(self._unreset):
                self._unreset = None
        return obs

    def _reset(self, tensordict: TensorDictBase | None, **kwargs) -> TensorDictBase:
        if kwargs:
            raise TypeError(f"EnvPoolEnv.reset takes no keyword arguments, got {sorted(kwargs)}.")
        mask = None if tensordict is None else tensordict.get(RESET_KEY, None)
        if mask is not None and self._pending_seed is None and self._last_obs is not None:
            mask_np = mask.reshape(self.num_envs).cpu().numpy().astype(np.bool_)
            if not mask_np.all():
                obs = self._reset_rows(mask_np, self._last_obs)
                return self._out({OBSERVATION: self._obs_tensor(obs)})
        if self._pending_seed is not None:
            self._pool.close()
            self._seed, self._pending_seed = self._pending_seed, None
            self._pool = self._build(self._seed)
            self._chan = _Channel(self._pool, self.num_envs, self._direct_channel)
        obs, _ = self._pool.reset()
        self._last_obs = obs
        self._unreset = None
        return self._out({OBSERVATION: self._obs_tensor(obs)})

    def reset(self, tensordict: TensorDictBase | None = None, **kwargs) -> TensorDictBase:
        """:meth:`EnvBase.reset`; a partial reset of a flat CPU TensorDict (what
        ``step_and_maybe_reset`` and the collectors pass) is done here in numpy: same
        output (observation rows replaced, done flags of the reset rows cleared, the other
        entries carried over), a fraction of the tensor ops."""
        fast = (tensordict is not None and not kwargs and type(tensordict) is TensorDict
                and self._on_cpu and self._pending_seed is None and self._last_obs is not None)
        if fast:
            src = entries(tensordict)
            mask, prev = src.get(RESET_KEY), src.get(OBSERVATION)
            fast = (mask is not None and mask.dtype == torch.bool and mask.device.type == "cpu"
                    and prev is not None and tuple(prev.shape) == self._obs_shape
                    and prev.dtype == self._obs_dtype
                    and not any(isinstance(v, TensorDictBase) for v in src.values()))
        if not fast:
            return super().reset(tensordict, **kwargs)
        self._assert_open()
        out = self._reset_merged(src, mask, prev)
        return super().reset(tensordict) if out is None else self._make_td(out)

    def _reset_merged(self, src: dict, mask: torch.Tensor, prev: torch.Tensor) -> dict | None:
        """The partial reset of :meth:`reset` on the root's dict ``src``, in numpy; ``None``
        when every or no sub-env resets (the generic path does those)."""
        mask_np = mask.numpy().reshape(self.num_envs)
        if mask_np.all() or not mask_np.any():
            return None
        obs = self._reset_rows(mask_np, prev.numpy())
        return merge_reset_rows(src, ~mask_np.reshape(self.num_envs, 1), self._obs_tensor(obs),
                                self._false, RESET_KEY, (DONE, TERMINATED, TRUNCATED))

    def dict_resetter(self) -> Callable[[dict, torch.Tensor], dict] | None:
        """:meth:`EnvBase.dict_resetter`: the numpy partial reset of :meth:`reset` on the
        root's dict (other cases through :meth:`reset`); where :meth:`dict_stepper` serves."""
        if self.dict_stepper() is None or type(self).reset is not EnvPoolEnv.reset:
            return None

        def resetter(root: dict, mask: torch.Tensor) -> dict:
            prev = root.get(OBSERVATION)
            out = None
            if (self._pending_seed is None and self._last_obs is not None and mask.dtype == torch.bool
                    and prev is not None and tuple(prev.shape) == self._obs_shape and prev.dtype == self._obs_dtype):
                self._assert_open()
                out = self._reset_merged(root, mask, prev)
            if out is None:
                td = self.reset(self._make_td({**root, RESET_KEY: mask}))
                out = dict(entries(td))
            return out

        return resetter

    def step_and_maybe_reset(
        self, tensordict: TensorDictBase
    ) -> tuple[TensorDictBase, TensorDictBase]:
        """:meth:`EnvBase.step_and_maybe_reset` (same output). For a plain, unlocked CPU
        TensorDict without a ``"next"`` entry it is done in one pass: the step's dict, the
        next root from it (no ``step_mdp``) and the numpy reset of the finished sub-envs,
        whose done flags in the next root are all False (the mask is the done flag)."""
        if type(self).step is not EnvBase.step:
            return super().step_and_maybe_reset(tensordict)
        fused = (self._on_cpu and type(tensordict) is TensorDict and type(self)._step is EnvPoolEnv._step
                 and not tensordict.is_locked and NEXT not in entries(tensordict)
                 and self._pending_seed is None)
        if not fused:
            tensordict = self.step(tensordict)
            next_root = step_mdp(tensordict, self.reward_keys)
            if self._last_any_done:
                set_entry(next_root, RESET_KEY, next_root.get(DONE).clone())
                next_root = self.reset(next_root)
                if RESET_KEY in next_root.keys():
                    del next_root[RESET_KEY]
            return tensordict, next_root
        if self.check_actions:
            self._assert_actions(tensordict)
        src = entries(tensordict)
        action = src.get(ACTION)
        if action is None:
            action = tensordict.get(ACTION)  # raises the usual KeyError
        nxt = self._step_source(action)
        src[NEXT] = self._make_td(nxt)  # a plain unlocked TensorDict: its dict holds the entries
        root = {k: v for k, v in nxt.items() if k != REWARD}
        if self._last_any_done:
            done = self._unreset
            obs = self._reset_rows(done, self._last_obs)
            flags = np.zeros((3, self.num_envs, 1), dtype=np.bool_)
            root[OBSERVATION] = self._obs_tensor(obs)
            root[DONE], root[TERMINATED], root[TRUNCATED] = (
                torch.from_numpy(flags[0]), torch.from_numpy(flags[1]), torch.from_numpy(flags[2]))
        return tensordict, self._make_td(root)

    def _obs_tensor(self, obs: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(obs)
        return t if t.dtype == self._obs_dtype else t.to(self._obs_dtype)

    def _out(self, source: dict) -> TensorDictBase:
        if not self._on_cpu:
            source = {k: v.to(self.device, non_blocking=True) for k, v in source.items()}
        return self._make_td(source)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        action = get_entry(tensordict, ACTION)
        return self._out(self._step_source(action))

    def _step_source(self, action: torch.Tensor) -> dict:
        """One pool step -> the ``"next"`` content as ``{key: tensor}`` (CPU tensors)."""
        if self._unreset is not None:
            raise RuntimeError(
                f"{self!r}: sub-envs {np.flatnonzero(self._unreset).tolist()} finished at the "
                "last step and were not reset; EnvPool would replace this step of theirs with "
                "its own reset. Reset them first with a '_reset' mask (step_and_maybe_reset, "
                "rollout and the collectors do).")
        if self._last_obs is None:
            raise RuntimeError(f"{self!r}: call reset() before the first step.")
        obs, reward, term, trunc = self._chan.step(self._act_conv(action))
        n = self.num_envs
        done = term | trunc
        any_done = self._last_any_done = bool(np.count_nonzero(done))
        if any_done:
            self._unreset = done.copy()
        self._last_obs = obs
        # numpy reshapes: a fraction of the cost of torch views
        rew = torch.from_numpy(reward.reshape(n, 1))
        return {
            OBSERVATION: self._obs_tensor(obs),
            REWARD: rew if rew.dtype == torch.float32 else rew.float(),
            DONE: torch.from_numpy(done.reshape(n, 1)),
            TERMINATED: torch.from_numpy(term.reshape(n, 1)),
            TRUNCATED: torch.from_numpy(trunc.reshape(n, 1)),
        }

    @property
    def last_any_done(self) -> bool | None:
        """Whether any sub-env was done at the last step (``None`` before the first one)."""
        return self._last_any_done

    def dict_stepper(self) -> Callable[[dict], tuple[dict, bool | None]] | None:
        """``step`` on plain dicts (see :meth:`EnvBase.dict_stepper`) on the CPU without
        action checks; ``None`` otherwise."""
        if (self.check_actions or not self._on_cpu or type(self).step is not EnvBase.step
                or type(self)._step is not EnvPoolEnv._step):
            return None
        source = self._step_source

        def stepper(root: dict) -> tuple[dict, bool | None]:
            return source(root[ACTION]), self._last_any_done

        return stepper

    def _set_seed(self, seed: int) -> int:
        self._pending_seed = seed
        return seed + self.num_envs

    def _close(self) -> None:
        self._pool.close()

    def __repr__(self) -> str:
        return (f"EnvPoolEnv({self.env_id!r}, num_envs={self.num_envs}, "
                f"num_threads={self.num_threads}, device={self.device})")
