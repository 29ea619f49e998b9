"""Build the networks and loss of each algorithm from an env's group specs.

One small function per algorithm (BenchMARL's ``Algorithm`` classes do the same work): it
reads the group's observation and action specs and returns an :class:`OnPolicyParts` or
:class:`OffPolicyParts` bundle that the training loops of :mod:`tdrl.marl.loops` consume.
:func:`make_groups` builds one bundle per group of a multi-group env (e.g. PettingZoo's
``group_map="prefix"``); the loops accept that mapping. Observations with several trailing
dims (``[*B, n_agents, *obs_shape]``) are flattened per agent in front of the networks. The
networks are initialised on the CPU (same weights on any device for a seed) and then moved
to ``env.device``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple
from dataclasses import dataclass

from tensordict.nn import NormalParamExtractor, TensorDictModule, TensorDictSequential
from torch import nn

import torch
from tdrl.core.modules import (
    AdditiveGaussianModule, EGreedyModule, MaskedCategorical, ProbabilisticActor, QValueModule, TanhNormal,
)
from tdrl.core.objectives import DDPGLoss, DQNLoss, SACLoss
from tdrl.core.specs import Bounded, Categorical, Composite

from .keys import ACTION, ACTION_MASK, ACTION_VALUE, GROUP, OBSERVATION, REWARD, STATE_VALUE, TERMINATED
from .modules import MultiAgentGRU, MultiAgentLSTM, MultiAgentMLP, QMixer
from .objectives import (
    AgentLoss, DDPGConfig, IDDPGConfig, IPPOConfig, IPPOLoss, IQLConfig, ISACConfig, MADDPGConfig, MAPPOConfig,
    MAPPOLoss, MASACConfig, MultiAgentGAE, QMIXConfig, QMIXLoss, SACConfig, VDNConfig, VDNLoss,
)

__all__ = ["OnPolicyParts", "OffPolicyParts", "make_mappo", "make_ippo", "make_qmix", "make_vdn", "make_maddpg",
           "make_iddpg", "make_masac", "make_isac", "make_iql", "make_groups", "env_groups", "group_dims",
           "require_actions", "Algorithm", "ALGORITHMS"]


@dataclass
class OnPolicyParts:
    """What an on-policy trainer needs: the sampling ``policy``, the ``critic``, the
    ``loss`` (whose parameters the optimiser updates) and the advantage ``estimator``."""

    policy: nn.Module
    critic: nn.Module
    loss: nn.Module
    estimator: MultiAgentGAE
    recurrent: bool = False
    """GRU networks (``MAPPOConfig.recurrent``): the loss replays whole trajectories, so the
    trainer's minibatches are sub-envs' sequences, not shuffled frames; ``policy`` (the
    collection policy) then runs the actor and the critic in step mode."""


@dataclass
class OffPolicyParts:
    """What an off-policy trainer needs: the exploring ``policy``, its annealed exploration
    module ``explore`` (an ``EGreedyModule`` or ``AdditiveGaussianModule``; None for SAC, whose
    policy samples), the ``loss`` with target networks, and its config (``config.tau``)."""

    policy: nn.Module
    explore: EGreedyModule | AdditiveGaussianModule | None
    loss: nn.Module
    config: QMIXConfig | DDPGConfig | SACConfig | IQLConfig
    recurrent: bool = False
    """Recurrent Q networks (``QMIXConfig.recurrent``): the replay holds whole trajectories and
    the loss replays them (batches ``[B, T]``)."""


def env_groups(env) -> list[str]:
    """The agent groups of ``env``: top-level observation entries holding an ``"observation"``."""
    groups = getattr(env, "groups", None)
    if groups:
        return list(groups)
    spec = env.observation_spec
    return [k for k in spec.keys() if isinstance(k, str) and isinstance(spec[k], Composite)
            and OBSERVATION in spec[k].keys()]


def _obs_shape(env, group: str) -> tuple[int, tuple[int, ...]]:
    """``(n_agents, per-agent observation shape)`` of ``group``; errors name the groups."""
    if group not in env.observation_spec.keys():
        raise KeyError(f"The env has no group {group!r}; its groups are {env_groups(env)}.")
    obs = env.observation_spec[group, OBSERVATION]
    nb = len(env.batch_size)
    if obs.ndim < nb + 2:
        raise ValueError(
            f"({group!r}, 'observation') must be [*batch, n_agents, *obs_shape] with batch "
            f"{tuple(env.batch_size)}, got {tuple(obs.shape)}."
        )
    return obs.shape[nb], tuple(obs.shape[nb + 1:])


def group_dims(env, group: str = GROUP) -> tuple[int, int, object]:
    """``(n_agents, obs_dim, action_spec)`` of ``group`` in ``env``; errors name the groups.

    ``obs_dim`` is the flattened size of one agent's observation (``prod(obs_shape)``).
    """
    n_agents, shape = _obs_shape(env, group)
    return n_agents, math.prod(shape), env.full_action_spec[group, ACTION]


def _agent_net(env, group: str, mlp: nn.Module) -> nn.Module:
    """``mlp`` preceded by a per-agent flatten when the group's observations are multi-dim."""
    k = len(_obs_shape(env, group)[1])
    return mlp if k == 1 else nn.Sequential(nn.Flatten(-k, -1), mlp)


def _mask_key(env, group: str):
    key = (group, ACTION_MASK)
    return key if key in env.observation_spec else None


def _on_env_device(env, *modules: nn.Module) -> None:
    """Move ``modules`` (built on the CPU) to the env's device, where its TensorDicts live."""
    device = getattr(env, "device", None)
    if device is not None:
        for m in modules:
            m.to(device)


def _dist_actor(env, group: str, params: Callable[[int, list], nn.Module]) -> nn.Module:
    """A probabilistic actor for ``group``'s action spec around ``params(n_out, out_keys)``,
    a module writing the distribution's parameters (``n_out`` features per agent)."""
    _, _, spec = group_dims(env, group)
    if isinstance(spec, Bounded):
        act = spec.shape[-1]
        low = spec.low.reshape(-1, *spec.shape[-2:])[0]
        high = spec.high.reshape(-1, *spec.shape[-2:])[0]
        return ProbabilisticActor(params(2 * act, [(group, "loc"), (group, "scale")]), TanhNormal,
                                  in_keys={"loc": (group, "loc"), "scale": (group, "scale")},
                                  distribution_kwargs={"low": low, "high": high}, out_keys=[(group, ACTION)])
    if isinstance(spec, Categorical):
        in_keys = {"logits": (group, "logits")}
        mask = _mask_key(env, group)
        if mask is not None:
            in_keys["mask"] = mask
        return ProbabilisticActor(params(spec.n, [(group, "logits")]), MaskedCategorical, in_keys=in_keys,
                                  out_keys=[(group, ACTION)])
    raise TypeError(f"Group {group!r}: unsupported action spec {spec!r} (need Bounded or Categorical).")


def _head(mlp: nn.Module, out_keys: list) -> nn.Module:
    """``mlp``, followed by the loc / scale split when it writes a Gaussian's parameters."""
    return nn.Sequential(mlp, NormalParamExtractor()) if len(out_keys) == 2 else mlp


def _actor(env, group: str, share: bool, num_cells: Sequence[int]) -> nn.Module:
    n, d, _ = group_dims(env, group)

    def params(n_out: int, out_keys: list) -> nn.Module:
        net = _head(_agent_net(env, group, MultiAgentMLP(d, n_out, n, False, share, num_cells)), out_keys)
        return TensorDictModule(net, in_keys=[(group, OBSERVATION)], out_keys=out_keys)

    return _dist_actor(env, group, params)


def _ppo(env, config: MAPPOConfig, loss_cls, group: str, num_cells: Sequence[int], value_norm) -> OnPolicyParts:
    if config.recurrent:
        return _recurrent_ppo(env, config, loss_cls, group, num_cells, value_norm)
    n, d, _ = group_dims(env, group)
    policy = _actor(env, group, config.share_param_actor, num_cells)
    critic_net = _agent_net(env, group, MultiAgentMLP(d, 1, n, config.centralised_critic,
                                                      config.share_param_critic, num_cells))
    critic = TensorDictModule(critic_net, in_keys=[(group, OBSERVATION)], out_keys=[(group, STATE_VALUE)])
    loss = loss_cls(policy, critic, config, group=group, value_norm=value_norm)
    _on_env_device(env, loss)  # actor, critic and value_norm are its submodules
    estimator = MultiAgentGAE(config.gamma, config.lmbda, group, critic, value_norm=value_norm,
                              reuse_values=True)
    return OnPolicyParts(policy, critic, loss, estimator)


def _recurrent_net(env, group: str, config: MAPPOConfig, role: str, n_out: int, out_keys: list,
                   num_cells: Sequence[int]) -> tuple[nn.Module, nn.Module]:
    """``(step, sequence)`` modules of one recurrent network: a :class:`MultiAgentGRU` (state
    ``(group, "<role>_recurrent_state")``) or :class:`MultiAgentLSTM` (``..._h`` and ``..._c``),
    then a :class:`MultiAgentMLP` head; the two share every parameter and differ only in the
    cell's mode."""
    n, d, _ = group_dims(env, group)
    critic = role == "critic"
    share = (config.share_param_critic if critic else config.share_param_actor if role == "actor"
             else config.share_params)  # "q": QMIX / VDN's per-agent Q network
    obs, k = (group, OBSERVATION), len(_obs_shape(env, group)[1])
    pre = []
    if k > 1:  # multi-dim observations, flattened per agent in front of the GRU
        flat = (group, f"{role}_observation_flat")
        pre, obs = [TensorDictModule(nn.Flatten(-k, -1), in_keys=[obs], out_keys=[flat])], flat
    features = (group, f"{role}_features")
    state = (group, f"{role}_recurrent_state")
    args = (d, config.rnn_hidden, n, critic and getattr(config, "centralised_critic", False), share, obs, features)
    gru = (MultiAgentLSTM(*args, state_keys=((group, f"{state[1]}_h"), (group, f"{state[1]}_c")))
           if config.rnn == "lstm" else MultiAgentGRU(*args, state_key=state))
    head = TensorDictModule(_head(MultiAgentMLP(config.rnn_hidden, n_out, n, False, share, num_cells), out_keys),
                            in_keys=[features], out_keys=out_keys)
    return (TensorDictSequential(*pre, gru, head),
            TensorDictSequential(*pre, gru.set_recurrent_mode(True), head))


def _recurrent_ppo(env, config: MAPPOConfig, loss_cls, group: str, num_cells: Sequence[int],
                   value_norm) -> OnPolicyParts:
    """MAPPO / IPPO with GRU or LSTM actor and critic (``config.recurrent``, ``config.rnn``).

    Collection runs both in step mode (the critic too, so that its hidden state at every step
    is recorded and the advantage is computed from the states the rollout had); the loss
    replays them in recurrent mode over whole trajectories, with the same resets.
    """
    built: list[nn.Module] = []

    def params(n_out: int, out_keys: list) -> nn.Module:
        if not built:  # the first call builds the network, the second takes its recurrent-mode view
            built.extend(_recurrent_net(env, group, config, "actor", n_out, out_keys, num_cells))
            return built[0]
        return built[1]

    step_actor = _dist_actor(env, group, params)
    seq_actor = _dist_actor(env, group, params)  # the same parameters, in recurrent mode
    critic_step, critic_seq = _recurrent_net(env, group, config, "critic", 1, [(group, STATE_VALUE)], num_cells)
    loss = loss_cls(seq_actor, critic_seq, config, group=group, value_norm=value_norm)
    policy = TensorDictSequential(step_actor, critic_step)
    _on_env_device(env, loss)
    # in step mode over the rollout the critic reads each step's recorded state: its values
    # are the rollout's (and "next" values continue from the state after each step)
    estimator = MultiAgentGAE(config.gamma, config.lmbda, group, critic_step, value_norm=value_norm,
                              reuse_values=True)
    return OnPolicyParts(policy, critic_seq, loss, estimator, recurrent=True)


def make_mappo(env, config: MAPPOConfig | None = None, group: str = GROUP,
               num_cells: Sequence[int] = (256, 256), value_norm=None) -> OnPolicyParts:
    """MAPPO: TanhNormal (continuous) or masked categorical (discrete) actor, one
    :class:`MultiAgentMLP` per role, a centralised critic."""
    return _ppo(env, config or MAPPOConfig(), MAPPOLoss, group, num_cells, value_norm)


def make_ippo(env, config: IPPOConfig | None = None, group: str = GROUP,
              num_cells: Sequence[int] = (256, 256), value_norm=None) -> OnPolicyParts:
    """IPPO: as :func:`make_mappo` with a decentralised critic."""
    return _ppo(env, config or IPPOConfig(), IPPOLoss, group, num_cells, value_norm)


def require_actions(env, group: str, algorithm: str, continuous: bool):
    """The group's action spec, if it is of the kind ``algorithm`` needs (the one home of this check).

    Raises:
        TypeError: continuous (``Bounded``) actions wanted and the group's are discrete, or the
            other way round; the message says how to build the env.
    """
    spec = group_dims(env, group)[2]
    want = Bounded if continuous else Categorical
    if not isinstance(spec, want):
        kind, flag = ("continuous", "True") if continuous else ("discrete", "False")
        raise TypeError(f"{algorithm} needs {kind} actions; group {group!r} has {type(spec).__name__}. "
                        f"Build the env with continuous_actions={flag}.")
    return spec


def _q_parts(env, config: QMIXConfig | IQLConfig, group: str, num_cells: Sequence[int], algorithm: str = "QMIX/VDN"):
    n, d, spec = group_dims(env, group)
    require_actions(env, group, algorithm, continuous=False)
    if getattr(config, "recurrent", False):  # the step-mode net acts, the sequence-mode one trains
        step_net, qnet = _recurrent_net(env, group, config, "q", spec.n, [(group, ACTION_VALUE)], num_cells)
    else:
        qnet = step_net = TensorDictModule(
            _agent_net(env, group, MultiAgentMLP(d, spec.n, n, False, config.share_params, num_cells)),
            in_keys=[(group, OBSERVATION)], out_keys=[(group, ACTION_VALUE)])
    mask = _mask_key(env, group)
    greedy = QValueModule(action_value_key=(group, ACTION_VALUE), action_key=(group, ACTION),
                          chosen_action_value_key=(group, "chosen_action_value"), action_mask_key=mask)
    explore = EGreedyModule(spec.n, eps_init=config.eps_init, eps_end=config.eps_end,
                            annealing_num_steps=config.eps_anneal_frames, action_key=(group, ACTION),
                            action_mask_key=mask)
    return n, d, qnet, TensorDictSequential(step_net, greedy), explore


def make_qmix(env, config: QMIXConfig | None = None, group: str = GROUP,
              num_cells: Sequence[int] = (256, 256)) -> OffPolicyParts:
    """QMIX with a :class:`QMixer` on all agents' observations (the VMAS tasks have no state)."""
    config = config or QMIXConfig()
    n, d, qnet, greedy, explore = _q_parts(env, config, group, num_cells)
    loss = QMIXLoss(qnet, QMixer((n, *_obs_shape(env, group)[1]), n, config.mixing_embed_dim,
                                  config.hypernet_hidden), config,
                    group=group)
    _on_env_device(env, loss, explore)
    return OffPolicyParts(TensorDictSequential(greedy, explore), explore, loss, config, recurrent=config.recurrent)


def make_vdn(env, config: VDNConfig | None = None, group: str = GROUP,
             num_cells: Sequence[int] = (256, 256)) -> OffPolicyParts:
    """VDN: per-agent Q networks summed into the team value."""
    config = config or VDNConfig()
    n, d, qnet, greedy, explore = _q_parts(env, config, group, num_cells)
    loss = VDNLoss(qnet, n, config, group=group)
    _on_env_device(env, loss, explore)
    return OffPolicyParts(TensorDictSequential(greedy, explore), explore, loss, config, recurrent=config.recurrent)


class _TanhBounds(nn.Module):
    """``low + (tanh(x) + 1) / 2 * (high - low)``: a deterministic action inside the spec's bounds
    (BenchMARL's ``TanhDelta``, ``use_tanh_mapping: True``)."""

    def __init__(self, low: torch.Tensor, high: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("low", low.clone())
        self.register_buffer("high", high.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.low + (torch.tanh(x) + 1.0) * 0.5 * (self.high - self.low)

    def seed_stacked_forward(self, params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """``forward`` of seed-stacked copies (``SeedStackedModule``): ``x`` ``[n_seeds, *B, n, a]``,
        ``params["low"]`` / ``["high"]`` ``[n_seeds, n, a]``."""
        view = (x.shape[0], *([1] * (x.ndim - 3)), *x.shape[-2:])
        low, high = params["low"].reshape(view), params["high"].reshape(view)
        return low + (torch.tanh(x) + 1.0) * 0.5 * (high - low)


class _ObsAction(nn.Module):
    """A critic ``net`` on each agent's flattened observation joined with its action."""

    def __init__(self, net: nn.Module, obs_dims: int) -> None:
        super().__init__()
        self.net, self.obs_dims = net, obs_dims

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        if self.obs_dims > 1:
            obs = obs.flatten(-self.obs_dims)
        return self.net(torch.cat([obs, action.to(obs.dtype)], -1))

    def seed_stacked_forward(self, params: dict[str, torch.Tensor], obs: torch.Tensor,
                             action: torch.Tensor) -> torch.Tensor:
        """``forward`` of seed-stacked copies (``SeedStackedModule``, inputs ``[n_seeds, *B, n, ...]``):
        the :class:`MultiAgentMLP`'s own batched path on the joined input."""
        if self.obs_dims > 1:
            obs = obs.flatten(-self.obs_dims)
        net = {n.removeprefix("net."): t for n, t in params.items()}
        return type(self.net).seed_stacked_forward(self.net, net, torch.cat([obs, action.to(obs.dtype)], -1))


def _bounds(spec: Bounded) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-agent ``(low, high)`` ``[n_agents, action_dim]`` of a group's ``Bounded`` spec."""
    return (spec.low.reshape(-1, *spec.shape[-2:])[0], spec.high.reshape(-1, *spec.shape[-2:])[0])


def _qvalue(env, group: str, config: DDPGConfig | SACConfig, num_cells: Sequence[int]) -> TensorDictModule:
    """The critic ``Q_i``: centralised (every agent's observation and action) or local."""
    n, d, spec = group_dims(env, group)
    mlp = MultiAgentMLP(d + spec.shape[-1], 1, n, config.centralised_critic, config.share_param_critic, num_cells)
    return TensorDictModule(_ObsAction(mlp, len(_obs_shape(env, group)[1])),
                            in_keys=[(group, OBSERVATION), (group, ACTION)], out_keys=[(group, "state_action_value")])


def _group_keys(group: str, **extra) -> dict:
    """Core loss keys rebound under ``group`` (read on :func:`~tdrl.marl.objectives.agent_view`)."""
    return {"action": (group, ACTION), "reward": (group, REWARD), "terminated": (group, TERMINATED),
            "priority": (group, "td_error"), **extra}


def _ddpg(env, config: DDPGConfig, group: str, num_cells: Sequence[int], name: str) -> OffPolicyParts:
    n, d, spec = group_dims(env, group)
    require_actions(env, group, name, continuous=True)
    low, high = _bounds(spec)
    net = nn.Sequential(_agent_net(env, group, MultiAgentMLP(d, spec.shape[-1], n, False, config.share_param_actor,
                                                             num_cells)), _TanhBounds(low, high))
    actor = TensorDictModule(net, in_keys=[(group, OBSERVATION)], out_keys=[(group, ACTION)])
    core = DDPGLoss(actor, _qvalue(env, group, config, num_cells), gamma=config.gamma,
                    loss_function=config.loss_function, delay_actor=config.delay_actor)
    core.set_keys(**_group_keys(group, state_action_value=(group, "state_action_value")))
    explore = AdditiveGaussianModule(config.sigma_init, config.sigma_end, config.sigma_anneal_frames, low=low,
                                     high=high, action_key=(group, ACTION))
    loss = AgentLoss(core, group)
    _on_env_device(env, loss, explore)
    return OffPolicyParts(TensorDictSequential(actor, explore), explore, loss, config)


def make_maddpg(env, config: DDPGConfig | None = None, group: str = GROUP,
                num_cells: Sequence[int] = (256, 256)) -> OffPolicyParts:
    """MADDPG: a deterministic tanh-bounded actor per agent, Gaussian exploration noise and a
    centralised critic on every agent's observation and action (core's ``DDPGLoss``)."""
    return _ddpg(env, config or MADDPGConfig(), group, num_cells, "MADDPG")


def make_iddpg(env, config: DDPGConfig | None = None, group: str = GROUP,
               num_cells: Sequence[int] = (256, 256)) -> OffPolicyParts:
    """IDDPG: :func:`make_maddpg` with a local critic ``Q_i(o_i, a_i)``."""
    return _ddpg(env, config or IDDPGConfig(), group, num_cells, "IDDPG")


def _sac(env, config: SACConfig, group: str, num_cells: Sequence[int], name: str) -> OffPolicyParts:
    require_actions(env, group, name, continuous=True)
    actor = _actor(env, group, config.share_param_actor, num_cells)
    core = SACLoss(actor, _qvalue(env, group, config, num_cells), gamma=config.gamma,
                   num_qvalue_nets=config.num_qvalue_nets, alpha_init=config.alpha_init,
                   fixed_alpha=config.fixed_alpha, target_entropy=config.target_entropy,
                   loss_function=config.loss_function, min_alpha=config.min_alpha, max_alpha=config.max_alpha)
    core.set_keys(**_group_keys(group, state_action_value=(group, "state_action_value")))
    loss = AgentLoss(core, group)
    _on_env_device(env, loss)
    return OffPolicyParts(actor, None, loss, config)


def make_masac(env, config: SACConfig | None = None, group: str = GROUP,
               num_cells: Sequence[int] = (256, 256)) -> OffPolicyParts:
    """MASAC: a TanhNormal actor per agent and centralised twin critics (core's ``SACLoss``,
    the temperature tuned towards minus one agent's action dim)."""
    return _sac(env, config or MASACConfig(), group, num_cells, "MASAC")


def make_isac(env, config: SACConfig | None = None, group: str = GROUP,
              num_cells: Sequence[int] = (256, 256)) -> OffPolicyParts:
    """ISAC: :func:`make_masac` with local critics ``Q_i(o_i, a_i)``."""
    return _sac(env, config or ISACConfig(), group, num_cells, "ISAC")


def make_iql(env, config: IQLConfig | None = None, group: str = GROUP,
             num_cells: Sequence[int] = (256, 256)) -> OffPolicyParts:
    """IQL: independent per-agent DQN (core's ``DQNLoss``) with epsilon-greedy exploration;
    illegal next actions are masked where the group has an ``action_mask``."""
    config = config or IQLConfig()
    _, _, qnet, greedy, explore = _q_parts(env, config, group, num_cells, "IQL")
    mask = _mask_key(env, group)
    core = DQNLoss(qnet, gamma=config.gamma, double_dqn=config.double_dqn, loss_function=config.loss_function,
                   use_action_mask=mask is not None)
    core.set_keys(**_group_keys(group, action_value=(group, ACTION_VALUE), action_mask=(group, ACTION_MASK)))
    loss = AgentLoss(core, group)
    _on_env_device(env, loss, explore)
    return OffPolicyParts(TensorDictSequential(greedy, explore), explore, loss, config)


class Algorithm(NamedTuple):
    """What the runner needs to know of an algorithm."""

    build: Callable
    """``build(env, config, group, **kwargs) -> parts`` (e.g. :func:`make_mappo`)."""
    config_class: type
    """Its config dataclass (``MAPPOConfig``, ...)."""
    on_policy: bool
    """Trained by ``train_on_policy`` (else ``train_off_policy``)."""
    continuous: bool = True
    """The action kind the runner builds the tasks with (continuous, else discrete);
    :func:`require_actions` refuses the other kind."""
    vectorisable: bool = True
    """Its seeds can train as one stacked model (:func:`~tdrl.marl.vectorised.make_vectorised_groups`);
    otherwise the runner trains them one after another."""


ALGORITHMS: dict[str, Algorithm] = {
    "mappo": Algorithm(make_mappo, MAPPOConfig, on_policy=True),
    "ippo": Algorithm(make_ippo, IPPOConfig, on_policy=True),
    "qmix": Algorithm(make_qmix, QMIXConfig, on_policy=False, continuous=False),
    "vdn": Algorithm(make_vdn, VDNConfig, on_policy=False, continuous=False),
    "maddpg": Algorithm(make_maddpg, MADDPGConfig, on_policy=False),
    "iddpg": Algorithm(make_iddpg, IDDPGConfig, on_policy=False),
    "masac": Algorithm(make_masac, MASACConfig, on_policy=False),
    "isac": Algorithm(make_isac, ISACConfig, on_policy=False),
    "iql": Algorithm(make_iql, IQLConfig, on_policy=False, continuous=False),
}
"""``name -> Algorithm(build, config_class, on_policy, continuous, vectorisable)``."""


def make_groups(algorithm: str | Callable, env, config=None, groups: Sequence[str] | None = None,
                **kwargs) -> dict[str, OnPolicyParts | OffPolicyParts]:
    """One bundle per agent group: ``{group: make_<algorithm>(env, config, group, **kwargs)}``.

    Args:
        algorithm: a name from :data:`ALGORITHMS` or a builder such as :func:`make_mappo`.
        env: a multi-agent env (``VmasEnv``/``PettingZooEnv``, optionally batched).
        config: the algorithm's config, shared by the groups (None: its defaults).
        groups: which groups (default: all of :func:`env_groups`).
        **kwargs: passed to the builder (``num_cells``, ...).

    Returns:
        ``{group: parts}``, to pass to ``train_on_policy`` / ``train_off_policy``. Each group
        has its own networks (groups may differ in agents, observations and actions).
    """
    if isinstance(algorithm, str):
        if algorithm not in ALGORITHMS:
            raise ValueError(f"Unknown algorithm {algorithm!r}; valid: {', '.join(sorted(ALGORITHMS))}.")
        algorithm = ALGORITHMS[algorithm].build
    groups = list(groups) if groups is not None else env_groups(env)
    if not groups:
        raise ValueError("The env has no agent group (no top-level entry with an 'observation').")
    return {g: algorithm(env, config, g, **kwargs) for g in groups}
