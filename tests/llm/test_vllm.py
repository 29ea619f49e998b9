"""vLLM backend: skipped cleanly without vllm or CUDA; on a GPU, generation and weight push."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from tdrl.llm import VLLMGenerator
from tdrl.llm.vllm_generator import vllm_available

needs_vllm = pytest.mark.skipif(not vllm_available(), reason="needs vllm and a CUDA device")


def test_clear_error_without_vllm():
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed")
    with pytest.raises(ImportError, match="pip install"):
        VLLMGenerator("unused", tokenizer=None)


@pytest.mark.gpu
@needs_vllm
def test_vllm_generates_and_receives_weights(_tiny):
    from tdrl.llm import completion_logprobs, tokenize_prompts
    from tensordict import TensorDict

    folder, model, tok = _tiny
    gen = VLLMGenerator(str(folder), tok, max_new_tokens=4, temperature=1.0, gpu_memory_utilization=0.2)
    ids, mask = tokenize_prompts(tok, ["Q: 1+2=", "Q: 3+4="])
    out = gen.generate(ids, mask)
    td = TensorDict({"prompt_ids": ids, "prompt_mask": mask, **out.to_dict()}, batch_size=[2])
    logp = completion_logprobs(model, td)
    torch.testing.assert_close(logp, out["sample_log_prob"], atol=5e-2, rtol=0)
    # push different weights: greedy outputs follow the trainer's model
    with torch.no_grad():
        model.lm_head.weight.mul_(5.0)
    gen.update_weights(model)
    from tdrl.llm import HFGenerator

    a = gen.generate(ids, mask, greedy=True)["completion_ids"]
    b = HFGenerator(model, tok, max_new_tokens=4).generate(ids, mask, greedy=True)["completion_ids"]
    assert torch.equal(a.cpu(), b.cpu())
