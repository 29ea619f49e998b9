"""QMIX (Rashid et al., 2018, arXiv:1803.11485) and VDN (Sunehag et al., 2017,
arXiv:1706.05296): per-agent Q networks trained through a mixer on the team TD target.

``Q_tot(s, a) = mixer(Q_1(o_1, a_1), ..., Q_n(o_n, a_n); s)`` is regressed on
``r + gamma * (1 - terminated) * mixer'(max_a Q'_i(o'_i, a); s')`` with frozen targets
(update with :class:`~tdrl.core.objectives.SoftUpdate` or ``HardUpdate``). The team reward
is the mean of the agents' rewards (``("next", group, "reward")``) or the shared
``("next", "reward")``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDict, TensorDictBase
from torch import Tensor, nn

from tdrl.core.objectives._nets import run_module
from tdrl.core.objectives.common import LossModule, check_distance, distance_loss
from tdrl.core.objectives.dqn import gather_action_value
from tdrl.core.values._utils import NestedKey

from ..keys import ACTION, ACTION_MASK, ACTION_VALUE, GROUP, NEXT, OBSERVATION, REWARD, TERMINATED
from ..modules.mixers import QMixer, VDNMixer
from ..modules.recurrent import recurrent_layers, recurrent_view

__all__ = ["QMIXConfig", "VDNConfig", "QMIXLoss", "VDNLoss", "ValueDecompositionKeys"]


@dataclass
class QMIXConfig:
    """Hyper-parameters of QMIX (defaults follow BenchMARL's ``QmixConfig``).

    Args:
        gamma: discount.
        loss_function: ``"l2"`` (0.5 x squared error), ``"mse"`` (TorchRL's ``"l2"``), ``"l1"`` or ``"smooth_l1"``.
        double_q: choose the next actions with the online Q nets, evaluate with the targets.
        mixing_embed_dim: width of QMIX's mixing layer.
        hypernet_hidden: hidden size of the mixer's two-layer hypernetworks (PyMARL's);
            None: one linear layer each, as TorchRL's ``QMixer`` in BenchMARL's QMIX.
        share_params: one Q network for all agents.
        tau: Polyak weight of the target update after each optimiser step.
        eps_init, eps_end, eps_anneal_frames: epsilon-greedy exploration schedule.
        recurrent: recurrent per-agent Q networks (a GRU or LSTM, then the MLP), trained on
            whole stored trajectories as BenchMARL does with ``model=layers/gru``: the replay
            holds each sub-env's batch as one sequence (the env needs core's ``InitTracker``).
        rnn: ``"gru"`` or ``"lstm"`` (with ``recurrent``). rnn_hidden: their hidden size (128,
            BenchMARL's ``layers/gru.yaml``).
    """

    gamma: float = 0.99
    loss_function: str = "l2"
    double_q: bool = False
    mixing_embed_dim: int = 32
    hypernet_hidden: int | None = 64
    share_params: bool = True
    tau: float = 0.005
    eps_init: float = 0.8
    eps_end: float = 0.01
    eps_anneal_frames: int = 100_000
    recurrent: bool = False
    rnn: str = "gru"
    rnn_hidden: int = 128

    def __post_init__(self) -> None:
        if self.rnn not in ("gru", "lstm") or self.rnn_hidden < 1:
            raise ValueError(f"rnn must be 'gru' or 'lstm' and rnn_hidden >= 1, got {self.rnn!r}, {self.rnn_hidden}.")
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma}.")
        if not 0.0 < self.tau <= 1.0:
            raise ValueError(f"tau must be in (0, 1], got {self.tau}.")
        if not 0.0 <= self.eps_end <= self.eps_init <= 1.0:
            raise ValueError(f"need 0 <= eps_end <= eps_init <= 1, got {self.eps_end}, {self.eps_init}.")
        check_distance(self.loss_function)


@dataclass
class VDNConfig(QMIXConfig):
    """QMIX's hyper-parameters; VDN's mixer is a sum, so ``mixing_embed_dim`` is unused."""


@dataclass
class ValueDecompositionKeys:
    """Keys of :class:`QMIXLoss` / :class:`VDNLoss`. ``state=None`` mixes on every agent's
    observation (``(group, "observation")``), as BenchMARL does when a task has no state."""

    action: NestedKey = (GROUP, ACTION)
    action_value: NestedKey = (GROUP, ACTION_VALUE)
    action_mask: NestedKey = (GROUP, ACTION_MASK)
    observation: NestedKey = (GROUP, OBSERVATION)
    state: NestedKey | None = None
    reward: NestedKey = (GROUP, REWARD)
    terminated: NestedKey = TERMINATED


class _ValueDecompositionLoss(LossModule):
    Keys = ValueDecompositionKeys
    config_class: type = QMIXConfig

    def __init__(self, local_value_network, mixer: nn.Module, config=None, *, group: str = GROUP,
                 check_finite: bool = False) -> None:
        super().__init__(check_finite)
        self.config = config if config is not None else self.config_class()
        if group != GROUP:  # every per-agent key moves under the group
            self.set_keys(**{f: (group, k[-1]) for f, k in vars(ValueDecompositionKeys()).items()
                             if isinstance(k, tuple) and k[0] == GROUP})
        self.group = group
        self.local_value_network, self.mixer = local_value_network, mixer
        self._add_target("local_value_network", local_value_network)
        self._add_target("mixer", mixer)
        # a Q network with recurrent layers in sequence mode: batches are [*B, T] trajectories
        self.recurrent = any(m.recurrent_mode for m in recurrent_layers(local_value_network))

    def _sequence_q(self, net, td: TensorDictBase) -> TensorDictBase:
        """``net`` over ``td``'s trajectories ``[*B, T]`` (each row from its stored first state,
        reset at ``is_init``): its outputs, with the state after every step under ``"next"``."""
        return net(td.exclude(NEXT))

    def _after(self, next_td: TensorDictBase, sequence_out: TensorDictBase, net) -> TensorDictBase:
        """``next_td`` with the recurrent states the sequence pass reached after each step (not
        the ones stored at collection time) and no episode start: one step from there is the
        next observation's value, exactly as an unbroken rollout would compute it."""
        nxt = next_td.copy()
        for layer in recurrent_layers(net):
            for key in layer.state_keys:
                nxt.set(key, sequence_out.get((NEXT, *self._tuple(key))).detach())
            nxt.set(layer.is_init_key, torch.zeros_like(sequence_out.get(layer.is_init_key)))
        return nxt

    def _q_values(self, net, td: TensorDictBase) -> Tensor:
        return run_module(net, td, self.tensor_keys.action_value, type(self).__name__)

    def _state(self, td: TensorDictBase) -> Tensor:
        k = self.tensor_keys
        return self._get(td, "state" if k.state is not None else "observation")

    def team_reward(self, td: TensorDictBase) -> Tensor:
        """The reward the mixed value is trained on, ``[*B, 1]``: the mean of the group's
        rewards ``("next", group, "reward")``, or the shared ``("next", "reward")``."""
        r = td.get((NEXT, *self._tuple(self.tensor_keys.reward)), None)
        if r is None:
            r = td.get((NEXT, REWARD), None)
            if r is None:
                raise KeyError(f"{type(self).__name__} needs ('next', *{self.tensor_keys.reward!r}) "
                               "or ('next', 'reward').")
            return r.reshape(*td.shape, 1)
        return r.reshape(*td.shape, -1).mean(-1, keepdim=True)

    @staticmethod
    def _tuple(key) -> tuple:
        return (key,) if isinstance(key, str) else tuple(key)

    def forward(self, td: TensorDictBase) -> TensorDict:
        """TD loss of the mixed value for a batch of transitions ``td`` (batch ``[*B]``).

        Returns:
            ``loss_qvalue`` and diagnostics ``q_tot_mean``, ``target_mean``, ``td_error``.
        """
        c = self.config
        if self.recurrent:
            if td.batch_dims < 2:
                raise ValueError(f"{type(self).__name__} with recurrent Q networks trains on trajectories [B, T]; got "
                                 f"a batch {tuple(td.shape)} (single transitions would be read as one sequence).")
            online = self._sequence_q(self.local_value_network, td)
            q = online.get(self.tensor_keys.action_value)  # [*B, T, n, A]
        else:
            q = self._q_values(self.local_value_network, td)  # [*B, n, A]
        chosen = gather_action_value(q, self._get(td, "action"))  # [*B, n, 1]
        q_tot = self.mixer(chosen, self._state(td))  # [*B, 1]
        next_td = self._next_td(td)
        with torch.no_grad():
            if self.recurrent:  # one step past the states each network's sequence pass reached
                target_net = self.target_local_value_network
                after = self._after(next_td, self._sequence_q(target_net, td), target_net)
                next_q = self._q_values(recurrent_view(target_net, False), after)
                selector = (self._q_values(recurrent_view(self.local_value_network, False),
                                           self._after(next_td, online, self.local_value_network))
                            if c.double_q else next_q)
            else:
                next_q = self._q_values(self.target_local_value_network, next_td)
                selector = self._q_values(self.local_value_network, next_td) if c.double_q else next_q
            mask = next_td.get(self.tensor_keys.action_mask, None)
            if mask is not None:
                selector = selector.masked_fill(~mask.bool(), torch.finfo(selector.dtype).min)
            next_chosen = next_q.gather(-1, selector.argmax(-1, keepdim=True))
            next_tot = self.target_mixer(next_chosen, self._state(next_td))
            terminated = next_td.get(self.tensor_keys.terminated).reshape(next_tot.shape)
            target = self.team_reward(td) + c.gamma * (~terminated.bool()).to(next_tot.dtype) * next_tot
        loss = distance_loss(q_tot, target, c.loss_function).mean()
        return self._output({
            "loss_qvalue": loss,
            "q_tot_mean": q_tot.mean(),
            "target_mean": target.mean(),
            "td_error": (q_tot - target).abs().mean(),
        })


class QMIXLoss(_ValueDecompositionLoss):
    """QMIX loss.

    Args:
        local_value_network: a TensorDict module writing ``(group, "action_value")``
            ``[*B, n_agents, n_actions]`` (e.g. a :class:`~tdrl.marl.modules.MultiAgentMLP`).
        mixer: a :class:`~tdrl.marl.modules.QMixer` (``(q [*B, n, 1], state) -> [*B, 1]``).
        config: :class:`QMIXConfig`.
        group: the group key; every per-agent key (action, action_value, action_mask,
            observation, reward) is read under it.
    """

    config_class = QMIXConfig

    def __init__(self, local_value_network, mixer: QMixer, config: QMIXConfig | None = None, **kw) -> None:
        if not isinstance(mixer, QMixer):
            raise TypeError(f"QMIXLoss needs a QMixer, got {type(mixer).__name__}; use VDNLoss for sums.")
        super().__init__(local_value_network, mixer, config, **kw)


class VDNLoss(_ValueDecompositionLoss):
    """VDN loss: :class:`QMIXLoss` with ``Q_tot = sum_i Q_i`` (a :class:`VDNMixer`)."""

    config_class = VDNConfig

    def __init__(self, local_value_network, n_agents: int, config: VDNConfig | None = None, **kw) -> None:
        super().__init__(local_value_network, VDNMixer(n_agents), config, **kw)
