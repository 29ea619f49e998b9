"""GRPO (and its DAPO, Dr. GRPO, GSPO variants) and SFT losses, built on ``tdrl.kernels``.

The variants are small options composed by :func:`grpo_objective`:

- GRPO (Shao et al. 2024, arXiv:2402.03300): clipped token ratios, group advantages, k3 KL.
- DAPO clip-higher (Yu et al. 2025, arXiv:2503.14476): ``eps_high > eps_low``.
- Dr. GRPO (Liu et al. 2025, arXiv:2503.20783): advantages without std scaling
  (:func:`tdrl.llm.advantages.group_advantages` ``scale=False``) and ``reduction="constant"``
  (sum over tokens / (B * max_len)).
- GSPO (Zheng et al. 2025, arXiv:2507.18071): one importance ratio per sequence, the
  geometric mean of its token ratios (:func:`sequence_level_logprobs`).
- Truncated importance sampling (Yao et al. 2025, "Your efficient RL framework secretly
  brings you off-policy RL training"): token weights ``min(pi_old / pi_sampler, cap)`` correct
  for the generator's log-probs differing from the trainer's (:func:`tis_weights`).

A loss module returns a TensorDict whose ``loss_*`` entries are summed for the gradient and
whose other entries are detached diagnostics.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import torch
from tensordict import TensorDict

from tdrl.core.objectives.common import LossModule, k3_estimate
from tdrl.kernels.pg_loss.reference import reduce_tokens
from tdrl.llm import keys as K
from tdrl.llm.advantages import scale_mode
from tdrl.llm.logprobs import (LMHead, completion_hidden, completion_logprobs, lm_head, logprobs_from_hidden, row_outputs,
                               trim_completions)

__all__ = [
    "GRPOLossConfig",
    "GRPOKeys",
    "GRPOLoss",
    "SFTLoss",
    "grpo_objective",
    "sequence_level_logprobs",
    "tis_weights",
    "k3_kl",
    "masked_reduce",
    "micro_batch_weights",
    "LOSS_PRESETS",
    "TIS_MODES",
]

_REDUCTIONS = ("token", "sequence", "constant")
LOSS_PRESETS = ("grpo", "dapo", "dr_grpo", "gspo")
TIS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


@dataclass
class GRPOLossConfig:
    """Options of the GRPO objective.

    Attributes:
        eps_low: lower clip ``1 - eps_low`` of the ratio.
        eps_high: upper clip ``1 + eps_high`` (DAPO clip-higher: 0.28).
        beta: k3 KL coefficient to the reference model (0 disables the reference).
        reduction: ``"token"`` (mean over all tokens of the batch, DAPO), ``"sequence"``
            (mean of per-sequence means, original GRPO) or ``"constant"`` (sum / (B * max_len),
            Dr. GRPO).
        max_len: the constant of ``"constant"``; the trainer fills in ``max_new_tokens``.
        sequence_level: GSPO sequence-level ratios.
        tis_cap: bound of the importance-sampling weight of the generator's samples; ``None``
            disables it.
        tis_mode: how the weight is bounded and at which granularity (:func:`tis_weights`;
            TRL's ``vllm_importance_sampling_mode``): ``"token_truncate"`` (default),
            ``"token_mask"``, ``"sequence_truncate"`` or ``"sequence_mask"`` (TRL's default).
        scale_rewards: what divides the group-centred rewards (TRL's values): ``"group"`` (or
            ``True``) the group's std, ``"batch"`` the std of the whole round's rewards (Lite PPO,
            arXiv:2508.08221), ``"none"`` (or ``False``) nothing (Dr. GRPO). Stored as the string.
        token_mean_over_ranks: with ``reduction="token"`` under data parallelism, each token
            weighs ``1 / (tokens of all ranks' minibatches)`` (TRL's ``dapo``); ``False``: each
            rank's token mean, averaged over the ranks (TRL's ``bnpo``). Equal on one process.
        kl_bias_correction: multiply the k3 KL term by the importance ratio ``pi / pi_old``
            (TRL's ``use_bias_correction_kl``; DeepSeek-V3.2, arXiv:2512.02556): the estimate is
            then unbiased for samples drawn from ``pi_old``. Needs ``beta > 0`` to matter.
    """

    eps_low: float = 0.2
    eps_high: float = 0.2
    beta: float = 0.0
    reduction: str = "sequence"
    max_len: int | None = None
    sequence_level: bool = False
    tis_cap: float | None = None
    tis_mode: str = "token_truncate"
    scale_rewards: str | bool = "group"
    token_mean_over_ranks: bool = True
    kl_bias_correction: bool = False

    def __post_init__(self):
        self.scale_rewards = scale_mode("GRPOLossConfig", self.scale_rewards)
        if self.reduction not in _REDUCTIONS:
            raise ValueError(f"GRPOLossConfig.reduction must be one of {_REDUCTIONS}, got {self.reduction!r}")
        if self.eps_low < 0 or self.eps_high < 0:
            raise ValueError(f"GRPOLossConfig: clip ranges must be >= 0, got eps_low={self.eps_low}, eps_high={self.eps_high}")
        if self.beta < 0:
            raise ValueError(f"GRPOLossConfig.beta must be >= 0, got {self.beta}")
        if self.tis_mode not in TIS_MODES:
            raise ValueError(f"GRPOLossConfig.tis_mode={self.tis_mode!r}: expected one of {TIS_MODES}")
        if self.tis_cap is not None and self.tis_cap <= 0:
            raise ValueError(f"GRPOLossConfig.tis_cap must be > 0 or None, got {self.tis_cap}")

    # Presets: the published settings, each a plain config the user may edit further.
    @classmethod
    def grpo(cls, **kw) -> GRPOLossConfig:
        return cls(**kw)

    @classmethod
    def dapo(cls, **kw) -> GRPOLossConfig:
        return cls(**{"eps_low": 0.2, "eps_high": 0.28, "reduction": "token", **kw})

    @classmethod
    def dr_grpo(cls, max_len: int | None = None, **kw) -> GRPOLossConfig:
        return cls(**{"reduction": "constant", "max_len": max_len, "scale_rewards": False, **kw})

    @classmethod
    def gspo(cls, **kw) -> GRPOLossConfig:
        return cls(**{"eps_low": 3e-4, "eps_high": 4e-4, "reduction": "sequence", "sequence_level": True, **kw})

    @classmethod
    def preset(cls, name: str, **kw) -> GRPOLossConfig:
        """The preset called ``name`` (one of :data:`LOSS_PRESETS`), with ``kw`` on top."""
        if name not in LOSS_PRESETS:
            raise ValueError(f"GRPOLossConfig: unknown preset {name!r}; expected one of {LOSS_PRESETS} "
                             "(or a GRPOLossConfig)")
        return getattr(cls, name)(**kw)

    def update(self, **kw) -> GRPOLossConfig:
        names = {f.name for f in fields(self)}
        unknown = set(kw) - names
        if unknown:
            raise TypeError(f"GRPOLossConfig has no field(s) {sorted(unknown)}; fields are {sorted(names)}")
        return replace(self, **kw)


def masked_reduce(x: torch.Tensor, mask: torch.Tensor, reduction: str, max_len: int | None = None) -> torch.Tensor:
    """Reduce per-token values ``[B, T]`` over the mask the way ``pg_token_loss`` does
    (the reductions are the kernels' ``reduce_tokens``, their one home).

    Args:
        x: ``[B, T]`` values.
        mask: ``[B, T]`` bool/0-1.
        reduction: ``"token"``, ``"sequence"`` or ``"constant"``.
        max_len: the constant length (defaults to ``T``).

    Returns:
        A scalar.
    """
    if reduction not in _REDUCTIONS:
        raise ValueError(f"masked_reduce: unknown reduction {reduction!r}; expected one of {_REDUCTIONS}")
    m = mask.to(x.dtype)
    return reduce_tokens(torch.where(m > 0, x * m, torch.zeros_like(x)), m, reduction, max_len)


def micro_batch_weights(chunk_masks: Sequence[torch.Tensor], reduction: str, world_size: int = 1,
                        all_tokens: float | None = None) -> torch.Tensor:
    """Weights that make gradient accumulation exact: ``sum_j w_j * loss(chunk_j)`` equals the
    loss of the whole minibatch, for every reduction.

    A chunk's loss is reduced over the chunk alone, so a plain ``loss_j / n_chunks`` weighs a
    token by ``1 / (n_chunks * tokens in its chunk)`` under ``"token"``: wrong whenever the chunks
    hold different numbers of tokens. Here ``"token"`` weighs chunk ``j`` by its share of the
    minibatch's tokens (each token then weighs ``1 / tokens in the minibatch``, DAPO's
    normaliser), ``"sequence"`` and ``"constant"`` by its share of the rows.

    Under data parallelism (gradients averaged over ``world_size`` ranks) ``all_tokens``, the
    tokens of the minibatches of all ranks, makes the token mean global (TRL's ``dapo``): chunk
    ``j`` weighs ``world_size * tokens_j / all_tokens``, so after the average every token of the
    job weighs ``1 / all_tokens``. Without it each rank's token mean is averaged (``bnpo``).

    Args:
        chunk_masks: the chunks' completion masks, each ``[B_j, T_j]``.
        reduction: ``"token"``, ``"sequence"`` or ``"constant"``.
        world_size: ranks whose gradients are averaged (with ``all_tokens``).
        all_tokens: with ``"token"``: the completion tokens of all ranks' minibatches.

    Returns:
        ``[n_chunks]`` float32 weights (summing to 1 on one rank, or all 0 when there is no token
        under ``"token"``).
    """
    if reduction not in _REDUCTIONS:
        raise ValueError(f"micro_batch_weights: unknown reduction {reduction!r}; expected one of {_REDUCTIONS}")
    if reduction == "token":
        counts = torch.stack([m.detach().float().sum().cpu() for m in chunk_masks])
        if all_tokens is not None:
            return counts * world_size / max(float(all_tokens), 1.0)
    else:
        counts = torch.tensor([float(m.shape[0]) for m in chunk_masks])
    return counts / counts.sum().clamp(min=1.0)


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(pi || pi_ref): ``exp(ref - logp) - (ref - logp) - 1`` (>= 0),
    core's :func:`~tdrl.core.objectives.common.k3_estimate` of ``ref - logp``."""
    return k3_estimate(ref_logp - logp)


def sequence_level_logprobs(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rewrite token log-probs so that a token-level ratio becomes GSPO's sequence ratio.

    GSPO's ratio of sequence ``i`` is ``s_i = exp(mean_t(logp - old_logp))``; its token form
    is ``s_i,t = sg[s_i] * pi(y_t) / sg[pi(y_t)]`` (value ``s_i``, gradient
    ``s_i * grad logp_t``). Returned ``(logp', old_logp')`` satisfy
    ``exp(logp' - old_logp') = s_i,t``, so any token-level clipped loss applies unchanged.

    Args:
        logp, old_logp: ``[B, T]``.
        mask: ``[B, T]``.

    Returns:
        ``(logp', zeros)`` both ``[B, T]``.
    """
    m = mask.to(logp.dtype)
    seq = ((logp - old_logp) * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1)
    new = logp - logp.detach() + seq.detach()
    return new, torch.zeros_like(old_logp)


def tis_weights(old_logp: torch.Tensor, sample_logp: torch.Tensor, mask: torch.Tensor, cap: float,
                mode: str = "token_truncate") -> torch.Tensor:
    """Importance weights ``pi_old / pi_sampler`` correcting for the generator's log-probs
    differing from the trainer's, bounded by ``cap`` as TRL's ``vllm_importance_sampling_mode``:

    - ``"token_truncate"``: ``min(exp(old_t - sample_t), cap)`` per token (truncated IS);
    - ``"token_mask"``: ``exp(old_t - sample_t)``, or 0 where it exceeds ``cap``;
    - ``"sequence_truncate"``: ``min(exp(sum_t (old_t - sample_t)), cap)``, one weight per
      sequence (the product of its token ratios) given to each of its tokens;
    - ``"sequence_mask"``: that sequence ratio, or 0 for the whole sequence where it exceeds ``cap``.

    Args:
        old_logp: ``[B, T]`` trainer log-probs before the update.
        sample_logp: ``[B, T]`` generator log-probs.
        mask: ``[B, T]``.
        cap: the upper bound.
        mode: one of :data:`TIS_MODES`.

    Returns:
        ``[B, T]`` detached weights, 0 off the mask.
    """
    if mode not in TIS_MODES:
        raise ValueError(f"tis_weights: mode={mode!r}; expected one of {TIS_MODES}")
    keep = mask.bool()
    diff = torch.where(keep, (old_logp - sample_logp).detach(), torch.zeros_like(old_logp))
    if mode.startswith("sequence"):
        diff = diff.sum(-1, keepdim=True).expand_as(diff)
    w = torch.exp(diff)
    w = w.clamp(max=cap) if mode.endswith("truncate") else torch.where(w > cap, torch.zeros_like(w), w)
    return torch.where(keep, w, torch.zeros_like(w))


def grpo_objective(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: GRPOLossConfig,
    ref_logp: torch.Tensor | None = None,
    sample_logp: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The GRPO family's loss on per-token log-probs.

    ``loss = reduce_t( -w_t * min(r_t A, clip(r_t, 1-eps_low, 1+eps_high) A) + beta * c_t * k3_t )``
    where ``r_t`` is the token ratio (or GSPO's sequence ratio), ``w_t`` the optional TIS
    weight and ``c_t`` 1, or ``r_t`` (not detached) with ``config.kl_bias_correction``.

    Args:
        logp: ``[B, T]`` current log-probs (with gradient).
        old_logp: ``[B, T]`` log-probs before the update (detached).
        advantages: ``[B]`` or ``[B, T]``.
        mask: ``[B, T]`` generated-token mask.
        config: a :class:`GRPOLossConfig`.
        ref_logp: ``[B, T]`` reference log-probs, needed when ``config.beta > 0``.
        sample_logp: ``[B, T]`` generator log-probs, needed when ``config.tis_cap`` is set.

    Returns:
        ``(loss, stats)``: a scalar and detached scalars ``clip_frac``, ``kl``, ``ratio_mean``.
    """
    from tdrl import kernels

    if logp.shape != mask.shape or old_logp.shape != mask.shape:
        raise ValueError(
            f"grpo_objective: logp {tuple(logp.shape)}, old_logp {tuple(old_logp.shape)} and mask "
            f"{tuple(mask.shape)} must all be [B, T]"
        )
    if config.beta > 0 and ref_logp is None:
        raise ValueError("grpo_objective: config.beta > 0 needs ref_logp [B, T] (reference model log-probs)")
    adv = advantages.to(logp.dtype)
    if config.tis_cap is not None:
        if sample_logp is None:
            raise ValueError("grpo_objective: config.tis_cap is set but sample_logp [B, T] was not given")
        adv = (adv[:, None] if adv.ndim == 1 else adv) * tis_weights(old_logp, sample_logp, mask, config.tis_cap, config.tis_mode)
    mask_f = mask.to(logp.dtype)
    kw = dict(eps_low=config.eps_low, eps_high=config.eps_high, reduction=config.reduction, max_len=config.max_len)
    if config.kl_bias_correction and config.beta > 0:
        return _bias_corrected(logp, old_logp, adv, mask, config, ref_logp, kw)
    if not config.sequence_level:
        beta = config.beta if ref_logp is not None else 0.0
        loss, stats = kernels.pg_token_loss(logp, old_logp, adv, mask_f, ref_logp=ref_logp if beta > 0 else None, beta=beta, **kw)
        stats = dict(stats)
        if ref_logp is not None and beta == 0:
            stats["kl"] = masked_reduce(k3_kl(logp.detach(), ref_logp), mask, config.reduction, config.max_len)
        return loss, stats
    seq_logp, zeros = sequence_level_logprobs(logp, old_logp, mask)
    loss, stats = kernels.pg_token_loss(seq_logp, zeros, adv, mask_f, beta=0.0, **kw)
    stats = dict(stats)
    if ref_logp is not None:
        kl = masked_reduce(k3_kl(logp, ref_logp), mask, config.reduction, config.max_len)
        loss = loss + config.beta * kl
        stats["kl"] = kl.detach()
    return loss, stats


def _bias_corrected(logp, old_logp, adv, mask, config: GRPOLossConfig, ref_logp, kw) -> tuple[torch.Tensor, dict]:
    """:func:`grpo_objective` with TRL's ``use_bias_correction_kl``: the policy term from the
    kernel (``beta=0``), plus ``beta * reduce(r_t * k3_t)`` with the same (token or sequence) ratio."""
    from tdrl import kernels

    mask_f = mask.to(logp.dtype)
    if config.sequence_level:
        logp_r, old_r = sequence_level_logprobs(logp, old_logp, mask)
    else:
        logp_r, old_r = logp, old_logp.detach()
    loss, stats = kernels.pg_token_loss(logp_r, old_r, adv, mask_f, beta=0.0, **kw)
    ratio = torch.exp(torch.where(mask, logp_r - old_r, torch.zeros_like(logp)))
    kl = k3_kl(logp, ref_logp)
    corrected = masked_reduce(ratio * kl, mask, config.reduction, config.max_len)
    stats = dict(stats)
    stats["kl"] = masked_reduce(kl.detach(), mask, config.reduction, config.max_len)
    return loss + config.beta * corrected, stats


@dataclass
class GRPOKeys:
    """The rollout keys :class:`GRPOLoss` reads (rebind with ``set_keys``)."""

    prompt_ids: str = K.PROMPT_IDS
    completion_mask: str = K.COMPLETION_MASK
    old_log_prob: str = K.OLD_LOG_PROB
    sample_log_prob: str = K.SAMPLE_LOG_PROB
    ref_log_prob: str = K.REF_LOG_PROB
    advantage: str = K.ADVANTAGE


class GRPOLoss(LossModule):
    """GRPO loss module: model + rollout TensorDict -> TensorDict of losses and diagnostics.

    Reads ``completion_mask``, ``advantage``, ``old_log_prob`` (falls back to the current
    log-probs, detached: the single-pass on-policy case), ``ref_log_prob`` (when
    ``beta > 0``) and ``sample_log_prob`` (when ``tis_cap`` is set). Keys can be rebound with
    :meth:`set_keys`.

    With ``fused`` and ``fused_loss`` (both default) the token-level objectives (GRPO, DAPO,
    Dr. GRPO, with or without KL and TIS; not GSPO's sequence ratio) go straight from the
    decoder's hidden states to the loss through :func:`tdrl.kernels.fused_linear_pg_loss`,
    which computes the LM-head gradients chunk by chunk in the forward (three LM-head
    matmuls instead of four, no ``[tokens, vocab]`` buffer) and returns the entropy
    diagnostic on the way. It equals the two-step path (fused log-probs, then
    :func:`grpo_objective`) up to float rounding; :meth:`fused_loss_matches` checks it.

    Args:
        config: a :class:`GRPOLossConfig`.
        temperature: the sampling temperature (log-probs are computed at it).
        fused: compute log-probs with the fused LM-head kernel.
        share_prefix: run each distinct prompt of a batch once (fused path only; see
            :mod:`tdrl.llm.logprobs`).
        fused_loss: with ``fused``, fuse the token loss into the LM-head kernel too.
    """

    Keys = GRPOKeys

    def __init__(
        self,
        config: GRPOLossConfig | None = None,
        temperature: float = 1.0,
        fused: bool = True,
        share_prefix: bool = True,
        fused_loss: bool = True,
        head: LMHead | None = None,
    ):
        super().__init__()
        self.config = config or GRPOLossConfig()
        self.temperature = temperature
        self.head = head if head is not None else LMHead(bool(fused), bool(share_prefix), bool(fused_loss))

    @property
    def fused(self) -> bool:
        return self.head.fused

    @property
    def share_prefix(self) -> bool:
        return self.head.share_prefix

    @property
    def fused_loss(self) -> bool:
        return self.head.fused_loss

    @property
    def uses_fused_loss(self) -> bool:
        """Whether :meth:`forward` goes through :func:`tdrl.kernels.fused_linear_pg_loss`."""
        return self.fused and self.fused_loss and not self.config.sequence_level and not self.config.kl_bias_correction

    def forward(self, model, td: TensorDict) -> TensorDict:
        """``loss_objective`` (sum the ``loss_*`` entries with :func:`~tdrl.core.objectives.total_loss`)
        and detached diagnostics, for ``model`` on the rollout ``td``."""
        if self.fused:
            trimmed = self.head.hidden(model, td)
            if trimmed is not None:
                return self._from_hidden(*trimmed, td, self.uses_fused_loss)
        logp, entropy = self.head.logprobs(model, td, self.temperature, return_entropy=True)
        return self._objective(logp, entropy, td)

    def _inputs(self, td: TensorDict) -> tuple:
        k = self.tensor_keys
        ref = td.get(k.ref_log_prob, None) if self.config.beta > 0 else None
        return td.get(k.old_log_prob, None), ref, td.get(k.sample_log_prob, None)

    def _objective(self, logp: torch.Tensor, entropy: torch.Tensor, td: TensorDict) -> TensorDict:
        """The two-step path: per-token log-probs ``[N, C]`` -> :func:`grpo_objective`."""
        k = self.tensor_keys
        mask = td[k.completion_mask].bool()
        old, ref, sample = self._inputs(td)
        old = logp.detach() if old is None else old
        loss, stats = grpo_objective(logp, old, td[k.advantage], mask, self.config, ref_logp=ref, sample_logp=sample)
        out = {"loss_objective": loss}
        out.update({key: torch.as_tensor(v).detach() for key, v in stats.items()})
        out["entropy"] = masked_reduce(entropy.detach(), mask, "token")
        return TensorDict(out, batch_size=[])

    def _from_hidden(self, hidden, head, cids, cmask, td: TensorDict, fused_loss: bool) -> TensorDict:
        """Loss from the trimmed batch's hidden states ``[N, C', H]`` (``C'`` <= the rollout's ``C``)."""
        k, cfg = self.tensor_keys, self.config
        full_mask = td[k.completion_mask].bool()
        old, ref, sample = self._inputs(td)
        if not fused_loss or (cfg.tis_cap is not None and old is None):
            logp, entropy = logprobs_from_hidden(hidden, head, cids, cmask, full_mask, self.temperature, return_entropy=True)
            return self._objective(logp, entropy, td)
        from tdrl import kernels

        if cfg.beta > 0 and ref is None:
            raise ValueError(f"GRPOLoss: config.beta > 0 needs {k.ref_log_prob!r} [B, T] (reference model log-probs)")
        width = cids.shape[1]
        adv = td[k.advantage]
        if cfg.tis_cap is not None:
            if sample is None:
                raise ValueError(f"GRPOLoss: config.tis_cap is set but {k.sample_log_prob!r} [B, T] is missing")
            adv = (adv[:, None] if adv.ndim == 1 else adv) * tis_weights(old, sample, full_mask, cfg.tis_cap, cfg.tis_mode)
        if adv.ndim == 2:
            adv = adv[:, :width]
        loss, stats = kernels.fused_linear_pg_loss(
            hidden, head.weight, cids, None if old is None else old[:, :width], adv, cmask,
            None if ref is None else ref[:, :width], bias=head.bias, temperature=self.temperature,
            eps_low=cfg.eps_low, eps_high=cfg.eps_high, beta=cfg.beta, reduction=cfg.reduction,
            # the untrimmed width, as the two-step path reduces over it
            max_len=cfg.max_len or full_mask.shape[1], return_entropy=True,
        )
        out = {"loss_objective": loss}
        out.update({key: v.detach() for key, v in stats.items()})
        return TensorDict(out, batch_size=[])

    def fused_loss_matches(self, model, td: TensorDict, rtol: float = 1e-4, atol: float = 1e-5) -> bool:
        """Whether the fused loss reproduces the two-step path on ``td``: the loss, its
        statistics and its gradients with respect to the hidden states and the LM head.

        The decoder runs once, without gradients; both paths then start from the same hidden
        states, so equal hidden-state and head gradients mean equal gradients for every
        parameter. Missing ``old_log_prob`` / ``ref_log_prob`` are made up from the current
        log-probs plus fixed noise, so that some ratios clip and the KL is not zero.
        """
        if not self.fused or self.config.sequence_level or self.config.kl_bias_correction:
            return False
        k = self.tensor_keys
        pids, pmask, cids, cmask, amask, width = trim_completions(td)
        if width == 0:
            return True
        try:
            head = lm_head(model)
            with torch.no_grad():
                hidden = completion_hidden(model, pids, pmask, cids, amask, share_prefix=self.share_prefix)
                full_mask = td[k.completion_mask].bool()
                logp = logprobs_from_hidden(hidden, head, cids, cmask, full_mask, self.temperature)
        except (TypeError, ValueError, AttributeError, RuntimeError, IndexError):
            return False
        g = torch.Generator(device="cpu").manual_seed(0)
        td = td.clone(recurse=False)
        for key in (k.old_log_prob, k.ref_log_prob, k.sample_log_prob):
            if key not in td.keys():
                noise = 0.3 * torch.randn(logp.shape, generator=g).to(logp.device, logp.dtype)
                td.set(key, (logp + noise) * full_mask)
        h = hidden.detach().requires_grad_(True)
        params = [h] + [p for p in (head.weight, head.bias) if p is not None and p.requires_grad]
        results = []
        for fused_loss in (True, False):
            out = self._from_hidden(h, head, cids, cmask, td, fused_loss)
            grads = torch.autograd.grad(out["loss_objective"], params, allow_unused=True)
            results.append((out, grads))
        (a, ga), (b, gb) = results
        close = lambda x, y: bool(torch.allclose(x.float(), y.float(), rtol=rtol, atol=atol))  # noqa: E731
        if set(a.keys()) != set(b.keys()) or not all(close(a[key], b[key]) for key in a.keys()):
            return False
        return all(
            (x is None and y is None) or (x is not None and y is not None and close(x, y)) for x, y in zip(ga, gb)
        )


class SFTLoss(torch.nn.Module):
    """Masked cross-entropy on completion tokens only (prompt tokens carry no loss).

    ``loss = -sum(mask * logp) / sum(mask)`` over the batch's completion tokens.

    With ``fused`` (default) the decoder's hidden states go straight to the loss through
    :func:`tdrl.kernels.fused_linear_cross_entropy`: the LM-head gradients are computed chunk
    by chunk in the forward (three LM-head matmuls, two with a frozen head as under LoRA; no
    ``[tokens, vocab]`` buffer; masked tokens skip the head).

    Args:
        fused: go through the fused LM-head kernel; ``False`` uses the model's full logits.
    """

    def __init__(self, fused: bool = True):
        super().__init__()
        self.fused = fused

    def forward(self, model, td: TensorDict) -> TensorDict:
        if K.LOSS_MASK in td.keys():
            return self._rows(model, td)
        mask = td[K.COMPLETION_MASK].bool()
        n = mask.sum().detach().float()
        pids, pmask, cids, cmask, amask, width = trim_completions(td)
        if self.fused and width > 0:
            from tdrl import kernels

            head = lm_head(model)
            hidden = completion_hidden(model, pids, pmask, cids, amask, share_prefix=False)
            loss = kernels.fused_linear_cross_entropy(hidden, head.weight, cids, bias=head.bias, mask=cmask)
        else:
            logp = completion_logprobs(model, td, 1.0, fused=self.fused, share_prefix=False)
            loss = -masked_reduce(logp, mask, "token")
        return TensorDict({"loss_sft": loss, "num_tokens": n, "mean_logp": -loss.detach()}, batch_size=[])

    def _rows(self, model, td: TensorDict) -> TensorDict:
        """The loss on whole rows (:mod:`tdrl.llm.packing`: ``INPUT_IDS``, ``POSITION_IDS``,
        ``SEGMENT_IDS``, ``LOSS_MASK`` ``[R, L]``), packed or not: no token attends to, or is
        predicted from, another example."""
        from tdrl import kernels
        from tdrl.llm.packing import block_causal_mask, target_mask

        ids, seg = td[K.INPUT_IDS], td[K.SEGMENT_IDS]
        mask = target_mask(td)  # [R, L-1]
        n = mask.sum().detach().float()
        head = lm_head(model)
        attn = block_causal_mask(seg, head.weight.dtype)
        out = row_outputs(model, ids, attn, td[K.POSITION_IDS], hidden=self.fused)[:, :-1]
        targets = ids[:, 1:]
        if self.fused:
            loss = kernels.fused_linear_cross_entropy(out, head.weight, targets, bias=head.bias, mask=mask)
        else:
            logp = kernels.token_logprobs(out, targets)
            loss = -(logp * mask).sum() / n.clamp(min=1)
        return TensorDict({"loss_sft": loss, "num_tokens": n, "mean_logp": -loss.detach()}, batch_size=[])
