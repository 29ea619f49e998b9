"""World-model parts of DreamerV3 (Hafner et al., 2023, "Mastering Diverse Domains through
World Models"): symlog / symexp, two-hot bins, unimix categorical latents with straight-through
samples, the RSSM, percentile return normalisation, and the small networks of the agent.

Shapes: features are ``[*B, deter + stoch * classes]`` (the GRU state ``h`` concatenated with
the flattened one-hot latents ``z``); latent logits are ``[*B, stoch, classes]``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

__all__ = [
    "symlog",
    "symexp",
    "TwoHot",
    "unimix_logits",
    "straight_through_sample",
    "norm_mlp",
    "RSSM",
    "ReturnNormalizer",
    "DreamerActor",
]


def symlog(x: Tensor) -> Tensor:
    """``sign(x) * log(1 + |x|)`` (DreamerV3, eq. 9): compresses large magnitudes, identity near 0."""
    return torch.sign(x) * torch.log1p(x.abs())


def symexp(x: Tensor) -> Tensor:
    """The inverse of :func:`symlog`: ``sign(x) * (exp(|x|) - 1)``."""
    return torch.sign(x) * torch.expm1(x.abs())


class TwoHot(nn.Module):
    """Two-hot encoding over ``num_bins`` bins ``B = symexp(linspace(low, high, num_bins))``
    (DreamerV3: 255 bins, -20..20): a scalar ``y`` between bins ``b_k <= y < b_{k+1}`` gets weight
    ``(b_{k+1} - y) / (b_{k+1} - b_k)`` on ``k`` and the rest on ``k + 1``; values outside the
    range put all weight on the end bin. A prediction is ``softmax(logits) @ B``.

    Shapes: ``encode`` ``[*B]`` -> ``[*B, num_bins]``; ``decode`` ``[*B, num_bins]`` logits -> ``[*B]``.
    """

    def __init__(self, num_bins: int = 255, low: float = -20.0, high: float = 20.0) -> None:
        super().__init__()
        if num_bins < 2:
            raise ValueError(f"TwoHot: num_bins={num_bins} is not allowed: expected >= 2.")
        grid = torch.linspace(low, high, num_bins, dtype=torch.float64)
        if low == -high and num_bins % 2:
            grid[num_bins // 2] = 0.0  # an exact zero bin (rewards of 0 are common)
        self.register_buffer("bins", symexp(grid).float(), persistent=False)

    @property
    def num_bins(self) -> int:
        return self.bins.numel()

    def encode(self, y: Tensor) -> Tensor:
        bins = self.bins.to(y.dtype)
        n = bins.numel()
        y = y.clamp(bins[0], bins[-1])
        k = (torch.searchsorted(bins, y.contiguous(), right=True) - 1).clamp(0, n - 2)
        lo, hi = bins[k], bins[k + 1]
        w_hi = ((y - lo) / (hi - lo)).clamp(0.0, 1.0)
        out = torch.zeros(*y.shape, n, dtype=y.dtype, device=y.device)
        out.scatter_(-1, k.unsqueeze(-1), (1.0 - w_hi).unsqueeze(-1))
        out.scatter_add_(-1, (k + 1).unsqueeze(-1), w_hi.unsqueeze(-1))
        return out

    def decode(self, logits: Tensor) -> Tensor:
        return torch.softmax(logits, -1) @ self.bins.to(logits.dtype)

    def loss(self, logits: Tensor, target: Tensor) -> Tensor:
        """Cross-entropy of ``logits`` ``[*B, num_bins]`` against ``twohot(target)`` ``[*B]`` -> ``[*B]``."""
        return -(self.encode(target.detach()) * torch.log_softmax(logits, -1)).sum(-1)


def unimix_logits(logits: Tensor, unimix: float = 0.01) -> Tensor:
    """Log-probabilities of ``(1 - unimix) * softmax(logits) + unimix / K`` over the last dim
    (DreamerV3: 1% uniform mixed into every categorical, so no KL or log-prob goes infinite)."""
    if unimix <= 0:
        return torch.log_softmax(logits, -1)
    probs = (1.0 - unimix) * torch.softmax(logits, -1) + unimix / logits.shape[-1]
    return torch.log(probs)


def straight_through_sample(logits: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """A one-hot sample of ``Categorical(logits)`` (last dim) whose gradient is that of the
    probabilities (straight-through: ``onehot + p - sg(p)``)."""
    probs = torch.softmax(logits, -1)
    flat = probs.reshape(-1, probs.shape[-1])
    idx = torch.multinomial(flat.detach(), 1, generator=generator).reshape(probs.shape[:-1])
    onehot = nn.functional.one_hot(idx, probs.shape[-1]).to(probs.dtype)
    return onehot + (probs - probs.detach())  # exactly one-hot forward


def norm_mlp(in_features: int, out_features: int, hidden: int, layers: int,
             zero_last: bool = False) -> nn.Sequential:
    """``layers`` x (Linear -> LayerNorm -> SiLU) then a Linear (DreamerV3's MLP); ``zero_last``
    zero-initialises the output layer (the paper's reward and critic heads)."""
    mods: list[nn.Module] = []
    d = in_features
    for _ in range(layers):
        mods += [nn.Linear(d, hidden), nn.LayerNorm(hidden), nn.SiLU()]
        d = hidden
    last = nn.Linear(d, out_features)
    if zero_last:
        nn.init.zeros_(last.weight)
        nn.init.zeros_(last.bias)
    mods.append(last)
    return nn.Sequential(*mods)


class RSSM(nn.Module):
    """Recurrent state-space model (Hafner et al., 2019; DreamerV3's discrete variant).

    ``h_t = GRU(h_{t-1}, [z_{t-1}, a_{t-1}])``; prior ``p(z_t | h_t)``; posterior
    ``q(z_t | h_t, e_t)`` with ``e_t`` the embedded observation; ``z_t`` is ``stoch``
    one-hot categoricals of ``classes`` classes, each mixed with ``unimix`` uniform and sampled
    straight-through.

    Args:
        action_dim: action size (one-hot size for discrete actions).
        embed_dim: size of the observation embedding.
        deter: GRU state size.
        stoch, classes: number of categorical latents and their classes (paper: 32 x 32).
        hidden: width of the input / prior / posterior layers.
        unimix: uniform mix of the latent categoricals.
    """

    def __init__(self, action_dim: int, embed_dim: int, deter: int = 512, stoch: int = 32,
                 classes: int = 32, hidden: int = 512, unimix: float = 0.01) -> None:
        super().__init__()
        self.deter, self.stoch, self.classes, self.unimix = deter, stoch, classes, unimix
        self.img_in = nn.Sequential(nn.Linear(stoch * classes + action_dim, hidden),
                                    nn.LayerNorm(hidden), nn.SiLU())
        self.gru = nn.GRUCell(hidden, deter)
        self.prior_net = norm_mlp(deter, stoch * classes, hidden, 1)
        self.post_net = norm_mlp(deter + embed_dim, stoch * classes, hidden, 1)

    @property
    def feature_dim(self) -> int:
        return self.deter + self.stoch * self.classes

    def initial(self, batch: int, device=None) -> tuple[Tensor, Tensor]:
        """Zero ``h`` ``[batch, deter]`` and ``z`` ``[batch, stoch * classes]``."""
        return (torch.zeros(batch, self.deter, device=device),
                torch.zeros(batch, self.stoch * self.classes, device=device))

    def _logits(self, net: nn.Module, x: Tensor) -> Tensor:
        return unimix_logits(net(x).reshape(*x.shape[:-1], self.stoch, self.classes), self.unimix)

    def sample(self, logits: Tensor) -> Tensor:
        """Straight-through one-hot sample, flattened to ``[*B, stoch * classes]``."""
        return straight_through_sample(logits).flatten(-2)

    def img_step(self, h: Tensor, z: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
        """``(h_{t-1}, z_{t-1}, a_{t-1})`` -> ``(h_t, prior logits of z_t)``."""
        h = self.gru(self.img_in(torch.cat([z, action], -1)), h)
        return h, self._logits(self.prior_net, h)

    def obs_step(self, h: Tensor, z: Tensor, action: Tensor, embed: Tensor):
        """One filtering step: returns ``h_t, z_t`` (posterior sample), posterior and prior logits."""
        h, prior = self.img_step(h, z, action)
        post = self._logits(self.post_net, torch.cat([h, embed], -1))
        return h, self.sample(post), post, prior

    def observe(self, embed: Tensor, prev_action: Tensor, state: tuple[Tensor, Tensor] | None = None) -> dict:
        """Filter a sequence: ``embed`` ``[B, T, E]``, ``prev_action`` ``[B, T, A]`` (``a_{t-1}``)
        -> ``{"h": [B, T, deter], "z": [B, T, S*K], "post"/"prior": [B, T, S, K]}``."""
        h, z = state if state is not None else self.initial(embed.shape[0], embed.device)
        out: dict[str, list] = {"h": [], "z": [], "post": [], "prior": []}
        for t in range(embed.shape[1]):
            h, z, post, prior = self.obs_step(h, z, prev_action[:, t], embed[:, t])
            for k, v in zip(("h", "z", "post", "prior"), (h, z, post, prior)):
                out[k].append(v)
        return {k: torch.stack(v, 1) for k, v in out.items()}

    def imagine(self, h: Tensor, z: Tensor, policy: Callable[[Tensor], Tensor], horizon: int):
        """Roll the prior forward from ``(h, z)`` ``[N, *]`` with ``policy(features) -> action``.

        Returns:
            ``features`` ``[N, horizon + 1, F]`` (the start first) and ``actions``
            ``[N, horizon, A]`` (``actions[:, t]`` was taken in ``features[:, t]``).
        """
        feats, actions = [torch.cat([h, z], -1)], []
        for _ in range(horizon):
            a = policy(feats[-1])
            h, prior = self.img_step(h, z, a)
            z = self.sample(prior)
            feats.append(torch.cat([h, z], -1))
            actions.append(a)
        return torch.stack(feats, 1), torch.stack(actions, 1)


class ReturnNormalizer(nn.Module):
    """DreamerV3's return scale: ``S = EMA(P95(R)) - EMA(P5(R))`` (decay 0.99), used as
    ``max(limit, S)`` so small returns are not scaled up (paper eq. 7).

    Args:
        decay: EMA decay of the percentiles.
        low, high: percentiles (fractions).
        limit: the smallest scale.
    """

    def __init__(self, decay: float = 0.99, low: float = 0.05, high: float = 0.95,
                 limit: float = 1.0) -> None:
        super().__init__()
        if not (0.0 <= decay < 1.0 and 0.0 <= low < high <= 1.0 and limit > 0):
            raise ValueError(f"ReturnNormalizer: decay={decay}, low={low}, high={high}, limit={limit}: "
                             "expected 0 <= decay < 1, 0 <= low < high <= 1, limit > 0.")
        self.decay, self.q_low, self.q_high, self.limit = decay, low, high, limit
        self.register_buffer("low", torch.zeros(()))
        self.register_buffer("high", torch.zeros(()))

    @torch.no_grad()
    def update(self, returns: Tensor) -> Tensor:
        """Fold a batch of returns into the EMAs; returns the new scale ``max(limit, S)``."""
        flat = returns.detach().reshape(-1).float()
        q = torch.quantile(flat, torch.tensor([self.q_low, self.q_high], device=flat.device))
        self.low.mul_(self.decay).add_((1 - self.decay) * q[0])
        self.high.mul_(self.decay).add_((1 - self.decay) * q[1])
        return self.scale()

    def scale(self) -> Tensor:
        return torch.clamp(self.high - self.low, min=self.limit)


class DreamerActor(nn.Module):
    """The policy on world-model features.

    Continuous (``discrete=False``): ``Normal(tanh(mu), std)`` with
    ``std = (max_std - min_std) * sigmoid(s + 2) + min_std`` (0.1 .. 1), actions in ``[-1, 1]``
    (the sample is clipped straight-through). Discrete: a one-hot categorical with 1% unimix.

    ``forward(features)`` returns ``(action, log_prob, entropy)`` of a sample (``rsample`` for
    continuous actions, so gradients flow back through the dynamics); ``mode`` the
    deterministic action.
    """

    def __init__(self, feature_dim: int, action_dim: int, hidden: int, layers: int,
                 discrete: bool = False, min_std: float = 0.1, max_std: float = 1.0,
                 unimix: float = 0.01) -> None:
        super().__init__()
        self.discrete, self.action_dim = discrete, action_dim
        self.min_std, self.max_std, self.unimix = min_std, max_std, unimix
        self.net = norm_mlp(feature_dim, action_dim if discrete else 2 * action_dim, hidden, layers)

    def dist(self, features: Tensor):
        out = self.net(features)
        if self.discrete:
            return torch.distributions.OneHotCategorical(logits=unimix_logits(out, self.unimix))
        mu, s = out.chunk(2, -1)
        std = (self.max_std - self.min_std) * torch.sigmoid(s + 2.0) + self.min_std
        return torch.distributions.Normal(torch.tanh(mu), std)

    def forward(self, features: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        d = self.dist(features)
        if self.discrete:
            a = straight_through_sample(d.logits)
            return a, d.log_prob(a.detach()), d.entropy()
        a = d.rsample()
        logp, ent = d.log_prob(a.detach()).sum(-1), d.entropy().sum(-1)
        return a + (a.clamp(-1.0, 1.0) - a).detach(), logp, ent

    @torch.no_grad()
    def mode(self, features: Tensor) -> Tensor:
        d = self.dist(features)
        if self.discrete:
            return nn.functional.one_hot(d.logits.argmax(-1), self.action_dim).float()
        return d.mean.clamp(-1.0, 1.0)

