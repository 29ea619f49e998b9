"""DreamerV3 losses (Hafner et al., 2023): the world-model loss with free-bits KL balancing,
and the actor and critic losses on trajectories imagined in the model.

:class:`DreamerV3` holds the networks (encoder, :class:`~tdrl.core.modules.world_model.RSSM`,
decoder, two-hot reward head, continue head, actor, two-hot critic and its slow EMA copy, the
percentile return normaliser) and computes

* ``world_model_loss(batch)`` on sequences ``[B, L]`` sampled by a
  :class:`~tdrl.core.replay.SliceSampler` (keys ``observation``, ``action``,
  ``("next", "observation" | "reward" | "terminated")``): decoder symlog MSE, two-hot reward
  cross-entropy, continue BCE, ``0.5 * max(1, KL[sg(q) || p]) + 0.1 * max(1, KL[q || sg(p)])``;
* ``actor_critic_loss(h, z)`` from the posterior states: imagine ``horizon`` steps, lambda
  returns with :func:`tdrl.core.values.functional.td_lambda_return`, an actor loss (dynamics
  backprop for continuous actions, REINFORCE for discrete ones, as the paper's defaults) on
  returns scaled by ``1 / max(1, S)``, entropy bonus ``3e-4``, and a two-hot critic loss
  towards the returns plus a regulariser towards the slow critic.

Each loss returns a TensorDict (``loss_*`` entries are the terms, the rest diagnostics).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDict
from torch import Tensor, nn

from tdrl.core.modules.world_model import RSSM, DreamerActor, ReturnNormalizer, TwoHot, norm_mlp, symlog
from tdrl.core.values.functional import td_lambda_return

__all__ = ["DreamerConfig", "DreamerV3", "categorical_kl", "kl_balance", "imagined_lambda_return"]


def categorical_kl(p_logits: Tensor, q_logits: Tensor) -> Tensor:
    """``KL(p || q)`` of categoricals given as log-probabilities ``[*B, S, K]``, summed over the
    ``S`` latents -> ``[*B]``."""
    return (p_logits.exp() * (p_logits - q_logits)).sum((-2, -1))


def kl_balance(post: Tensor, prior: Tensor, dyn_scale: float = 0.5, rep_scale: float = 0.1,
               free_bits: float = 1.0) -> tuple[Tensor, Tensor, Tensor]:
    """DreamerV3's KL balancing with free bits (paper eq. 5).

    ``dyn_scale * max(free, KL[sg(q) || p]) + rep_scale * max(free, KL[q || sg(p)])``: the
    dynamics term trains the prior towards the posterior, the representation term the
    posterior towards the prior; below ``free_bits`` nats a term has no gradient.

    Args:
        post, prior: log-probabilities ``[*B, S, K]`` of ``q(z | h, e)`` and ``p(z | h)``.

    Returns:
        ``(loss [*B], dyn KL [*B], rep KL [*B])`` (the KLs before clipping, detached).
    """
    dyn = categorical_kl(post.detach(), prior)
    rep = categorical_kl(post, prior.detach())
    loss = dyn_scale * dyn.clamp(min=free_bits) + rep_scale * rep.clamp(min=free_bits)
    return loss, dyn.detach(), rep.detach()


def imagined_lambda_return(reward: Tensor, next_value: Tensor, cont: Tensor, gamma: float,
                           lmbda: float) -> Tensor:
    """Dreamer's lambda return ``R_t = r_t + gamma c_t ((1 - lmbda) v_{t+1} + lmbda R_{t+1})``,
    ``R_{H-1}`` bootstrapping from ``v_H``, via tdrl's TD(lambda) (a continue flag of 0 is a
    termination).

    Args:
        reward, next_value: ``[N, H, 1]`` (``reward[:, t]`` and ``next_value[:, t]`` belong to
            the state reached by action ``t``).
        cont: ``[N, H, 1]`` bool, False where that state is terminal.

    Returns:
        ``[N, H, 1]`` returns.
    """
    ended = ~cont.bool()
    return td_lambda_return(reward, next_value, ended, ended, gamma, lmbda)


@dataclass
class DreamerConfig:
    """Sizes and coefficients of :class:`DreamerV3` (defaults: the paper's, model size S)."""

    deter: int = 512
    stoch: int = 32
    classes: int = 32
    hidden: int = 512
    layers: int = 2
    unimix: float = 0.01
    bins: int = 255
    horizon: int = 15
    gamma: float = 0.997
    lmbda: float = 0.95
    entropy: float = 3e-4
    dyn_scale: float = 0.5
    rep_scale: float = 0.1
    free_bits: float = 1.0
    slow_critic_decay: float = 0.98
    slow_reg: float = 1.0
    return_decay: float = 0.99
    imag_starts: int = 0
    """Posterior states to imagine from per update (a random subset; 0: all of them, as the paper)."""


class DreamerV3(nn.Module):
    """The DreamerV3 agent's networks and losses (see the module docstring).

    Args:
        obs_dim: size of the state observation vector.
        action_dim: action size.
        discrete: one-hot actions (REINFORCE) instead of continuous ones in ``[-1, 1]``
            (dynamics backprop).
        cfg: sizes and coefficients.
    """

    def __init__(self, obs_dim: int, action_dim: int, discrete: bool = False,
                 cfg: DreamerConfig | None = None) -> None:
        super().__init__()
        cfg = cfg or DreamerConfig()
        self.cfg, self.discrete, self.action_dim = cfg, discrete, action_dim
        hid, lay = cfg.hidden, cfg.layers
        self.encoder = norm_mlp(obs_dim, hid, hid, lay - 1) if lay > 1 else nn.Linear(obs_dim, hid)
        self.rssm = RSSM(action_dim, hid, cfg.deter, cfg.stoch, cfg.classes, hid, cfg.unimix)
        f = self.rssm.feature_dim
        self.decoder = norm_mlp(f, obs_dim, hid, lay)
        self.twohot = TwoHot(cfg.bins)
        self.reward_head = norm_mlp(f, cfg.bins, hid, lay, zero_last=True)
        self.cont_head = norm_mlp(f, 1, hid, lay)
        self.actor = DreamerActor(f, action_dim, hid, lay, discrete, unimix=cfg.unimix)
        self.critic = norm_mlp(f, cfg.bins, hid, lay, zero_last=True)
        self.slow_critic = norm_mlp(f, cfg.bins, hid, lay, zero_last=True)
        self.slow_critic.load_state_dict(self.critic.state_dict())
        self.slow_critic.requires_grad_(False)
        self.normalizer = ReturnNormalizer(cfg.return_decay)

    def world_model_parameters(self) -> list[nn.Parameter]:
        return [p for m in (self.encoder, self.rssm, self.decoder, self.reward_head, self.cont_head)
                for p in m.parameters()]

    def embed(self, obs: Tensor) -> Tensor:
        return self.encoder(symlog(obs))

    # ------------------------------------------------------------------ world model
    def world_model_loss(self, batch: TensorDict) -> tuple[TensorDict, tuple[Tensor, Tensor]]:
        """World-model loss on sequences ``[B, L]``.

        The model filters ``o_0 .. o_L`` (the slice's observations and its last next
        observation) with actions ``0, a_0 .. a_{L-1}``; states ``1..L`` predict the rewards
        and continue flags of the transitions leading to them.

        Returns:
            The loss TensorDict, and the posterior ``(h, z)`` ``[B * (L + 1), *]`` (detached),
            the start states of the imagination.
        """
        obs, action = batch["observation"], batch["action"].float()
        if obs.ndim != 3:
            raise ValueError(f"DreamerV3.world_model_loss: expected sequences [B, L, D], got an "
                             f"observation of shape {tuple(obs.shape)} (sample with a SliceSampler).")
        obs = torch.cat([obs[:, :1], batch["next", "observation"]], 1)
        prev = torch.cat([torch.zeros_like(action[:, :1]), action], 1)
        post = self.rssm.observe(self.embed(obs), prev)
        feat = torch.cat([post["h"], post["z"]], -1)
        dec = (self.decoder(feat) - symlog(obs)).pow(2).sum(-1).mean()
        reward = batch["next", "reward"].squeeze(-1).float()
        rew = self.twohot.loss(self.reward_head(feat[:, 1:]), reward).mean()
        cont_target = (~batch["next", "terminated"].squeeze(-1).bool()).float()
        cont = nn.functional.binary_cross_entropy_with_logits(
            self.cont_head(feat[:, 1:]).squeeze(-1), cont_target)
        c = self.cfg
        kl, dyn, rep = kl_balance(post["post"], post["prior"], c.dyn_scale, c.rep_scale, c.free_bits)
        out = TensorDict({"loss_decoder": dec, "loss_reward": rew, "loss_cont": cont,
                          "loss_kl": kl.mean(), "kl_dyn": dyn.mean(), "kl_rep": rep.mean()}, [])
        start = (post["h"].detach().flatten(0, 1), post["z"].detach().flatten(0, 1))
        return out, start

    # ------------------------------------------------------------------ behaviour
    def value(self, feat: Tensor, slow: bool = False) -> Tensor:
        return self.twohot.decode((self.slow_critic if slow else self.critic)(feat))

    def actor_critic_loss(self, h: Tensor, z: Tensor) -> TensorDict:
        """Actor and critic losses on ``horizon``-step imagined trajectories from ``(h, z)`` ``[N, *]``.

        The gradient of ``loss_actor`` must only reach the actor's parameters (call
        ``backward(inputs=actor params)``): with dynamics backprop it flows through the
        world model and the critic, which are not trained by it.
        """
        c = self.cfg
        if 0 < c.imag_starts < h.shape[0]:
            pick = torch.randperm(h.shape[0], device=h.device)[:c.imag_starts]
            h, z = h[pick], z[pick]
        backprop = not self.discrete
        policy = (lambda f: self.actor(f)[0]) if backprop else (lambda f: self.actor(f)[0].detach())
        with torch.set_grad_enabled(backprop):
            feats, actions = self.rssm.imagine(h.detach(), z.detach(), policy, c.horizon)
        nxt = feats[:, 1:]
        reward = self.twohot.decode(self.reward_head(nxt)).unsqueeze(-1)
        cont = (self.cont_head(nxt) > 0).detach()
        value_next = self.value(nxt).unsqueeze(-1)
        ret = imagined_lambda_return(reward, value_next, cont, c.gamma, c.lmbda)  # [N, H, 1]
        # weight of state t: it is reached (no termination before it)
        alive = torch.cat([torch.ones_like(cont[:, :1]), cont[:, :-1]], 1).float()
        weight = alive.cumprod(1).squeeze(-1)
        scale = self.normalizer.update(ret)
        start = feats[:, :-1]
        dist = self.actor.dist(start if backprop else start.detach())
        ent = dist.entropy() if self.discrete else dist.entropy().sum(-1)
        if backprop:
            objective = ret.squeeze(-1) / scale
        else:
            base = self.value(start.detach()).detach()
            adv = ((ret.squeeze(-1) - base) / scale).detach()
            objective = dist.log_prob(actions.detach()) * adv
        loss_actor = -(weight * (objective + c.entropy * ent)).mean()
        sfeat, target = start.detach(), ret.squeeze(-1).detach()
        logits = self.critic(sfeat)
        slow_target = self.value(sfeat, slow=True).detach()
        critic = self.twohot.loss(logits, target) + c.slow_reg * self.twohot.loss(logits, slow_target)
        loss_critic = (weight.detach() * critic).mean()
        return TensorDict({"loss_actor": loss_actor, "loss_critic": loss_critic,
                           "return_scale": scale.detach(), "imag_return": ret.mean().detach(),
                           "imag_reward": reward.mean().detach(), "entropy": ent.mean().detach()}, [])

    @torch.no_grad()
    def update_slow_critic(self) -> None:
        """``slow <- decay * slow + (1 - decay) * critic`` (paper: decay 0.98 every update)."""
        d = self.cfg.slow_critic_decay
        for s, p in zip(self.slow_critic.parameters(), self.critic.parameters()):
            s.mul_(d).add_(p.detach(), alpha=1 - d)

    # ------------------------------------------------------------------ acting
    @torch.no_grad()
    def act(self, obs: Tensor, state: tuple[Tensor, Tensor, Tensor], deterministic: bool = False):
        """One environment step of the agent: filter ``obs`` ``[N, D]`` with the previous
        ``state = (h, z, previous action)`` and pick an action.

        Returns:
            ``(action [N, A], new state)``.
        """
        h, z, prev = state
        h, z, _, _ = self.rssm.obs_step(h, z, prev, self.embed(obs))
        feat = torch.cat([h, z], -1)
        a = self.actor.mode(feat) if deterministic else self.actor(feat)[0]
        return a, (h, z, a)

    def initial_state(self, n: int, device=None) -> tuple[Tensor, Tensor, Tensor]:
        h, z = self.rssm.initial(n, device)
        return h, z, torch.zeros(n, self.action_dim, device=device)
