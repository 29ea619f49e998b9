"""Decision Transformer (Chen et al., 2021, "Decision Transformer: Reinforcement Learning via
Sequence Modeling", arXiv:2106.01345): a causal transformer over interleaved
(return-to-go, observation, action) tokens that predicts each action from the tokens up to
its observation, and the inference loop that conditions it on a target return."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

__all__ = ["DecisionTransformer", "DecisionTransformerPolicy"]


class DecisionTransformer(nn.Module):
    """Return-conditioned causal transformer.

    Each step ``t`` gives three tokens ``(R_t, s_t, a_t)`` (linear embeddings plus a learned
    embedding of the episode timestep), so a window of ``T`` steps is ``3T`` tokens under a
    causal mask; the action at ``t`` is read from the hidden state of the ``s_t`` token, which
    sees ``R_<=t, s_<=t, a_<t`` only.

    Args:
        obs_dim, act_dim: observation and action sizes.
        embed_dim: token width. num_layers, num_heads: transformer blocks and heads.
        context: the longest window ``T`` (the paper's ``K``, 20).
        max_timestep: timestep embeddings (episode steps >= it use the last one).
        dropout: dropout of the blocks and the embeddings.
        action_low, action_high: bounds the tanh action head is scaled to.
    """

    def __init__(self, obs_dim: int, act_dim: int, *, embed_dim: int = 128, num_layers: int = 3,
                 num_heads: int = 1, context: int = 20, max_timestep: int = 1000,
                 dropout: float = 0.1, action_low: float = -1.0, action_high: float = 1.0) -> None:
        super().__init__()
        for name, v in (("obs_dim", obs_dim), ("act_dim", act_dim), ("embed_dim", embed_dim),
                        ("num_layers", num_layers), ("context", context), ("max_timestep", max_timestep)):
            if v < 1:
                raise ValueError(f"DecisionTransformer: {name} must be >= 1, got {v}.")
        if embed_dim % num_heads:
            raise ValueError(f"DecisionTransformer: embed_dim={embed_dim} must be divisible by num_heads={num_heads}.")
        if not action_high > action_low:
            raise ValueError(f"DecisionTransformer: action_high={action_high} must be > action_low={action_low}.")
        self.obs_dim, self.act_dim, self.context, self.max_timestep = obs_dim, act_dim, context, max_timestep
        self.embed_return = nn.Linear(1, embed_dim)
        self.embed_obs = nn.Linear(obs_dim, embed_dim)
        self.embed_action = nn.Linear(act_dim, embed_dim)
        self.embed_time = nn.Embedding(max_timestep, embed_dim)
        # GPT-2's initialisation of position embeddings (N(0, 0.02)), not nn.Embedding's N(0, 1): unit-scale
        # timestep vectors swamp the linear token embeddings under the LayerNorm, and the model then
        # fits the action to the episode step (Pendulum medium dataset: eval about -1000 with N(0, 1),
        # -465 with 0.02 after the same 1,500 steps).
        nn.init.normal_(self.embed_time.weight, std=0.02)
        self.embed_norm = nn.LayerNorm(embed_dim)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(_Block(embed_dim, num_heads, dropout) for _ in range(num_layers))
        self.final_norm = nn.LayerNorm(embed_dim)
        self.head = nn.Linear(embed_dim, act_dim)
        self.register_buffer("half_range", torch.tensor((action_high - action_low) / 2), persistent=False)
        self.register_buffer("mid", torch.tensor((action_high + action_low) / 2), persistent=False)

    def forward(self, returns_to_go: Tensor, observation: Tensor, action: Tensor, timestep: Tensor,
                mask: Tensor | None = None) -> Tensor:
        """Predicted actions ``[B, T, act_dim]``.

        Args:
            returns_to_go: ``[B, T, 1]``. observation: ``[B, T, obs_dim]``.
            action: ``[B, T, act_dim]`` (the action at ``t`` never reaches the prediction at ``t``).
            timestep: episode step of each entry, ``[B, T]`` integers.
            mask: ``[B, T]`` bool, True for real steps (padding: False); default all real. Padding
                after the real steps (right padding, what :func:`~tdrl.core.objectives.sample_windows`
                makes) needs no attention mask beyond the causal one, so it takes the fast
                ``is_causal`` attention; padding before a real step builds a ``[B, 1, 3T, 3T]`` mask.
        """
        b, t = observation.shape[:2]
        if t > self.context:
            raise ValueError(f"DecisionTransformer: a window of {t} steps exceeds context={self.context}.")
        want = {"returns_to_go": (returns_to_go, (b, t, 1)), "action": (action, (b, t, self.act_dim)),
                "timestep": (timestep, (b, t)), "observation": (observation, (b, t, self.obs_dim))}
        for name, (x, shape) in want.items():
            if tuple(x.shape) != shape:
                raise ValueError(f"DecisionTransformer: {name} has shape {tuple(x.shape)}, expected {shape}.")
        time = self.embed_time(timestep.long().clamp(0, self.max_timestep - 1))
        tokens = torch.stack([self.embed_return(returns_to_go) + time, self.embed_obs(observation) + time,
                              self.embed_action(action) + time], dim=2).reshape(b, 3 * t, -1)
        tokens = self.drop(self.embed_norm(tokens))
        allowed = None  # causal attention alone: no query sees a later (or right-padded) key
        if mask is not None and bool((mask[:, 1:].bool() & ~mask[:, :-1].bool()).any()):  # a pad before a real step
            n = 3 * t
            pad = (~mask.bool()).repeat_interleave(3, dim=1)  # [B, 3T]
            own = torch.eye(n, dtype=torch.bool, device=tokens.device)
            causal = torch.ones(n, n, dtype=torch.bool, device=tokens.device).tril()
            allowed = (causal & ~pad[:, None, :]) | own  # a padded query sees itself only
            allowed = allowed[:, None]  # [B, 1, 3T, 3T], shared by the heads
        for block in self.blocks:
            tokens = block(tokens, allowed)
        hidden = self.final_norm(tokens)
        state_tokens = hidden.reshape(b, t, 3, -1)[:, :, 1]
        return torch.tanh(self.head(state_tokens)) * self.half_range + self.mid


class _Block(nn.Module):
    """A GPT-2 block (pre-norm; dropout on the attention weights and on each residual branch,
    none inside the MLP), as in the paper's GPT-2 backbone.

    ``allowed``: ``[B, 1, N, N]`` bool (True: the query may attend to the key) or None for
    plain causal attention (``scaled_dot_product_attention(is_causal=True)``).
    """

    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads, self.p = heads, dropout
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc, self.out = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: Tensor, allowed: Tensor | None) -> Tensor:
        b, n, d = x.shape
        p = self.p if self.training else 0.0
        q, k, v = self.qkv(self.norm1(x)).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=p, is_causal=allowed is None)
        x = x + F.dropout(self.proj(att.transpose(1, 2).reshape(b, n, d)), p, self.training)
        return x + F.dropout(self.out(F.gelu(self.fc(self.norm2(x)))), p, self.training)


class DecisionTransformerPolicy:
    """The inference loop: conditions a :class:`DecisionTransformer` on a target return for a
    batch of ``num_envs`` episodes. ``act(obs)`` appends the observation and predicts the
    action from the last ``context`` steps; ``observe(reward)`` decrements the return-to-go by
    the reward (``R_{t+1} = R_t - r_t``, in the model's ``return_scale`` units).

    Args:
        model: the trained transformer (put in eval mode here).
        target_return: the return the episodes are conditioned on (environment units).
        num_envs: episodes run side by side (all start at step 0).
        return_scale: the returns-to-go are divided by it, as in training.
    """

    def __init__(self, model: DecisionTransformer, target_return: float, num_envs: int,
                 return_scale: float = 1.0) -> None:
        if return_scale <= 0:
            raise ValueError(f"DecisionTransformerPolicy: return_scale must be > 0, got {return_scale}.")
        self.model, self.scale, self.n = model.eval(), float(return_scale), num_envs
        self.target = float(target_return)
        self.reset()

    def reset(self) -> None:
        """Start new episodes: empty histories, return-to-go = the target return."""
        self.obs = torch.zeros(self.n, 0, self.model.obs_dim)
        self.act_hist = torch.zeros(self.n, 0, self.model.act_dim)
        self.rtg = torch.zeros(self.n, 0, 1)
        self.steps = torch.zeros(self.n, 0, dtype=torch.long)
        self.next_rtg = torch.full((self.n, 1, 1), self.target / self.scale)
        self.t = 0

    @torch.no_grad()
    def act(self, observation: Tensor) -> Tensor:
        """The action ``[num_envs, act_dim]`` for the observation ``[num_envs, obs_dim]``."""
        k = self.model.context
        self.obs = torch.cat([self.obs, observation.reshape(self.n, 1, -1).float()], 1)[:, -k:]
        self.rtg = torch.cat([self.rtg, self.next_rtg], 1)[:, -k:]
        self.steps = torch.cat([self.steps, torch.full((self.n, 1), self.t)], 1)[:, -k:]
        self.t += 1
        placeholder = torch.zeros(self.n, 1, self.model.act_dim)
        actions = torch.cat([self.act_hist, placeholder], 1)[:, -k:]
        pred = self.model(self.rtg, self.obs, actions, self.steps)[:, -1]
        self.act_hist = torch.cat([self.act_hist, pred[:, None]], 1)[:, -(k - 1):] if k > 1 else self.act_hist
        return pred

    def observe(self, reward: Tensor) -> None:
        """Decrement the return-to-go by the reward ``[num_envs]`` just received."""
        self.next_rtg = self.rtg[:, -1:] - reward.reshape(self.n, 1, 1).float() / self.scale
