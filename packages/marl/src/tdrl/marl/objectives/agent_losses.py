"""MADDPG, IDDPG, MASAC, ISAC and IQL: core's DDPG / SAC / DQN losses on one agent group.

No formula lives here. :class:`AgentLoss` hands a core loss
(:class:`~tdrl.core.objectives.DDPGLoss`, :class:`~tdrl.core.objectives.SACLoss`,
:class:`~tdrl.core.objectives.DQNLoss`) the group's transitions with the agents as a batch dim
(:func:`agent_view`: batch ``[*B, n_agents]``), so every per-agent term (``Q_i``, the TD target
``r_i + gamma (1 - terminated) Q'_i``, ``log pi_i``) is a row of the core loss. What makes the
multi-agent variants differ is only the critic's input, built in :mod:`tdrl.marl.algorithms`:

* MADDPG (Lowe et al., 2017, arXiv:1706.02275) and MASAC: a centralised critic ``Q_i(o_1..o_n,
  a_1..a_n)`` (a centralised :class:`~tdrl.marl.modules.MultiAgentMLP` on every agent's
  observation and action; with ``share_param_critic`` one value shared by the agents);
* IDDPG, ISAC: a local critic ``Q_i(o_i, a_i)``; IQL (Tan, 1993): per-agent DQN on ``Q_i(o_i, .)``.

The defaults are BenchMARL 1.5's (``benchmarl/conf/algorithm/{maddpg,iddpg,masac,isac,iql}.yaml``
and ``conf/experiment/base_experiment.yaml``; cited per field).
"""

from __future__ import annotations

from dataclasses import dataclass

from tensordict import TensorDict, TensorDictBase
from torch import Tensor, nn

from tdrl.core.objectives import DISTANCE_KINDS, LossModule

from ..keys import NEXT, OBSERVATION, TERMINATED

__all__ = ["DDPGConfig", "MADDPGConfig", "IDDPGConfig", "SACConfig", "MASACConfig", "ISACConfig", "IQLConfig",
           "AgentLoss", "agent_view"]


def _check_common(c) -> None:
    if not 0.0 <= c.gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {c.gamma}.")
    if not 0.0 < c.tau <= 1.0:
        raise ValueError(f"tau must be in (0, 1], got {c.tau}.")
    if c.loss_function not in DISTANCE_KINDS:
        raise ValueError(f"loss_function must be one of {', '.join(map(repr, DISTANCE_KINDS))}, got {c.loss_function!r}.")


@dataclass
class DDPGConfig:
    """MADDPG / IDDPG settings (BenchMARL 1.5's ``maddpg.yaml`` / ``iddpg.yaml`` and experiment defaults).

    Args:
        centralised_critic: the critic sees every agent's observation and action (MADDPG)
            or the agent's own (IDDPG).
        gamma: discount (experiment ``gamma: 0.99``).
        loss_function: critic distance (``loss_function: "l2"``).
        share_param_critic: one critic for the group (``share_param_critic: True``).
        share_param_actor: one actor for the group (experiment ``share_policy_params: True``).
        delay_actor: a target actor for the TD target. BenchMARL builds TorchRL's ``DDPGLoss``
            with ``delay_value`` only, whose ``delay_actor`` defaults to False: the online actor.
        tau: Polyak weight of the target update (experiment ``polyak_tau: 0.005``).
        sigma_init, sigma_end, sigma_anneal_frames: the additive Gaussian exploration noise
            (BenchMARL's ``AdditiveGaussianModule`` with ``exploration_eps_init: 0.8``,
            ``exploration_eps_end: 0.01`` and ``exploration_anneal_frames: null``, i.e. a third
            of ``max_n_frames: 3_000_000``; the runner sets a third of its own frames).
    """

    centralised_critic: bool = True
    gamma: float = 0.99
    loss_function: str = "l2"
    share_param_critic: bool = True
    share_param_actor: bool = True
    delay_actor: bool = False
    tau: float = 0.005
    sigma_init: float = 0.8
    sigma_end: float = 0.01
    sigma_anneal_frames: int = 1_000_000

    def __post_init__(self) -> None:
        _check_common(self)
        if not 0.0 <= self.sigma_end <= self.sigma_init:
            raise ValueError(f"need 0 <= sigma_end <= sigma_init, got {self.sigma_end}, {self.sigma_init}.")


@dataclass
class MADDPGConfig(DDPGConfig):
    """MADDPG: :class:`DDPGConfig` with a centralised critic."""


@dataclass
class IDDPGConfig(DDPGConfig):
    """IDDPG: :class:`DDPGConfig` with a local critic."""

    centralised_critic: bool = False


@dataclass
class SACConfig:
    """MASAC / ISAC settings (BenchMARL 1.5's ``masac.yaml`` / ``isac.yaml`` and experiment defaults).

    Args:
        centralised_critic: every agent's observation and action (MASAC) or its own (ISAC).
        gamma: discount (``gamma: 0.99``). loss_function: ``"l2"``.
        share_param_critic: ``True``. share_param_actor: experiment ``share_policy_params: True``.
        num_qvalue_nets: critics, min over them in the targets (``num_qvalue_nets: 2``).
        alpha_init, min_alpha, max_alpha, fixed_alpha: the temperature (``1.0``, ``null``,
            ``null``, ``False``).
        target_entropy: ``"auto"``: minus the action dim of one agent.
        tau: ``polyak_tau: 0.005`` (``delay_qvalue: True``: target critics).

    The actor is a TanhNormal whose scale goes through ``biased_softplus_1.0``
    (``use_tanh_normal: True``, ``scale_mapping``; tensordict's ``NormalParamExtractor``).
    """

    centralised_critic: bool = True
    gamma: float = 0.99
    loss_function: str = "l2"
    share_param_critic: bool = True
    share_param_actor: bool = True
    num_qvalue_nets: int = 2
    alpha_init: float = 1.0
    min_alpha: float | None = None
    max_alpha: float | None = None
    fixed_alpha: bool = False
    target_entropy: float | str = "auto"
    tau: float = 0.005

    def __post_init__(self) -> None:
        _check_common(self)
        if self.num_qvalue_nets < 1:
            raise ValueError(f"num_qvalue_nets must be >= 1, got {self.num_qvalue_nets}.")


@dataclass
class MASACConfig(SACConfig):
    """MASAC: :class:`SACConfig` with a centralised critic."""


@dataclass
class ISACConfig(SACConfig):
    """ISAC: :class:`SACConfig` with a local critic."""

    centralised_critic: bool = False


@dataclass
class IQLConfig:
    """IQL settings (BenchMARL 1.5's ``iql.yaml`` and experiment defaults).

    Args:
        gamma: ``0.99``. loss_function: ``"l2"``. double_dqn: TorchRL's ``DQNLoss`` default
            (False), which BenchMARL keeps. share_params: ``share_policy_params: True``.
        tau: ``polyak_tau: 0.005`` (``delay_value: True``: a target Q network).
        eps_init, eps_end, eps_anneal_frames: epsilon-greedy (``exploration_eps_init: 0.8``,
            ``exploration_eps_end: 0.01``, a third of ``max_n_frames``; the runner sets a third
            of its own frames).
    """

    gamma: float = 0.99
    loss_function: str = "l2"
    double_dqn: bool = False
    share_params: bool = True
    tau: float = 0.005
    eps_init: float = 0.8
    eps_end: float = 0.01
    eps_anneal_frames: int = 1_000_000

    def __post_init__(self) -> None:
        _check_common(self)
        if not 0.0 <= self.eps_end <= self.eps_init <= 1.0:
            raise ValueError(f"need 0 <= eps_end <= eps_init <= 1, got {self.eps_end}, {self.eps_init}.")


def agent_view(td: TensorDictBase, group: str) -> TensorDict:
    """One group's transitions with the agents as a batch dim.

    Args:
        td: transitions with batch ``[*B]``: ``(group, ...)`` ``[*B, n_agents, ...]`` and
            ``("next", group, ...)``; ``("next", group, "terminated")``, or the shared
            ``("next", "terminated")`` ``[*B, 1]``, which is expanded over the agents.

    Returns:
        A TensorDict ``[*B, n_agents]`` holding ``group`` and ``("next", group)`` (shallow
        copies: ``td`` is not modified) and ``("next", group, "terminated")`` ``[*B, n, 1]``.
    """
    cur, nxt = td.get(group).copy(), td.get((NEXT, group)).copy()
    n_agents = cur.get(OBSERVATION).shape[td.ndim]
    shape = (*td.batch_size, n_agents)
    cur.batch_size, nxt.batch_size = shape, shape  # a replay sample may carry the group at batch [*B]
    if TERMINATED not in nxt.keys():
        term = td.get((NEXT, TERMINATED))
        nxt.set(TERMINATED, term.reshape(*td.batch_size, 1, 1).expand(*shape, 1))
    return TensorDict({group: cur, NEXT: TensorDict({group: nxt}, batch_size=shape)}, batch_size=shape)


class AgentLoss(nn.Module):
    """A core off-policy loss applied to one agent group (:func:`agent_view`).

    Args:
        loss: a core loss whose keys are rebound under the group (``DDPGLoss``, ``SACLoss``,
            ``DQNLoss``).
        group: the agent group.

    ``forward(td)`` returns the core loss's output; :meth:`target_pairs` exposes its target
    networks to :class:`~tdrl.core.objectives.SoftUpdate`, and :meth:`clip_groups` the
    trainable parameters of each of its parts (actor, critics, temperature), whose gradient
    norms BenchMARL clips separately (one optimiser per loss term).
    """

    def __init__(self, loss: LossModule, group: str) -> None:
        super().__init__()
        self.loss, self.group = loss, group

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        return self.loss(agent_view(td, self.group))

    def target_pairs(self):
        return self.loss.target_pairs()

    def clip_groups(self) -> list[list[Tensor]]:
        """Trainable parameters of each direct part of the loss (targets are frozen)."""
        groups = [[p for p in part.parameters() if p.requires_grad] for part in self.loss.children()]
        return [g for g in groups if g]
