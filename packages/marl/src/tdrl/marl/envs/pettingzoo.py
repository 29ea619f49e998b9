"""``PettingZooEnv``: PettingZoo's parallel and AEC (turn-based) APIs as a tdrl ``EnvBase``.

One PettingZoo env per instance (batch size ``()``); batch them with
:class:`~tdrl.core.envs.SerialEnv` / ``ParallelEnv``. Per group ``g`` of ``n`` agents:

* ``(g, "observation")`` ``[n, *obs_shape]`` float32 (int observations are cast);
* ``(g, "action_mask")`` ``[n, n_actions]`` bool where the env provides masks (a Dict
  observation with ``"action_mask"``, or ``info["action_mask"]``);
* ``(g, "action")`` ``[n]`` int64 (Discrete) or ``[n, *shape]`` (Box);
* ``(g, "mask")`` ``[n]`` bool: the agent acts at this step -- False for agents that left
  the episode and, in AEC games, for every agent but the one whose turn it is. Their actions
  are ignored, their observations are zeros, rewards 0, and their action masks all True so
  that a policy can still sample for them;
* ``("next", g, "reward")`` ``[n, 1]``; per-agent ``done``/``terminated``/``truncated``
  ``[n, 1]`` under the group; the global flags ``[1]`` are True when every agent is done.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import re
from collections.abc import Mapping

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from tdrl.core.envs import EnvBase
from tdrl.core.specs import Bounded, Categorical, Composite, Unbounded

from .._optional import available, require
from ..keys import ACTION, ACTION_MASK, DONE, MASK, OBSERVATION, REWARD, TERMINATED, TRUNCATED
from ._groups import GroupMap, check_group_action, group_agents

__all__ = ["PettingZooEnv", "pettingzoo_tasks"]

_TASK_MODULES = ("mpe2", "pettingzoo.classic", "pettingzoo.butterfly", "pettingzoo.sisl")


def _families() -> list[tuple[str, list[str]]]:
    """``[(package, [task module names])]`` for the installed task families (no env import)."""
    out = []
    for name in _TASK_MODULES:
        if not available(name.split(".")[0]):
            continue
        try:
            spec = importlib.util.find_spec(name)
        except ImportError:
            continue
        if spec is None or not spec.submodule_search_locations:
            continue
        tasks = [m.name for m in pkgutil.iter_modules(spec.submodule_search_locations)
                 if re.fullmatch(r".+_v\d+", m.name)]
        out.append((name, tasks))
    return out


def pettingzoo_tasks() -> list[str]:
    """Task names ``PettingZooEnv`` accepts (``simple_spread_v3``, ``tictactoe_v3``, ...).

    Raises:
        ModuleNotFoundError: pettingzoo is not installed (the message names the pip line).
    """
    require("pettingzoo", extra="pettingzoo", what="PettingZooEnv")
    return sorted({t for _, tasks in _families() for t in tasks})


def _make(task: str, parallel: bool | None, kwargs: dict):
    require("pettingzoo", extra="pettingzoo", what=f"PettingZooEnv({task!r})")
    if task.startswith("simple") and not available("mpe2"):  # MPE moved out of PettingZoo into mpe2
        require("mpe2", extra="pettingzoo", what=f"PettingZooEnv({task!r}) (an MPE task)")
    for pkg, tasks in _families():
        if task in tasks:
            sub = importlib.import_module(f"{pkg}.{task}")
            if parallel is None:
                parallel = hasattr(sub, "parallel_env")
            if parallel:
                return sub.parallel_env(**kwargs), True
            return sub.env(**kwargs), False
    raise ValueError(f"Unknown PettingZoo task {task!r}. Valid tasks: {', '.join(pettingzoo_tasks())}.")


def _space_specs(space, n: int):
    """``(obs spec, mask size or None)`` of one agent's observation space for ``n`` agents."""
    from gymnasium import spaces

    n_mask = None
    if isinstance(space, spaces.Dict) and "observation" in space.spaces:
        if "action_mask" in space.spaces:
            n_mask = int(np.prod(space["action_mask"].shape))
        space = space["observation"]
    if not isinstance(space, spaces.Box):
        raise TypeError(f"PettingZooEnv supports Box observations (or Dict with 'observation'), got {space}.")
    return Unbounded((n, *space.shape)), n_mask


def _action_spec(space, n: int):
    from gymnasium import spaces

    if isinstance(space, spaces.Discrete):
        return Categorical(int(space.n), (n,))
    if isinstance(space, spaces.Box):
        shape = (n, *space.shape)
        low = torch.as_tensor(space.low, dtype=torch.float32).expand(shape)
        high = torch.as_tensor(space.high, dtype=torch.float32).expand(shape)
        return Bounded(low, high, shape)
    raise TypeError(f"PettingZooEnv supports Discrete and Box actions, got {space}.")


class PettingZooEnv(EnvBase):
    """A PettingZoo environment with agents grouped under TensorDict keys.

    Args:
        task: a task name (see :func:`pettingzoo_tasks`), e.g. ``"simple_spread_v3"`` (MPE,
            from ``mpe2``) or ``"tictactoe_v3"``; or a PettingZoo env instance.
        parallel: use the parallel API (default: when the task offers it) or AEC.
        group_map: ``None`` (one group ``"agents"``), ``"prefix"`` (``adversary_0`` ->
            ``adversary``) or ``{group: [agent names]}``.
        seed: seed of the first reset.
        device: device of the TensorDicts.
        **task_kwargs: passed to the task constructor (``N=3``, ``max_cycles=25``, ...).
    """

    def __init__(self, task, parallel: bool | None = None, group_map: GroupMap = None,
                 seed: int | None = None, device: torch.device | str = "cpu", **task_kwargs) -> None:
        if isinstance(task, str):
            env, parallel = _make(task, parallel, task_kwargs)
            self.task = task
        else:
            env = task
            from pettingzoo import AECEnv

            parallel = not isinstance(env, AECEnv) if parallel is None else parallel
            self.task = type(env).__name__
        super().__init__(batch_size=(), device=device)
        self._env, self.parallel, self._seed = env, parallel, seed
        self._seeded = seed is not None  # else the first reset draws one from torch (tdrl.core.envs.seeding)
        self.agent_names = list(env.possible_agents)
        self.group_map = group_agents(self.agent_names, group_map)
        self._where = {a: (g, j) for g, agents in self.group_map.items() for j, a in enumerate(agents)}
        self._make_specs()

    def _make_specs(self) -> None:
        obs_spec, act_spec = Composite(), Composite()
        rew_spec, done_spec = Composite(), Composite()
        self._masks: dict[str, int | None] = {}
        for g, agents in self.group_map.items():
            n = len(agents)
            specs = [_space_specs(self._env.observation_space(a), n) for a in agents]
            acts = [_action_spec(self._env.action_space(a), n) for a in agents]
            if any(s[0] != specs[0][0] for s in specs) or any(a != acts[0] for a in acts):
                raise ValueError(f"Group {g!r} mixes observation or action spaces; use group_map='prefix' or a dict.")
            ospec, n_mask = specs[0]
            if n_mask is None and isinstance(acts[0], Categorical):
                n_mask = None
            self._masks[g] = n_mask
            group = Composite({OBSERVATION: ospec, MASK: Categorical(2, (n,), dtype=torch.bool)}, shape=(n,))
            if n_mask is not None:
                group[ACTION_MASK] = Categorical(2, (n, n_mask), dtype=torch.bool)
            obs_spec[g] = group
            act_spec[g] = Composite({ACTION: acts[0]}, shape=(n,))
            rew_spec[g] = Composite({REWARD: Unbounded((n, 1))}, shape=(n,))
            flag = Categorical(2, (n, 1), dtype=torch.bool)
            done_spec[g] = Composite({DONE: flag, TERMINATED: flag.clone(), TRUNCATED: flag.clone()}, shape=(n,))
        for k in (DONE, TERMINATED, TRUNCATED):
            done_spec[k] = Categorical(2, (1,), dtype=torch.bool)
        self.observation_spec, self.full_action_spec = obs_spec, act_spec
        self.full_reward_spec, self.full_done_spec = rew_spec, done_spec

    @property
    def groups(self) -> list[str]:
        return list(self.group_map)

    # ------------------------------------------------------------------ conversion
    def _blank(self) -> dict:
        out = {}
        for g, agents in self.group_map.items():
            n = len(agents)
            spec = self.observation_spec[g]
            out[g] = {OBSERVATION: spec[OBSERVATION].zero(), MASK: torch.zeros(n, dtype=torch.bool),
                      REWARD: torch.zeros(n, 1), DONE: torch.ones(n, 1, dtype=torch.bool),
                      TERMINATED: torch.zeros(n, 1, dtype=torch.bool), TRUNCATED: torch.zeros(n, 1, dtype=torch.bool)}
            if self._masks[g] is not None:
                out[g][ACTION_MASK] = torch.ones(n, self._masks[g], dtype=torch.bool)
        return out

    def _write_obs(self, out: dict, agent: str, obs, info: Mapping | None) -> None:
        g, j = self._where[agent]
        mask = None
        if isinstance(obs, Mapping):
            mask = obs.get("action_mask")
            obs = obs["observation"]
        if mask is None and info:
            mask = info.get("action_mask")
        out[g][OBSERVATION][j] = torch.as_tensor(np.asarray(obs), dtype=torch.float32)
        if mask is not None and ACTION_MASK in out[g]:
            m = torch.as_tensor(np.asarray(mask)).bool().reshape(-1)
            out[g][ACTION_MASK][j] = m if bool(m.any()) else torch.ones_like(m)

    def _finish(self, out: dict, with_reward: bool) -> TensorDictBase:
        src = {}
        all_done, all_term, any_trunc = True, True, False
        for g, agents in self.group_map.items():
            d = out[g]
            all_done &= bool(d[DONE].all())
            all_term &= bool(d[TERMINATED].all())
            any_trunc |= bool(d[TRUNCATED].any())
            keys = [OBSERVATION, MASK] + ([ACTION_MASK] if ACTION_MASK in d else [])
            if with_reward:
                keys += [REWARD, DONE, TERMINATED, TRUNCATED]
            src[g] = TensorDict({k: d[k] for k in keys}, batch_size=(len(agents),))
        src[DONE] = torch.tensor([all_done])
        src[TERMINATED] = torch.tensor([all_done and all_term])
        src[TRUNCATED] = torch.tensor([all_done and any_trunc and not all_term])
        if not with_reward:
            for g in self.group_map:
                for k in (DONE, TERMINATED, TRUNCATED):
                    src[g][k] = torch.zeros(len(self.group_map[g]), 1, dtype=torch.bool)
        return TensorDict(src, batch_size=()).to(self.device)

    def _action(self, td: TensorDictBase, agent: str):
        g, j = self._where[agent]
        a = td.get((g, ACTION), None)
        a = check_group_action(g, a, self.full_action_spec[g, ACTION].shape)[j]
        return int(a) if isinstance(self.full_action_spec[g, ACTION], Categorical) else a.cpu().numpy()

    # ------------------------------------------------------------------ EnvBase
    def _reset(self, tensordict: TensorDictBase | None, **kwargs) -> TensorDictBase:
        seed, self._seed = self._seed, None
        out = self._blank()
        self._left: dict[str, tuple[bool, bool]] = {}
        if self.parallel:
            obs, infos = self._env.reset(seed=seed)
            for a, o in obs.items():
                self._write_obs(out, a, o, infos.get(a))
                g, j = self._where[a]
                out[g][MASK][j], out[g][DONE][j] = True, False
        else:
            self._env.reset(seed=seed)
            self._aec_obs(out)
        return self._finish(out, with_reward=False)

    def _aec_obs(self, out: dict) -> None:
        env = self._env
        for a in env.agents:
            self._write_obs(out, a, env.observe(a), env.infos.get(a))
            g, j = self._where[a]
            out[g][DONE][j] = bool(env.terminations[a] or env.truncations[a])
            out[g][TERMINATED][j], out[g][TRUNCATED][j] = bool(env.terminations[a]), bool(env.truncations[a])
        sel = env.agent_selection if env.agents else None
        if sel is not None and not (env.terminations[sel] or env.truncations[sel]):
            g, j = self._where[sel]
            out[g][MASK][j] = True

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        out = self._blank()
        env = self._env
        if self.parallel:
            actions = {a: self._action(tensordict, a) for a in env.agents}
            obs, rew, term, trunc, infos = env.step(actions)
            for a in self.agent_names:
                g, j = self._where[a]
                if a in obs:
                    self._write_obs(out, a, obs[a], infos.get(a))
                out[g][REWARD][j] = float(rew.get(a, 0.0))
                t, tr = self._left.get(a, (bool(term.get(a, False)), bool(trunc.get(a, False))))
                if (t or tr) and a not in self._left:
                    self._left[a] = (t, tr)  # an agent that left keeps its flags until reset
                out[g][TERMINATED][j], out[g][TRUNCATED][j] = t, tr
                alive = a in env.agents
                out[g][DONE][j] = t or tr or not alive
                out[g][MASK][j] = alive
            return self._finish(out, with_reward=True)
        acting = env.agent_selection
        env.step(self._action(tensordict, acting))
        rewards = dict(env.rewards)
        while env.agents and (env.terminations[env.agent_selection] or env.truncations[env.agent_selection]):
            if all(env.terminations[a] or env.truncations[a] for a in env.agents):
                break  # the game is over for everyone: keep the final flags for the reset
            env.step(None)  # remove an agent that left; its turn is skipped
            for a, r in env.rewards.items():
                rewards[a] = rewards.get(a, 0.0) + r
        self._aec_obs(out)
        for a, r in rewards.items():
            g, j = self._where[a]
            out[g][REWARD][j] = float(r)
        return self._finish(out, with_reward=True)

    def rand_action(self, tensordict: TensorDictBase | None = None) -> TensorDictBase:
        """Random actions; for masked groups, drawn uniformly among the allowed actions."""
        if tensordict is None:
            tensordict = TensorDict({}, batch_size=())
        for g in self.group_map:
            spec = self.full_action_spec[g, ACTION]
            mask = tensordict.get((g, ACTION_MASK), None)
            if mask is not None:
                tensordict.set((g, ACTION), torch.multinomial(mask.float(), 1).squeeze(-1))
            else:
                tensordict.set((g, ACTION), spec.rand())
        return tensordict

    def _set_seed(self, seed: int) -> int:
        self._seed = seed
        return seed + 1

    def _close(self) -> None:
        self._env.close()

    def __repr__(self) -> str:
        return (f"PettingZooEnv(task={self.task!r}, parallel={self.parallel}, "
                f"groups={ {g: len(a) for g, a in self.group_map.items()} })")
