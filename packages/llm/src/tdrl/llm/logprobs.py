"""Per-token log-probs of completions from a causal LM, through the fused LM-head kernel.

The fast path (``fused=True``) runs only the model's decoder (no LM head, no per-layer hidden
states) and feeds its final normed hidden state at the positions that predict completion
tokens, masked rows only, to :func:`tdrl.kernels.fused_linear_logprobs` together with the
LM-head weight, so the ``[tokens, vocab]`` log-softmax is never materialised (memory
O(chunk x vocab)). On the way it

- trims the batch: leading prompt columns that are padding in every row and trailing
  completion columns past every row's end are dropped, and the last completion token (which
  predicts nothing) is not fed;
- shares prompts (``share_prefix=True``): a prompt repeated across rows (a GRPO group) runs
  through the decoder once, its KV cache is indexed out to the rows that repeat it
  (differentiably: gradients of all rows flow back into the one prompt pass), and only the
  completions run per row. The result equals the per-row computation up to float rounding.
  With eager / SDPA attention and short completions it is one forward instead
  (:mod:`tdrl.llm.prefix_rows`): each prompt followed by its group's completions in one row
  under a prefix-tree mask, so each weight gets one gradient from one larger matmul.

Models whose last hidden state is not the LM-head input can use ``fused=False``, which
computes logits with the full model and calls :func:`tdrl.kernels.token_logprobs`; a
``DistributedDataParallel`` wrapper is called as a whole (its forward does the gradient
bookkeeping) and returns the last hidden state through ``output_hidden_states``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from tensordict import TensorDict

from tdrl.llm import keys as K
from tdrl.llm.generation import cache_kwarg, cache_of, unique_prompts, unwrap_model
from tdrl.llm.prefix_rows import prefix_tree_rows, tree_is_cheaper

log = logging.getLogger(__name__)

__all__ = ["LMHead", "completion_logprobs", "completion_hidden", "row_outputs", "fused_path_matches", "logprobs_from_hidden", "lm_head",
           "trim_completions", "probe_batch"]


def lm_head(model):
    """The model's LM head (its linear output embedding), unwrapped from DDP / PEFT."""
    base = unwrap_model(model)
    head = base.get_output_embeddings()
    if head is None or not hasattr(head, "weight"):
        raise ValueError(
            f"completion_logprobs: {type(base).__name__} has no linear output embedding; use fused=False"
        )
    return head


def _decoder(model):
    """The transformer under the LM head (``model.base_model``), or ``None`` when it must not or
    cannot be called alone (a DDP wrapper, a model without a separate decoder)."""
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(model, DistributedDataParallel):
        return None
    base = unwrap_model(model)
    if hasattr(base, "get_base_model"):  # peft: the transformers model with adapters injected
        base = base.get_base_model()
    dec = getattr(base, "base_model", None)
    if not isinstance(dec, torch.nn.Module) or dec is base:
        return None
    return dec


def _takes_4d_mask(decoder) -> bool:
    """Whether the decoder's attention reads an additive ``[B, 1, L, L]`` mask as it is (eager
    and SDPA do; flash-attention and others take padding masks only)."""
    impl = getattr(getattr(decoder, "config", None), "_attn_implementation", None)
    return impl in ("sdpa", "eager")


def _hidden_size(decoder) -> int:
    return int(decoder.config.hidden_size)


def _embedding_dtype(decoder) -> torch.dtype:
    return decoder.get_input_embeddings().weight.dtype


def _positions(mask: torch.Tensor) -> torch.Tensor:
    return (mask.cumsum(-1) - 1).clamp(min=0)


def trim_completions(td: TensorDict):
    """``(prompt_ids, prompt_mask, completion_ids, completion_mask, completion_attention, width)``
    without all-padding prompt columns on the left and completion columns past the last trained
    token on the right; ``width`` is the kept completion width (0: no trained token at all).
    ``completion_attention`` is ``COMPLETION_ATTENTION_MASK`` (the tool outputs of a multi-turn
    rollout are read but not trained) or, without it, the completion mask."""
    pids, pmask = td[K.PROMPT_IDS], td[K.PROMPT_MASK].long()
    cids, cmask = td[K.COMPLETION_IDS], td[K.COMPLETION_MASK].bool()
    amask = td.get(K.COMPLETION_ATTENTION_MASK, None)
    amask = cmask if amask is None else amask.bool() | cmask
    cols = cmask.any(0).nonzero()
    width = int(cols.max()) + 1 if cols.numel() else 0
    start = pmask.bool().any(0).nonzero()
    start = int(start.min()) if start.numel() else 0
    start = min(start, pids.shape[1] - 1)  # keep at least the last prompt column
    return pids[:, start:], pmask[:, start:], cids[:, :width], cmask[:, :width], amask[:, :width], width


def completion_hidden(
    model,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    share_prefix: bool = True,
) -> torch.Tensor:
    """Final hidden states (the LM head's input) at the positions predicting each completion token.

    Args:
        model: a Hugging Face causal LM (plain, peft- or DDP-wrapped).
        prompt_ids, prompt_mask: ``[N, P]`` left-padded prompts.
        completion_ids, completion_mask: ``[N, C]`` completions (``C >= 1``); the mask is the
            attention mask of the completion (in a multi-turn rollout the policy's tokens and
            the tool outputs between them).
        share_prefix: run each distinct prompt once and share its KV cache.

    Returns:
        ``[N, C, H]``: row ``t`` is the hidden state that predicts ``completion_ids[:, t]``.
    """
    P, C = prompt_ids.shape[1], completion_ids.shape[1]
    mask = torch.cat([prompt_mask.long(), completion_mask.long()], dim=-1)[:, : P + C - 1]
    ids = torch.cat([prompt_ids, completion_ids[:, : C - 1]], dim=-1)
    pos = _positions(mask)
    decoder = _decoder(model)
    if decoder is None:
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, output_hidden_states=True, use_cache=False, logits_to_keep=1)
        return out.hidden_states[-1][:, P - 1 :]
    uniq = None
    if share_prefix and not getattr(decoder, "gradient_checkpointing", False):
        uniq = unique_prompts(prompt_ids, prompt_mask)
    if uniq is not None and C > 1 and _takes_4d_mask(decoder):
        u_ids, u_mask, inv = uniq
        per_prompt = int(torch.bincount(inv).max())
        if tree_is_cheaper(P, C - 1, per_prompt, _hidden_size(decoder)):
            # one forward: each prompt once, its completions after it under a prefix-tree mask
            t_ids, t_pos, t_mask, rows, cols = prefix_tree_rows(
                u_ids, u_mask, inv, completion_ids[:, : C - 1], completion_mask[:, : C - 1].long(),
                dtype=_embedding_dtype(decoder))
            hidden = decoder(input_ids=t_ids, attention_mask=t_mask, position_ids=t_pos, use_cache=False).last_hidden_state
            return hidden[rows[:, None], cols]
    if uniq is not None:
        u_ids, u_mask, inv = uniq
        out = decoder(input_ids=u_ids, attention_mask=u_mask.long(), position_ids=_positions(u_mask.long()), use_cache=True)
        cache = cache_of(out)
        if cache is not None and hasattr(cache, "batch_select_indices"):
            last = out.last_hidden_state[:, -1:].index_select(0, inv)  # [N, 1, H]
            if C == 1:
                return last
            cache.batch_select_indices(inv)
            rest = decoder(
                input_ids=ids[:, P:], attention_mask=mask, position_ids=pos[:, P:], use_cache=True,
                **{cache_kwarg(decoder): cache},
            ).last_hidden_state
            return torch.cat([last, rest], dim=1)
    out = decoder(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False)
    return out.last_hidden_state[:, P - 1 :]


def row_outputs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                hidden: bool = True) -> torch.Tensor:
    """The final hidden states (``hidden``) or the logits of whole rows (SFT rows, maybe packed).

    Args:
        model: a Hugging Face causal LM (plain, peft- or DDP-wrapped; a DDP wrapper is called whole).
        input_ids, position_ids: ``[R, L]``.
        attention_mask: ``[R, 1, L, L]`` additive mask (:func:`tdrl.llm.packing.block_causal_mask`),
            passed to the model as is (eager and SDPA attention read it; flash-attention does not).
        hidden: the decoder's last hidden state (the LM head's input) instead of the logits.

    Returns:
        ``[R, L, H]`` hidden states or ``[R, L, V]`` logits.
    """
    decoder = _decoder(model) if hidden else None
    if decoder is not None:
        return decoder(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                       use_cache=False).last_hidden_state
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False,
                output_hidden_states=hidden, **({"logits_to_keep": 1} if hidden else {}))
    return out.hidden_states[-1] if hidden else out.logits


def completion_logprobs(
    model,
    td: TensorDict,
    temperature: float = 1.0,
    return_entropy: bool = False,
    fused: bool = True,
    share_prefix: bool = True,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of the completion tokens under ``model``.

    Args:
        model: a Hugging Face causal LM (plain, peft- or DDP-wrapped).
        td: rollout with ``PROMPT_IDS``/``PROMPT_MASK`` ``[N, P]`` and ``COMPLETION_IDS``/
            ``COMPLETION_MASK`` ``[N, C]`` (and ``COMPLETION_ATTENTION_MASK`` for a multi-turn
            rollout: tool tokens are read, only ``COMPLETION_MASK`` tokens are scored).
        temperature: logits are divided by it (use the sampling temperature).
        return_entropy: also return the per-token entropy of the tempered distribution.
        fused: decoder hidden states x LM head through the fused kernel (default); ``False``
            goes through the full model's logits.
        share_prefix: with ``fused``, run each distinct prompt once (see the module doc).

    Returns:
        ``logp`` ``[N, C]`` (0 where the completion mask is False), or ``(logp, entropy)``.
    """
    from tdrl import kernels

    full_mask = td[K.COMPLETION_MASK].bool()
    pids, pmask, cids, cmask, amask, width = trim_completions(td)
    P = pids.shape[1]
    if width == 0:
        zero = torch.zeros(full_mask.shape, device=full_mask.device)
        return (zero, zero.clone()) if return_entropy else zero
    if fused:
        head = lm_head(model)
        hidden = completion_hidden(model, pids, pmask, cids, amask, share_prefix=share_prefix)
        return logprobs_from_hidden(hidden, head, cids, cmask, full_mask, temperature, return_entropy)
    targets = cids[cmask]  # [n_tok]
    ids = torch.cat([pids, cids[:, :-1]], dim=-1)
    mask = torch.cat([pmask, amask.long()], dim=-1)[:, :-1]
    out = model(input_ids=ids, attention_mask=mask, position_ids=_positions(mask), use_cache=False)
    logits = out.logits[:, P - 1 :][cmask]  # [n_tok, V]
    res = kernels.token_logprobs(logits[None], targets[None], temperature=temperature, return_entropy=return_entropy)
    res = tuple(r[0] for r in res) if return_entropy else res[0]
    return _scatter(res, full_mask, return_entropy)


def _scatter(res, full_mask: torch.Tensor, return_entropy: bool):
    """Per-token values of the masked tokens (or a pair of them) back to ``[N, C]``, 0 elsewhere."""
    parts = res if return_entropy else (res,)
    # columns past the trimmed width hold no True, so the full mask orders tokens as the trimmed one does
    full = tuple(torch.zeros(full_mask.shape, dtype=p.dtype, device=p.device).masked_scatter(full_mask, p) for p in parts)
    return full if return_entropy else full[0]


def logprobs_from_hidden(
    hidden: torch.Tensor,
    head: torch.nn.Module,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    full_mask: torch.Tensor,
    temperature: float = 1.0,
    return_entropy: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Completion log-probs from :func:`completion_hidden` s through the fused LM-head kernel.

    Args:
        hidden: ``[N, C', H]`` hidden states of the trimmed batch.
        head: the LM head (a linear module: ``weight [V, H]``, optional ``bias``).
        completion_ids, completion_mask: ``[N, C']`` trimmed completions.
        full_mask: ``[N, C]`` the untrimmed completion mask (``C >= C'``).
        temperature: logits are divided by it.
        return_entropy: also return the per-token entropy.

    Returns:
        ``logp`` ``[N, C]`` (0 off ``full_mask``), or ``(logp, entropy)``.
    """
    from tdrl import kernels

    res = kernels.fused_linear_logprobs(
        hidden[completion_mask], head.weight, completion_ids[completion_mask], bias=head.bias,
        temperature=temperature, return_entropy=return_entropy,
    )
    return _scatter(res, full_mask, return_entropy)


@torch.no_grad()
def fused_path_matches(model, td: TensorDict, atol: float = 1e-3, share_prefix: bool = False) -> bool:
    """Whether the fused path (decoder hidden state x LM head) reproduces the model's logits.

    Architectures that post-process logits (soft-capping, scaling) fail this check and should
    use ``fused=False``; ``share_prefix=True`` also checks the shared-prompt KV-cache path
    (models whose cache cannot be re-indexed fall back inside it; a model that mishandles it
    fails the check).
    """
    try:
        a = completion_logprobs(model, td, fused=True, share_prefix=share_prefix)
    except (TypeError, ValueError, AttributeError, RuntimeError, IndexError):
        return False
    b = completion_logprobs(model, td, fused=False)
    return bool(torch.allclose(a.float(), b.float(), atol=atol))


def probe_batch(model, prompts: int = 2, group: int = 2, prompt_len: int = 6, completion_len: int = 5,
                seed: int = 0) -> TensorDict:
    """A small rollout of random tokens for checking the LM-head paths at construction: ``prompts``
    distinct left-padded prompts, each repeated ``group`` times (as a GRPO group), completions
    with a masked tail; on the model's device."""
    base = unwrap_model(model)
    vocab = int(base.get_input_embeddings().num_embeddings)
    device = next(base.parameters()).device
    g = torch.Generator().manual_seed(seed)
    n = prompts * group
    pids = torch.randint(0, vocab, (prompts, prompt_len), generator=g).repeat_interleave(group, 0)
    pmask = torch.ones(n, prompt_len, dtype=torch.long)
    pmask[:group, : prompt_len // 2] = 0  # the first prompt is left-padded
    cids = torch.randint(0, vocab, (n, completion_len), generator=g)
    cmask = torch.ones(n, completion_len, dtype=torch.bool)
    cmask[::2, completion_len - 2:] = False  # every other completion ends early
    td = TensorDict({K.PROMPT_IDS: pids, K.PROMPT_MASK: pmask, K.COMPLETION_IDS: cids, K.COMPLETION_MASK: cmask},
                    batch_size=[n])
    return td.to(device)


@dataclass(frozen=True)
class LMHead:
    """How the completion log-probs are computed, chosen once: through the fused LM-head kernel
    from the decoder's hidden states (``fused``), with each distinct prompt run once and its
    KV cache shared by its group (``share_prefix``), and with the token loss fused into the
    LM-head kernel (``fused_loss``, read by :class:`~tdrl.llm.losses.GRPOLoss`). Plain booleans:
    :meth:`choose` settles the automatic ones before training, and nothing changes them later.
    """

    fused: bool = True
    share_prefix: bool = True
    fused_loss: bool = True

    @classmethod
    def choose(cls, model, fused: bool | None = None, share_prefix: bool | None = None,
               fused_loss: bool | None = None, loss_matches=None) -> LMHead:
        """Settle each ``None`` (automatic) setting on :func:`probe_batch`: keep a fast path only
        where it reproduces the model's own logits (and, for ``fused_loss``, where
        ``loss_matches(head, model, td)`` says the fused loss equals the two-step loss).
        A setting given as a bool is kept as it is."""
        if None not in (fused, share_prefix, fused_loss):
            return cls(bool(fused), bool(share_prefix), bool(fused_loss))
        td = probe_batch(model)
        if fused is None:
            fused = fused_path_matches(model, td)
            if not fused:
                log.warning("the fused LM-head path does not reproduce this model's logits; using logits")
        if share_prefix is None:
            share_prefix = (not fused) or fused_path_matches(model, td, share_prefix=True)
            if not share_prefix:
                log.warning("sharing the prompt's KV cache does not reproduce this model's log-probs; not sharing")
        if fused_loss is None:
            fused_loss = True
            if fused and loss_matches is not None:
                fused_loss = bool(loss_matches(cls(fused, share_prefix, True), model, td))
                if not fused_loss:
                    log.warning("the fused LM-head + GRPO loss does not reproduce the two-step loss; using the two-step loss")
        return cls(bool(fused), bool(share_prefix), bool(fused_loss))

    def logprobs(self, model, td: TensorDict, temperature: float = 1.0, return_entropy: bool = False):
        """:func:`completion_logprobs` on this head's path."""
        return completion_logprobs(model, td, temperature, return_entropy, fused=self.fused,
                                   share_prefix=self.share_prefix)

    def hidden(self, model, td: TensorDict):
        """``(hidden, head, completion_ids, completion_mask)`` of the trimmed batch for the fused
        path, or ``None`` when the batch has no trained token."""
        pids, pmask, cids, cmask, amask, width = trim_completions(td)
        if width == 0:
            return None
        return completion_hidden(model, pids, pmask, cids, amask, share_prefix=self.share_prefix), lm_head(model), cids, cmask
