"""vLLM generation backend (optional; needs ``vllm`` and a CUDA GPU).

The engine runs in the training process; :meth:`VLLMGenerator.update_weights` copies the
trainer's weights (LoRA adapters merged) into the engine's model with its ``load_weights`` (no
reload from disk). :class:`tdrl.llm.GRPOTrainer` calls it once per generation round, before the
round generates and only when optimiser steps changed the weights since the last push
(several minibatches or epochs a round still give one push). The engine is asked for the log-probs of the
*processed* distribution (after temperature/top-p), the one tokens were drawn from; the
trainer's own log-probs differ slightly (kernels, precision), which
``GRPOLossConfig.tis_cap`` corrects.
"""

from __future__ import annotations

import os

import torch
from tensordict import TensorDict

from tdrl.llm import keys as K
from tdrl.llm._optional import available, missing_message
from tdrl.llm.generation import Generator, unwrap_model
from tdrl.llm.lora import merged_state_dict

__all__ = ["VLLMGenerator", "vllm_available"]


def vllm_available() -> bool:
    """Whether ``vllm`` is importable and a CUDA device is present."""
    return available("vllm") and torch.cuda.is_available()


class VLLMGenerator(Generator):
    """Generation with a vLLM engine.

    Args:
        model_path: a local Hugging Face model folder the engine loads once.
        tokenizer: the trainer's tokenizer (pad/eos ids).
        max_new_tokens, temperature, top_p, top_k: sampling (``top_k=0`` disables it).
        gpu_memory_utilization: fraction of GPU memory the engine may take.
        engine: an engine built by the caller (a ``vllm.LLM``, or anything with its ``generate`` and
            ``apply_model``); ``model_path``, ``gpu_memory_utilization`` and ``llm_kwargs`` are then unused.
        **llm_kwargs: forwarded to ``vllm.LLM``.

    Attributes:
        weight_pushes: how many times :meth:`update_weights` loaded weights into the engine.
    """

    def __init__(self, model_path: str | None, tokenizer, max_new_tokens: int = 32, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0, gpu_memory_utilization: float = 0.3, engine=None, **llm_kwargs):
        self.tokenizer = tokenizer
        self.max_new_tokens, self.temperature, self.top_p, self.top_k = max_new_tokens, temperature, top_p, top_k
        self.weight_pushes = 0
        if engine is not None:
            self.llm = engine
            return
        if not available("vllm"):
            raise ModuleNotFoundError(
                missing_message("vllm", extra="vllm", what="VLLMGenerator")
                + "; on a CUDA machine only (vLLM pins its own torch), else use HFGenerator",
                name="vllm",
            )
        if not torch.cuda.is_available():
            raise RuntimeError("VLLMGenerator needs a CUDA GPU; on CPU use HFGenerator")
        # in-process engine, so that update_weights reaches the model directly
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM

        kwargs = {"gpu_memory_utilization": gpu_memory_utilization, "enforce_eager": True, "logprobs_mode": "processed_logprobs", **llm_kwargs}
        try:
            self.llm = LLM(model=model_path, **kwargs)
        except TypeError:  # older vLLM without logprobs_mode
            kwargs.pop("logprobs_mode")
            self.llm = LLM(model=model_path, **kwargs)

    def generate(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, greedy: bool = False) -> TensorDict:
        from vllm import SamplingParams

        params = SamplingParams(
            n=1,
            temperature=0.0 if greedy else self.temperature,
            top_p=1.0 if greedy else self.top_p,
            top_k=-1 if greedy or self.top_k <= 0 else self.top_k,
            max_tokens=self.max_new_tokens,
            logprobs=0,
        )
        prompts = [{"prompt_token_ids": ids[m.bool()].tolist()} for ids, m in zip(prompt_ids, prompt_mask)]
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        N, C = len(outs), self.max_new_tokens
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        ids = torch.full((N, C), pad, dtype=torch.long)
        mask = torch.zeros((N, C), dtype=torch.bool)
        logp = torch.zeros((N, C), dtype=torch.float32)
        for i, o in enumerate(outs):
            c = o.outputs[0]
            toks = list(c.token_ids)[:C]
            ids[i, : len(toks)] = torch.tensor(toks, dtype=torch.long)
            mask[i, : len(toks)] = True
            if c.logprobs is not None:
                logp[i, : len(toks)] = torch.tensor([lp[t].logprob for lp, t in zip(c.logprobs, toks)])
        dev = prompt_ids.device
        return TensorDict({K.COMPLETION_IDS: ids, K.COMPLETION_MASK: mask, K.SAMPLE_LOG_PROB: logp}, batch_size=[N]).to(dev)

    def update_weights(self, model) -> None:
        """Load the trainer's current weights (LoRA merged) into the engine's model."""
        state = merged_state_dict(unwrap_model(model))
        weights = [(k, v) for k, v in state.items()]

        def load(engine_model):
            engine_model.load_weights(weights)

        if hasattr(self.llm, "apply_model"):
            self.llm.apply_model(load)
        else:  # vLLM < 0.9
            load(self.llm.llm_engine.model_executor.driver_worker.model_runner.model)
        self.weight_pushes += 1
