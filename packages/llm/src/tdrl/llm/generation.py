"""Generation backends behind one small interface.

A backend turns left-padded prompts into completions plus the log-probabilities of the
tokens it sampled, and receives new policy weights after each optimiser step:

>>> out = generator.generate(prompt_ids, prompt_mask)   # TensorDict [N]
>>> generator.update_weights(model)                       # after optimizer.step()

:class:`HFGenerator` wraps ``model.generate`` of ``transformers`` (it shares the trainer's
model, so weight updates are free); :class:`tdrl.llm.vllm_generator.VLLMGenerator` drives a vLLM
engine on a GPU.
"""

from __future__ import annotations

import abc

import torch
from tensordict import TensorDict

from tdrl.llm import keys as K

__all__ = ["Generator", "HFGenerator", "completion_mask_from_eos", "unwrap_model"]


def unwrap_model(model):
    """The module under a ``DistributedDataParallel`` (or ``torch.compile``) wrapper."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if inner is None:
            return model
        model = inner


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
        """Receive the trainer's weights after an optimiser step (no-op when shared)."""


class HFGenerator(Generator):
    """Generation with ``transformers``' ``model.generate`` on the trainer's own model.

    Args:
        model: a causal LM (possibly DDP- or peft-wrapped); weights are shared with training.
        tokenizer: its tokenizer (supplies pad/eos ids).
        max_new_tokens: completion length cap.
        temperature: sampling temperature.
        top_p, top_k: nucleus / top-k filtering (``1.0`` / ``0`` disable them). The returned
            log-probs are those of the filtered distribution the tokens were drawn from.
    """

    def __init__(self, model, tokenizer, max_new_tokens: int = 32, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0):
        if temperature <= 0:
            raise ValueError(f"HFGenerator: temperature must be > 0, got {temperature}; use greedy=True for greedy decoding")
        self.model, self.tokenizer = model, tokenizer
        self.max_new_tokens, self.temperature, self.top_p, self.top_k = max_new_tokens, temperature, top_p, top_k

    @torch.no_grad()
    def generate(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, greedy: bool = False) -> TensorDict:
        model = unwrap_model(self.model)
        was_training = model.training
        model.eval()
        eos = model.generation_config.eos_token_id
        if eos is None:
            eos = self.tokenizer.eos_token_id
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else eos
        sampling = {} if greedy else {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k}
        try:
            out = model.generate(
                input_ids=prompt_ids,
                attention_mask=prompt_mask,
                do_sample=not greedy,
                max_new_tokens=self.max_new_tokens,
                output_scores=True,
                return_dict_in_generate=True,
                pad_token_id=pad,
                eos_token_id=eos,
                **sampling,
            )
        finally:
            model.train(was_training)
        ids = out.sequences[:, prompt_ids.shape[1] :]
        logps = [
            torch.log_softmax(s.float(), dim=-1).gather(-1, ids[:, t : t + 1]).squeeze(-1)
            for t, s in enumerate(out.scores)
        ]
        logp = torch.stack(logps, dim=1) if logps else ids.new_zeros(ids.shape, dtype=torch.float32)
        mask = completion_mask_from_eos(ids, eos)
        logp = torch.where(mask, logp, torch.zeros_like(logp))
        return TensorDict(
            {K.COMPLETION_IDS: ids, K.COMPLETION_MASK: mask, K.SAMPLE_LOG_PROB: logp},
            batch_size=[ids.shape[0]],
            device=ids.device,
        )
