"""Generation backends behind one small interface.

A backend turns left-padded prompts into completions plus the log-probabilities of the
tokens it sampled, and receives new policy weights before a generation round that follows
optimiser steps (:class:`tdrl.llm.GRPOTrainer` pushes once a round, however many steps it took):

>>> generator.update_weights(model)                       # the round's weights, once
>>> out = generator.generate(prompt_ids, prompt_mask)   # TensorDict [N]

:class:`HFGenerator` wraps ``model.generate`` of ``transformers`` (it shares the trainer's
model, so weight updates are free); :class:`tdrl.llm.vllm_generator.VLLMGenerator` drives a vLLM
engine on a GPU.
"""

from __future__ import annotations

import abc
import inspect
import math
import numbers

import torch
from tensordict import TensorDict

from tdrl.llm import keys as K
from tdrl.llm.kv_cache import preallocate_cache

__all__ = ["Generator", "HFGenerator", "cache_kwarg", "cache_of", "check_sampling", "completion_mask_from_eos", "sample_inverse_cdf", "unique_prompts", "unwrap_model"]


def check_sampling(owner: str, max_new_tokens, temperature, top_p, top_k) -> None:
    """Raise ``ValueError`` naming the field when a sampling setting is out of range.

    ``max_new_tokens`` an integer >= 1; ``temperature`` finite and > 0 (greedy decoding is
    ``generate(..., greedy=True)``); ``top_p`` in ``(0, 1]``; ``top_k`` an integer >= 0 (0: off).
    """
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, numbers.Integral) or max_new_tokens < 1:
        raise ValueError(f"{owner}: max_new_tokens={max_new_tokens!r}; expected an integer >= 1")
    if not _real(temperature) or not temperature > 0:
        raise ValueError(
            f"{owner}: temperature={temperature!r}; expected a finite number > 0 (for greedy decoding call "
            f"generate(..., greedy=True))"
        )
    if not _real(top_p) or not 0 < top_p <= 1:
        raise ValueError(f"{owner}: top_p={top_p!r}; expected a number in (0, 1] (1 disables nucleus filtering)")
    if isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral) or top_k < 0:
        raise ValueError(f"{owner}: top_k={top_k!r}; expected an integer >= 0 (0 disables top-k filtering)")


def _real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


def unwrap_model(model):
    """The module under a ``DistributedDataParallel`` (or ``torch.compile``) wrapper."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if inner is None:
            return model
        model = inner


def cache_kwarg(module) -> str:
    """Name of the KV-cache argument of ``module.forward``.

    transformers >= 5.2x names it ``cache``, older releases ``past_key_values``.
    """
    if hasattr(module, "get_base_model"):  # peft forwards **kwargs to the transformers model
        module = module.get_base_model()
    params = inspect.signature(module.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def unique_prompts(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """The distinct rows of a left-padded prompt batch, or ``None`` when all rows differ.

    Args:
        prompt_ids: ``[N, P]`` ids.
        prompt_mask: ``[N, P]`` attention mask.

    Returns:
        ``(ids [U, P], mask [U, P], inverse [N])`` with ``ids[inverse] == prompt_ids``, or
        ``None`` when ``U == N`` (nothing to share).
    """
    P = prompt_ids.shape[1]
    rows = torch.cat([prompt_ids, prompt_mask.to(prompt_ids.dtype)], dim=-1)
    uniq, inverse = torch.unique(rows, dim=0, return_inverse=True)
    if uniq.shape[0] == rows.shape[0]:
        return None
    return uniq[:, :P], uniq[:, P:].to(prompt_mask.dtype), inverse


def completion_mask_from_eos(completion_ids: torch.Tensor, eos_token_id: int | list[int] | None) -> torch.Tensor:
    """Mask of generated tokens: everything up to and including the first EOS.

    Args:
        completion_ids: ``[N, C]`` generated ids (padding after EOS).
        eos_token_id: one id or a list of ids; ``None`` keeps every token.

    Returns:
        ``[N, C]`` bool.
    """
    if eos_token_id is None:
        return torch.ones_like(completion_ids, dtype=torch.bool)
    eos_ids = torch.as_tensor(eos_token_id, device=completion_ids.device).reshape(-1)
    is_eos = torch.isin(completion_ids, eos_ids)
    # tokens strictly after the first EOS are padding
    after = (is_eos.long().cumsum(-1) - is_eos.long()) > 0
    return ~after


def sample_inverse_cdf(probs: torch.Tensor) -> torch.Tensor:
    """One token per row drawn with probability ``probs`` (inverse-CDF sampling).

    The cumulative sum runs in float64, so each token's interval keeps its probability to ~1e-16
    (float32 would round the 49,152 boundaries of an LLM's vocabulary by up to ~6e-8 each); the
    uniform draw stays strictly below the total, so a token of probability 0 (filtered) is
    never drawn. One uniform a row: on a CPU ``[16, 49152]`` takes ~3 ms against ~13 ms for an
    exponential race (``argmax p / E``), which needs one random number per token.

    Args:
        probs: ``[N, V]`` non-negative, each row with a positive sum (need not be normalised).

    Returns:
        ``[N]`` int64 token ids.
    """
    cdf = probs.to(torch.float64).cumsum_(-1)
    total = cdf[:, -1:]
    u = torch.rand(total.shape, dtype=torch.float64, device=probs.device) * total
    u = torch.minimum(u, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, u, right=True).squeeze(-1)


class Generator(abc.ABC):
    """Interface of generation backends.

    Attributes:
        temperature: sampling temperature; the trainer computes its log-probs at the same one.
        max_new_tokens: completion length cap ``C``.
    """

    temperature: float = 1.0
    max_new_tokens: int = 32

    @abc.abstractmethod
    def generate(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, greedy: bool = False) -> TensorDict:
        """Sample one completion per prompt row.

        Args:
            prompt_ids: ``[N, P]`` left-padded ids.
            prompt_mask: ``[N, P]`` attention mask.
            greedy: decode greedily (evaluation) instead of sampling.

        Returns:
            TensorDict of batch ``[N]`` with ``COMPLETION_IDS`` ``[N, C]`` int64,
            ``COMPLETION_MASK`` ``[N, C]`` bool and ``SAMPLE_LOG_PROB`` ``[N, C]`` float32
            (0 where the mask is False).
        """

    def update_weights(self, model) -> None:  # noqa: B027 - optional hook
        """Receive the trainer's current weights (no-op when the model is shared); the trainer
        calls it once before a round's generation when its weights changed."""


def _is_fsdp(model) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def _ranks_must_sync(model) -> bool:
    """Whether every rank must run the same number of forwards (an FSDP-sharded model
    all-gathers its weights in each forward, a collective)."""
    import torch.distributed as dist

    return _is_fsdp(model) and dist.is_initialized() and dist.get_world_size() > 1


def _all_done(done: torch.Tensor, synced: bool) -> bool:
    """Whether every row is done (on every rank when ``synced``)."""
    if not synced:
        return bool(done.all())
    import torch.distributed as dist

    flag = done.all().to(torch.int32).reshape(1)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def cache_of(out):
    cache = out.get("cache", None)
    return cache if cache is not None else out.get("past_key_values", None)


def _filter_top_k_top_p(scores: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Set logits outside the top-k / nucleus to -inf (``[N, V]``)."""
    if top_k and 0 < top_k < scores.shape[-1]:
        kth = torch.topk(scores, top_k, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=True, dim=-1)
        probs = torch.softmax(sorted_scores, dim=-1)
        # drop tokens whose preceding cumulative mass already reaches top_p (keep at least one)
        drop = (probs.cumsum(-1) - probs) >= top_p
        scores = scores.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return scores


class HFGenerator(Generator):
    """Generation with a ``transformers`` causal LM, sharing the trainer's model.

    By default a lean sampling loop over the model's forward with its KV cache (one forward per
    new token, no logits-processor machinery, stops when every row has emitted EOS), under
    ``torch.inference_mode``; a prompt repeated across rows (a GRPO group) is prefilled once
    and its KV cache shared; the KV cache has the completion's room allocated once
    (:func:`tdrl.llm.kv_cache.preallocate_cache`). Tokens are drawn by inverse-CDF sampling
    (:func:`sample_inverse_cdf`, one uniform a row) and the sampled token's log-prob is read from the same tempered,
    filtered distribution it was drawn from. ``use_generate=True`` calls ``model.generate`` instead (for models that need its
    special cases), reading log-probs from ``output_scores``.

    Args:
        model: a causal LM (possibly DDP- or peft-wrapped); weights are shared with training.
        tokenizer: its tokenizer (supplies pad/eos ids).
        max_new_tokens: completion length cap.
        temperature: sampling temperature.
        top_p, top_k: nucleus / top-k filtering (``1.0`` / ``0`` disable them).
        use_generate: go through ``model.generate``.
        share_prefix: prefill each distinct prompt once and copy its KV cache to the rows
            that repeat it (a GRPO group); falls back to a full prefill when the model's cache
            cannot be re-indexed.
    """

    def __init__(self, model, tokenizer, max_new_tokens: int = 32, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0, use_generate: bool = False, share_prefix: bool = True):
        check_sampling("HFGenerator", max_new_tokens, temperature, top_p, top_k)
        self.model, self.tokenizer = model, tokenizer
        self.max_new_tokens, self.temperature, self.top_p, self.top_k = max_new_tokens, temperature, top_p, top_k
        self.use_generate = use_generate
        self.share_prefix = share_prefix

    def _ids(self, model):
        eos = model.generation_config.eos_token_id
        if eos is None:
            eos = self.tokenizer.eos_token_id
        pad = self.tokenizer.pad_token_id
        if pad is None:
            pad = eos[0] if isinstance(eos, list) else eos
        return eos, pad

    def generate(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, greedy: bool = False) -> TensorDict:
        model = unwrap_model(self.model)
        was_training = model.training
        model.eval()
        try:
            run = self._generate_hf if self.use_generate else self._generate_loop
            # FSDP's all-gather buffers outlive the call: inference tensors would break the next forward
            with torch.no_grad() if _is_fsdp(model) else torch.inference_mode():
                ids, logp = run(model, prompt_ids, prompt_mask, greedy)
        finally:
            model.train(was_training)
        # inference tensors cannot be saved for backward (the trainer embeds these ids)
        ids, logp = ids.clone(), logp.clone()
        mask = completion_mask_from_eos(ids, self._ids(model)[0])
        logp = torch.where(mask, logp, torch.zeros_like(logp))
        return TensorDict(
            {K.COMPLETION_IDS: ids, K.COMPLETION_MASK: mask, K.SAMPLE_LOG_PROB: logp},
            batch_size=[ids.shape[0]],
            device=ids.device,
        )

    def _generate_loop(self, model, prompt_ids, prompt_mask, greedy):
        eos, pad = self._ids(model)
        device = prompt_ids.device
        eos_ids = torch.as_tensor(eos if eos is not None else [], device=device).reshape(-1)
        n, P = prompt_ids.shape
        C = self.max_new_tokens
        synced = _ranks_must_sync(model)
        # one preallocated mask for prompt + completion; step t reads its first P + t + 1 columns
        attn = torch.ones(n, P + C, dtype=torch.long, device=device)
        attn[:, :P] = prompt_mask
        pos = (attn[:, :P].cumsum(-1) - 1).clamp(min=0)
        cache_kw = cache_kwarg(model)
        # prefill each distinct prompt once (a GRPO group repeats its prompt G times), then
        # give every row its prompt's cache
        uniq = unique_prompts(prompt_ids, prompt_mask) if self.share_prefix else None
        cache = None
        if uniq is not None:
            u_ids, u_mask, inv = uniq
            u_pos = (u_mask.cumsum(-1) - 1).clamp(min=0)
            out = model(input_ids=u_ids, attention_mask=u_mask, position_ids=u_pos, use_cache=True, logits_to_keep=1)
            cache = cache_of(out)
            if preallocate_cache(cache, C, inv):  # each row gets its prompt's keys / values, with room for C tokens
                logits = out.logits[:, -1][inv]
            elif hasattr(cache, "batch_select_indices"):
                cache.batch_select_indices(inv)
                logits = out.logits[:, -1][inv]
            else:  # a legacy tuple cache: prefill every row instead
                cache = None
        if cache is None:
            out = model(input_ids=prompt_ids, attention_mask=attn[:, :P], position_ids=pos, use_cache=True, logits_to_keep=1)
            cache, logits = cache_of(out), out.logits[:, -1]
            preallocate_cache(cache, C)  # written in place from here on (no torch.cat per token); else it grows
        next_pos = pos[:, -1:] + 1
        done = torch.zeros(n, dtype=torch.bool, device=device)
        ids = torch.full((n, C), pad, dtype=torch.long, device=device)
        logps = torch.zeros(n, C, dtype=torch.float32, device=device)
        for t in range(C):
            scores = logits.float()
            if not greedy:
                scores = _filter_top_k_top_p(scores / self.temperature, self.top_k, self.top_p)
            lp_all = torch.log_softmax(scores, dim=-1)
            if greedy:
                tok = lp_all.argmax(-1)
            else:
                tok = sample_inverse_cdf(lp_all.exp())
            tok = tok.masked_fill(done, pad)
            ids[:, t] = tok
            logps[:, t] = lp_all.gather(-1, tok[:, None]).squeeze(-1)
            done = done | torch.isin(tok, eos_ids)
            if t == C - 1 or _all_done(done, synced):
                break
            out = model(input_ids=tok[:, None], attention_mask=attn[:, : P + t + 1], position_ids=next_pos, use_cache=True, **{cache_kw: cache})
            cache, logits = cache_of(out), out.logits[:, -1]
            next_pos = next_pos + 1
        return ids[:, : t + 1], logps[:, : t + 1]

    def _generate_hf(self, model, prompt_ids, prompt_mask, greedy):
        eos, pad = self._ids(model)
        sampling = {} if greedy else {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k}
        out = model.generate(
            input_ids=prompt_ids,
            attention_mask=prompt_mask,
            do_sample=not greedy,
            max_new_tokens=self.max_new_tokens,
            output_scores=True,
            return_dict_in_generate=True,
            pad_token_id=pad,
            eos_token_id=eos,
            synced_gpus=_ranks_must_sync(model),
            **sampling,
        )
        ids = out.sequences[:, prompt_ids.shape[1] :]
        logps = [torch.log_softmax(s.float(), dim=-1).gather(-1, ids[:, t : t + 1]).squeeze(-1) for t, s in enumerate(out.scores)]
        return ids, torch.stack(logps, dim=1)
