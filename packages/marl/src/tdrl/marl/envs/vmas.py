"""``VmasEnv``: the vectorised VMAS simulator (Bettini et al., 2022, arXiv:2207.03530) as a
tdrl :class:`~tdrl.core.envs.EnvBase`.

Data contract (DESIGN.md): batch size ``(num_envs,)``; agents grouped under one key with the
agent dim right after the batch dim:

* ``(group, "observation")`` ``[B, n_agents, obs_dim]`` float32;
* ``(group, "action")`` ``[B, n_agents, act_dim]`` in ``[-u_range, u_range]`` (continuous) or
  ``[B, n_agents]`` int64 (discrete);
* ``("next", group, "reward")`` ``[B, n_agents, 1]``;
* ``done`` / ``terminated`` / ``truncated`` ``[B, 1]`` bool at the root (VMAS ends an episode
  for all agents at once, so there are no per-agent flags); ``terminated`` is the scenario's
  own done, ``truncated`` is set by the ``max_steps`` option.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Sequence

import torch
from tensordict import TensorDictBase

from tdrl.core.envs import EnvBase
from tdrl.core.specs import Bounded, Categorical, Composite, Unbounded
from tdrl.core.td_access import new_td, set_entry

from .._optional import require
from ..keys import ACTION, DONE, INFO, OBSERVATION, REWARD, TERMINATED, TRUNCATED
from ._groups import GroupMap, check_group_action, group_agents

__all__ = ["VmasEnv", "vmas_scenarios"]


def _require_vmas():
    return require("vmas", extra="vmas", what="VmasEnv")


def vmas_scenarios() -> list[str]:
    """The names of the scenarios VMAS ships (``VmasEnv(scenario=...)`` accepts any of them)."""
    vmas = _require_vmas()
    names = set(vmas.scenarios) | set(getattr(vmas, "mpe_scenarios", [])) | set(
        getattr(vmas, "debug_scenarios", [])
    )
    return sorted(names)


def _make_strict(vmas, name: str, scenario, **kwargs):
    """``vmas.make_env(scenario, **kwargs)``, refusing scenario kwargs the scenario ignores.

    VMAS only warns about them ("passed but not used by the scenario"), so a misspelt task
    parameter would silently run the scenario's default.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        env = vmas.make_env(scenario, **kwargs)
    for w in caught:
        text = str(w.message)
        if "passed but not used by the scenario" in text:
            raise ValueError(
                f"VMAS scenario {name!r} does not take these kwargs: {text.split(' passed')[0]}. "
                "Check their names against the scenario's make_world (vmas/scenarios/"
                f"{name}.py)."
            )
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return env


@contextlib.contextmanager
def _unvalidated_distributions() -> Iterator[None]:
    """``torch.distributions`` built inside skip their argument checks, restored on exit.

    Some scenarios build distributions every step (``sampling`` evaluates a
    ``MultivariateNormal`` per agent and step); their argument and support checks were ~15%
    of a MAPPO run on it. TorchRL switches the checks off for the whole process when it is
    imported (``Distribution.set_default_validate_args(False)``), so a BenchMARL run pays none;
    here the switch covers only the simulator's own calls, not the user's distributions.
    """
    dist = torch.distributions.Distribution
    before = dist._validate_args
    dist._validate_args = False
    try:
        yield
    finally:
        dist._validate_args = before


def _td(source: dict, batch_size, device) -> TensorDictBase:
    return new_td(source, batch_size, device)


class VmasEnv(EnvBase):
    """A batch of ``num_envs`` VMAS worlds stepped together.

    Args:
        scenario: a VMAS scenario name (see :func:`vmas_scenarios`) or a
            ``vmas.simulator.scenario.BaseScenario`` instance.
        num_envs: number of vectorised worlds (the batch size). Thousands are fine on CPU.
        continuous_actions: continuous (``Bounded``) or discrete (``Categorical``) actions.
        max_steps: episode length; reaching it sets ``truncated`` (and ``done``). ``None`` warns:
            most VMAS scenarios never end an episode themselves, so returns are never
            reported (BenchMARL's tasks set it: :func:`tdrl.marl.tasks.task_spec`).
        time_limit_terminates: reaching ``max_steps`` also sets ``terminated``, so value
            estimators do not bootstrap there: TorchRL's ``VmasEnv`` semantics (hence
            BenchMARL's), for like-for-like comparisons. Default False (the limit truncates).
        seed: optional seed applied before the first reset.
        device: where the simulation runs and the TensorDicts live.
        group_map: ``None`` (all agents in group ``"agents"``), ``"prefix"`` or a dict
            ``{group: [agent names]}``; agents in one group need the same spaces.
        include_info: also write each agent's VMAS info entries under
            ``("next", group, "info", name)`` (costs a stack per entry per step).
        **scenario_kwargs: passed to the scenario (e.g. ``n_agents=3``).

    Example:
        >>> env = VmasEnv("navigation", num_envs=32, max_steps=100, seed=0, n_agents=3)
        >>> td = env.rollout(10)
        >>> td["next", "agents", "reward"].shape
        torch.Size([32, 10, 3, 1])
    """

    def __init__(
        self,
        scenario,
        num_envs: int,
        continuous_actions: bool = True,
        max_steps: int | None = None,
        seed: int | None = None,
        device: torch.device | str = "cpu",
        group_map: GroupMap = None,
        include_info: bool = False,
        time_limit_terminates: bool = False,
        **scenario_kwargs,
    ) -> None:
        vmas = _require_vmas()
        if isinstance(scenario, str):
            valid = vmas_scenarios()
            if scenario not in valid:
                raise ValueError(
                    f"Unknown VMAS scenario {scenario!r}. Valid scenarios: {', '.join(valid)}."
                )
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}.")
        if max_steps is not None and max_steps < 1:
            raise ValueError(f"max_steps must be >= 1 or None, got {max_steps}.")
        super().__init__(batch_size=(num_envs,), device=device)
        self.scenario_name = scenario if isinstance(scenario, str) else type(scenario).__name__
        if max_steps is None:
            warnings.warn(
                f"VmasEnv({self.scenario_name!r}) without max_steps: most VMAS scenarios never end an "
                "episode, so episode returns are never reported (train_return stays NaN). Pass "
                "max_steps=..., e.g. BenchMARL's: tdrl.marl.tasks.task_spec(name)['max_steps'].",
                UserWarning, stacklevel=2)
        self.num_envs = num_envs
        self.continuous_actions = continuous_actions
        self.max_steps = max_steps
        self.time_limit_terminates = time_limit_terminates
        self.include_info = include_info
        with _unvalidated_distributions():
            self._env = _make_strict(
                vmas, self.scenario_name, scenario, num_envs=num_envs, device=self.device,
                continuous_actions=continuous_actions, seed=seed, **scenario_kwargs,
            )
        self._seeded = True  # VMAS seeds its own generator when it builds the worlds (None: its seed 0)
        self.agent_names = [a.name for a in self._env.agents]
        self.n_agents = len(self.agent_names)
        self.group_map = group_agents(self.agent_names, group_map)
        index = {n: i for i, n in enumerate(self.agent_names)}
        self._group_idx = {g: [index[a] for a in agents] for g, agents in self.group_map.items()}
        self._steps = torch.zeros(num_envs, dtype=torch.long, device=self.device)
        self._make_specs()

    # ------------------------------------------------------------------ specs
    def _make_specs(self) -> None:
        b = self.batch_size
        obs_spec = Composite(shape=b, device=self.device)
        act_spec = Composite(shape=b, device=self.device)
        rew_spec = Composite(shape=b, device=self.device)
        self._act_shapes: dict[str, torch.Size] = {}
        for g, idx in self._group_idx.items():
            n = len(idx)
            obs_spaces = [self._env.observation_space[i] for i in idx]
            act_spaces = [self._env.action_space[i] for i in idx]
            obs_shapes = {tuple(s.shape) for s in obs_spaces}
            if len(obs_shapes) != 1:
                raise ValueError(
                    f"Group {g!r} mixes observation shapes {sorted(obs_shapes)}; use "
                    "group_map='prefix' or a dict so each group is homogeneous."
                )
            obs_shape = obs_shapes.pop()
            obs_spec[g] = Composite(
                {OBSERVATION: Unbounded((*b, n, *obs_shape), self.device)}, shape=(*b, n)
            )
            if self.continuous_actions:
                dims = {tuple(s.shape) for s in act_spaces}
                if len(dims) != 1:
                    raise ValueError(f"Group {g!r} mixes action shapes {sorted(dims)}.")
                low = torch.stack([torch.as_tensor(s.low) for s in act_spaces])
                high = torch.stack([torch.as_tensor(s.high) for s in act_spaces])
                shape = (*b, n, *dims.pop())
                leaf = Bounded(low.expand(shape), high.expand(shape), shape, self.device)
            else:
                ns = {int(s.n) for s in act_spaces}
                if len(ns) != 1:
                    raise ValueError(f"Group {g!r} mixes discrete action sizes {sorted(ns)}.")
                leaf = Categorical(ns.pop(), (*b, n), self.device)
            self._act_shapes[g] = leaf.shape
            act_spec[g] = Composite({ACTION: leaf}, shape=(*b, n))
            rew_spec[g] = Composite({REWARD: Unbounded((*b, n, 1), self.device)}, shape=(*b, n))
        self.observation_spec = obs_spec
        self.full_action_spec = act_spec
        self.full_reward_spec = rew_spec

    @property
    def scenario(self):
        """The VMAS scenario object (its attributes hold the scenario's parameters)."""
        return self._env.scenario

    @property
    def groups(self) -> list[str]:
        """The group names (``["agents"]`` by default)."""
        return list(self.group_map)

    # ------------------------------------------------------------------ helpers
    def _group_obs(self, obs: Sequence[torch.Tensor]) -> dict:
        out = {}
        for g, idx in self._group_idx.items():
            n = len(idx)
            stacked = torch.stack([obs[i] for i in idx], dim=1)
            out[g] = _td({OBSERVATION: stacked}, (self.num_envs, n), self.device)
        return out

    def _group_info(self, infos: Sequence[dict], g: str, idx: list[int]) -> TensorDictBase:
        entries = {}
        for k in infos[idx[0]]:
            vals = [torch.as_tensor(infos[i][k], device=self.device) for i in idx]
            v = torch.stack(vals, dim=1)
            entries[k] = v.unsqueeze(-1) if v.ndim == 2 else v
        return _td(entries, (self.num_envs, len(idx)), self.device)

    def _agent_reward(self, r: torch.Tensor, i: int) -> torch.Tensor:
        """Agent ``i``'s reward as ``[num_envs]``.

        Scenarios differ: most return ``[num_envs]``, some ``[num_envs, 1]`` (``wheel``);
        both are one reward per world. Anything else is refused here, where the scenario
        is known, rather than as a shape error in the advantage estimator.
        """
        if r.shape == (self.num_envs,):
            return r
        if r.shape == (self.num_envs, 1):
            return r.reshape(self.num_envs)
        raise ValueError(
            f"VMAS scenario {self.scenario_name!r} returned a reward of shape {tuple(r.shape)} for agent "
            f"{self.agent_names[i]!r}; expected one reward per world, ({self.num_envs},) or "
            f"({self.num_envs}, 1)."
        )

    # ------------------------------------------------------------------ EnvBase
    def _reset(self, tensordict: TensorDictBase | None, **kwargs) -> TensorDictBase:
        mask = None if tensordict is None else tensordict.get("_reset", None)
        with _unvalidated_distributions():
            if mask is None or bool(mask.all()):
                obs = self._env.reset()
                self._steps.zero_()
            else:
                rows = mask.reshape(self.num_envs).nonzero().flatten().tolist()
                for i in rows:
                    self._env.reset_at(i, return_observations=False)
                self._steps[rows] = 0
                obs = self._env.get_from_scenario(
                    get_observations=True, get_rewards=False, get_infos=False, get_dones=False
                )[0]
        source = self._group_obs(obs)
        false = torch.zeros((self.num_envs, 1), dtype=torch.bool, device=self.device)
        source.update({DONE: false, TERMINATED: false.clone(), TRUNCATED: false.clone()})
        return _td(source, self.batch_size, self.device)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        actions: list[torch.Tensor | None] = [None] * self.n_agents
        for g, idx in self._group_idx.items():
            act = check_group_action(g, tensordict.get((g, ACTION), None), self._act_shapes[g])
            for j, a in zip(idx, act.unbind(1)):
                actions[j] = a
        with _unvalidated_distributions():
            obs, rews, dones, infos = self._env.step(actions)
        self._steps += 1
        source = self._group_obs(obs)
        for g, idx in self._group_idx.items():
            sub = source[g]
            set_entry(sub, REWARD, torch.stack([self._agent_reward(rews[i], i) for i in idx], dim=1).unsqueeze(-1))
            if self.include_info:
                set_entry(sub, INFO, self._group_info(infos, g, idx))
        terminated = dones.reshape(self.num_envs, 1).bool()
        if self.max_steps is not None:
            truncated = (self._steps >= self.max_steps).unsqueeze(-1)
            done = terminated | truncated
            if self.time_limit_terminates:
                terminated = done.clone()
        else:
            truncated = torch.zeros_like(terminated)
            done = terminated
        source.update({DONE: done, TERMINATED: terminated, TRUNCATED: truncated})
        return _td(source, self.batch_size, self.device)

    def _set_seed(self, seed: int) -> int:
        with _unvalidated_distributions():
            self._env.seed(seed)
        return seed + 1

    def render(self, env_index: int = 0):
        """An RGB frame ``[H, W, 3]`` (uint8 numpy) of sub-env ``env_index``, drawn by VMAS on
        the CPU (no display needed)."""
        return self._env.render(mode="rgb_array", env_index=env_index)

    def __repr__(self) -> str:
        return (
            f"VmasEnv(scenario={self.scenario_name!r}, num_envs={self.num_envs}, "
            f"groups={ {g: len(a) for g, a in self.group_map.items()} }, "
            f"continuous_actions={self.continuous_actions}, max_steps={self.max_steps})"
        )
