"""DeepMind Control Suite tasks (Tassa et al., 2018) as a tdrl env: :class:`DMControlEnv`.

``DMControlEnv("cartpole", "balance", num_envs=1)`` holds ``num_envs`` suite environments
stepped one after the other in this process (``batch_size=(num_envs,)``, like a Gymnasium
vector env of ``make_env``). Keys, shapes and dtypes follow the data contract of
:class:`~tdrl.core.envs.GymEnv`:

* state observations: every entry of the task's observation dict flattened and concatenated
  (in the suite's order) into ``"observation"`` ``(num_envs, D)``; with ``flatten=False``
  each entry is its own key instead (``"position"`` ``(num_envs, 3)``, a scalar entry gets
  shape ``(num_envs, 1)``);
* ``pixels=True`` adds ``"pixels"`` ``(num_envs, H, W, 3)`` uint8 rendered from the physics
  (MuJoCo's EGL backend: ``MUJOCO_GL`` defaults to ``egl``);
* action ``(num_envs, A)`` bounded as the task's action spec says (``[-1, 1]`` for the suite);
* ``reward`` summed over ``action_repeat`` physics steps; ``terminated`` where an episode
  ends with discount 0, ``truncated`` at the time limit (the suite's 1000 steps).

Seeding: ``set_seed(s)`` rebuilds sub-env ``i`` with ``task_kwargs={"random": s + i}``.

The suite's simulator state cannot be checkpointed here: a resumed run starts fresh episodes.

MuJoCo versions: dm_control 1.0.50 was built against mujoco 3.17 and names a few flex-body
fields in its struct index tables that mujoco 4.0 removed; on first use this module drops
the names the installed mujoco lacks from dm_control's tables (suite tasks use no flex
bodies), so dm_control and ``gymnasium[mujoco]`` share mujoco 4.0 (see the core README).
"""

from __future__ import annotations

import logging
import os
import numpy as np
import torch
from tensordict import TensorDictBase

from tdrl.core.td_access import new_td

from .._optional import require
from ..keys import ACTION, DONE, OBSERVATION, REWARD, TERMINATED, TRUNCATED
from ..specs import Bounded, Composite, Unbounded
from .common import RESET_KEY, EnvBase

__all__ = ["DMControlEnv", "make_dmc", "parse_dmc_id"]

log = logging.getLogger(__name__)

PIXELS = "pixels"
_COMPAT_DONE = False


def _suite():
    """``dm_control.suite``, after the mujoco-4 compatibility step (once)."""
    global _COMPAT_DONE
    os.environ.setdefault("MUJOCO_GL", "egl")
    require("dm_control", extra="dmc", what="DMControlEnv", pip_name='"dm-control>=1.0.50"')
    if not _COMPAT_DONE:
        import mujoco
        from dm_control.mujoco.wrapper.mjbindings import sizes

        model = mujoco.MjModel.from_xml_string("<mujoco/>")
        for struct, obj in (("mjmodel", model), ("mjdata", mujoco.MjData(model))):
            missing = [f for f in sizes.array_sizes[struct] if not hasattr(obj, f)]
            for f in missing:
                del sizes.array_sizes[struct][f]
            if missing:
                log.debug("dm_control: mujoco %s lacks %s fields %s (dropped from its index)",
                          mujoco.__version__, struct, missing)
        _COMPAT_DONE = True
    from dm_control import suite

    return suite


def parse_dmc_id(env_id: str) -> tuple[str, str]:
    """``"dmc/cartpole-balance"`` (or ``"cartpole-balance"``) -> ``("cartpole", "balance")``.

    The task is everything after the first ``-`` (``"dmc/ball_in_cup-catch"``)."""
    name = env_id[len("dmc/"):] if env_id.startswith("dmc/") else env_id
    domain, sep, task = name.partition("-")
    if not (domain and sep and task):
        raise ValueError(f"DeepMind Control id {env_id!r} is not understood: expected "
                         "'dmc/<domain>-<task>', e.g. 'dmc/cartpole-balance'.")
    return domain, task


class DMControlEnv(EnvBase):
    """A DeepMind Control Suite task, ``num_envs`` copies stepped serially.

    Args:
        domain: suite domain (``"cartpole"``, ``"reacher"``, ``"walker"``, ...).
        task: task of the domain (``"balance"``, ``"easy"``, ``"walk"``, ...).
        num_envs: number of sub-envs (``batch_size=(num_envs,)``).
        action_repeat: physics-control steps per ``step`` (rewards are summed).
        flatten: one ``"observation"`` vector (True) or one key per suite entry (False).
        pixels: also render ``"pixels"`` (``pixels_size`` x ``pixels_size`` x 3, uint8).
        pixels_size: rendered image side.
        camera_id: camera of the rendering.
        dtype: float dtype of the state observations.
        device: device of the TensorDicts.
        check_actions: check actions against the spec at every step.

    Example:
        >>> env = DMControlEnv("cartpole", "balance")
        >>> env.rollout(5)["next", "observation"].shape
        torch.Size([1, 5, 5])
    """

    def __init__(
        self,
        domain: str,
        task: str,
        *,
        num_envs: int = 1,
        action_repeat: int = 1,
        flatten: bool = True,
        pixels: bool = False,
        pixels_size: int = 64,
        camera_id: int = 0,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        check_actions: bool = False,
    ) -> None:
        suite = _suite()
        if (domain, task) not in suite.ALL_TASKS:
            raise ValueError(f"DMControlEnv: ({domain!r}, {task!r}) is not a suite task; known: "
                             f"{sorted('-'.join(t) for t in suite.ALL_TASKS)}.")
        for name, value in (("num_envs", num_envs), ("action_repeat", action_repeat),
                            ("pixels_size", pixels_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"DMControlEnv: {name}={value!r} is not allowed: expected an int >= 1.")
        super().__init__(batch_size=(num_envs,), device=device, check_actions=check_actions)
        self.domain, self.task = domain, task
        self.action_repeat, self.flatten, self.pixels = action_repeat, flatten, pixels
        self.pixels_size, self.camera_id, self.dtype = pixels_size, camera_id, dtype
        self._envs = [suite.load(domain, task) for _ in range(num_envs)]
        b, dev = self.batch_size, self.device
        obs_spec = self._envs[0].observation_spec()
        self._obs_names = list(obs_spec)
        self._obs_sizes = [int(np.prod(s.shape)) for s in obs_spec.values()]
        if flatten:
            specs = {OBSERVATION: Unbounded((*b, sum(self._obs_sizes)), dev, dtype)}
        else:
            specs = {k: Unbounded((*b, n), dev, dtype) for k, n in zip(self._obs_names, self._obs_sizes)}
        if pixels:
            specs[PIXELS] = Bounded(0, 255, (*b, pixels_size, pixels_size, 3), dev, torch.uint8)
        self.observation_spec = Composite(specs, shape=b, device=dev)
        act = self._envs[0].action_spec()
        low = torch.as_tensor(np.array(np.broadcast_to(act.minimum, act.shape)), dtype=dtype)
        high = torch.as_tensor(np.array(np.broadcast_to(act.maximum, act.shape)), dtype=dtype)
        self.action_spec = Bounded(low.expand(*b, *act.shape), high.expand(*b, *act.shape),
                                   (*b, *act.shape), dev, dtype)
        self.reward_spec = Unbounded((*b, 1), dev, torch.float32)
        self._last_obs: list[dict | None] = [None] * num_envs

    # ------------------------------------------------------------------ helpers
    def _obs_of(self, i: int, time_step) -> dict:
        parts = [np.asarray(time_step.observation[k], dtype=np.float64).reshape(-1)
                 for k in self._obs_names]
        if self.flatten:
            out = {OBSERVATION: torch.as_tensor(np.concatenate(parts), dtype=self.dtype)}
        else:
            out = {k: torch.as_tensor(p, dtype=self.dtype) for k, p in zip(self._obs_names, parts)}
        if self.pixels:
            img = self._envs[i].physics.render(self.pixels_size, self.pixels_size, camera_id=self.camera_id)
            out[PIXELS] = torch.from_numpy(np.ascontiguousarray(img))
        return out

    def _stack(self, rows: list[dict], extra: dict) -> TensorDictBase:
        source = {k: torch.stack([r[k] for r in rows]).to(self.device) for k in rows[0]}
        source.update(extra)
        return new_td(source, self.batch_size, self.device)

    def _flags(self, term: list[bool], trunc: list[bool]) -> dict:
        te = torch.tensor(term, dtype=torch.bool, device=self.device).unsqueeze(-1)
        tr = torch.tensor(trunc, dtype=torch.bool, device=self.device).unsqueeze(-1)
        return {DONE: te | tr, TERMINATED: te, TRUNCATED: tr}

    # ------------------------------------------------------------------ EnvBase
    def _reset(self, tensordict: TensorDictBase | None, **kwargs) -> TensorDictBase:
        mask = None if tensordict is None else tensordict.get(RESET_KEY, None)
        rows = mask.reshape(len(self._envs)).tolist() if mask is not None else [True] * len(self._envs)
        for i, env in enumerate(self._envs):
            if rows[i] or self._last_obs[i] is None:
                self._last_obs[i] = self._obs_of(i, env.reset())
        n = len(self._envs)
        return self._stack(self._last_obs, self._flags([False] * n, [False] * n))

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        action = tensordict.get(ACTION)
        if action.shape != self.action_spec.shape:
            raise ValueError(f"DMControlEnv({self.domain}-{self.task}) expects an action of shape "
                             f"{tuple(self.action_spec.shape)}, got {tuple(action.shape)}.")
        actions = action.detach().cpu().double().numpy()
        rewards, term, trunc = [], [], []
        for i, env in enumerate(self._envs):
            total, ts = 0.0, None
            for _ in range(self.action_repeat):
                ts = env.step(actions[i])
                total += float(ts.reward or 0.0)
                if ts.last():
                    break
            self._last_obs[i] = self._obs_of(i, ts)
            rewards.append(total)
            ended = bool(ts.last())
            term.append(ended and float(ts.discount) == 0.0)
            trunc.append(ended and float(ts.discount) != 0.0)
        extra = self._flags(term, trunc)
        extra[REWARD] = torch.tensor(rewards, dtype=torch.float32, device=self.device).unsqueeze(-1)
        return self._stack(self._last_obs, extra)

    def _set_seed(self, seed: int) -> int:
        suite = _suite()
        self._envs = [suite.load(self.domain, self.task, task_kwargs={"random": seed + i})
                      for i in range(len(self._envs))]
        self._last_obs = [None] * len(self._envs)
        return seed + len(self._envs)

    def _close(self) -> None:
        for env in self._envs:
            env.close()

    def __repr__(self) -> str:
        return (f"DMControlEnv({self.domain!r}, {self.task!r}, batch_size={tuple(self.batch_size)}, "
                f"action_repeat={self.action_repeat})")


def make_dmc(env_id: str, num_envs: int = 1, **kwargs) -> DMControlEnv:
    """``make_env``'s builder for ``"dmc/<domain>-<task>"`` ids (``kwargs`` go to :class:`DMControlEnv`)."""
    domain, task = parse_dmc_id(env_id)
    return DMControlEnv(domain, task, num_envs=num_envs, **kwargs)

