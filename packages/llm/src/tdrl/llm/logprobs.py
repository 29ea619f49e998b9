"""Per-token log-probs of completions from a causal LM, through the fused LM-head kernel.

The model runs once over ``prompt + completion``; the last hidden state at the positions that
predict completion tokens is fed, masked rows only, to
:func:`tdrl.kernels.fused_linear_logprobs` together with the LM-head weight, so the
``[tokens, vocab]`` log-softmax is never materialised (memory O(chunk x vocab)).
Models whose last hidden state is not the LM-head input can use ``fused=False``, which
computes logits and calls :func:`tdrl.kernels.token_logprobs`.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict

from tdrl.llm import keys as K
from tdrl.llm.data import concat_prompt_completion
from tdrl.llm.generation import unwrap_model

__all__ = ["completion_logprobs", "fused_path_matches"]


def _head(model):
    base = unwrap_model(model)
    head = base.get_output_embeddings()
    if head is None or not hasattr(head, "weight"):
        raise ValueError(
            f"completion_logprobs: {type(base).__name__} has no linear output embedding; use fused=False"
        )
    return head


def completion_logprobs(
    model,
    td: TensorDict,
    temperature: float = 1.0,
    return_entropy: bool = False,
    fused: bool = True,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of the completion tokens under ``model``.

    Args:
        model: a Hugging Face causal LM (plain, peft- or DDP-wrapped).
        td: rollout with ``PROMPT_IDS``/``PROMPT_MASK`` ``[N, P]`` and ``COMPLETION_IDS``/
            ``COMPLETION_MASK`` ``[N, C]``.
        temperature: logits are divided by it (use the sampling temperature).
        return_entropy: also return the per-token entropy of the tempered distribution.
        fused: use the fused hidden-state x LM-head kernel (default); ``False`` goes through
            full logits.

    Returns:
        ``logp`` ``[N, C]`` (0 where the completion mask is False), or ``(logp, entropy)``.
    """
    from tdrl import kernels

    ids, mask, pos = concat_prompt_completion(td)
    P = td[K.PROMPT_IDS].shape[1]
    cmask = td[K.COMPLETION_MASK].bool()
    targets = td[K.COMPLETION_IDS][cmask]  # [n_tok]
    if fused:
        head = _head(model)
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, output_hidden_states=True, use_cache=False, logits_to_keep=1)
        hidden = out.hidden_states[-1][:, P - 1 : -1]  # [N, C, H]: position t predicts token t+1
        res = kernels.fused_linear_logprobs(
            hidden[cmask], head.weight, targets, bias=head.bias, temperature=temperature, return_entropy=return_entropy
        )
    else:
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False)
        logits = out.logits[:, P - 1 : -1][cmask]  # [n_tok, V]
        res = kernels.token_logprobs(logits[None], targets[None], temperature=temperature, return_entropy=return_entropy)
        res = tuple(r[0] for r in res) if return_entropy else res[0]
    parts = res if return_entropy else (res,)
    full = tuple(torch.zeros(cmask.shape, dtype=p.dtype, device=p.device).masked_scatter(cmask, p) for p in parts)
    return full if return_entropy else full[0]


@torch.no_grad()
def fused_path_matches(model, td: TensorDict, atol: float = 1e-3) -> bool:
    """Whether the fused path (last hidden state x LM head) reproduces the model's logits.

    Architectures that post-process logits (soft-capping, scaling) fail this check and should
    use ``fused=False``.
    """
    try:
        a = completion_logprobs(model, td, fused=True)
    except (TypeError, ValueError):
        return False
    b = completion_logprobs(model, td, fused=False)
    return bool(torch.allclose(a.float(), b.float(), atol=atol))
