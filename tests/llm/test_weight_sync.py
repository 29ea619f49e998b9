"""The GRPO trainer pushes weights to its generator once per generation round.

vLLM cannot run on this CPU machine, so the real :class:`VLLMGenerator` (its ``generate`` and
``update_weights``, LoRA merge included) runs against a stand-in at the engine boundary only: a
``vllm.LLM`` look-alike whose model is a separate copy of the tiny model that gets weights
solely through ``apply_model(fn)`` -> ``load_weights``, and ``vllm.SamplingParams``.
"""

from __future__ import annotations

import copy
import sys
import types
from dataclasses import dataclass

import pytest
import torch

from tdrl.llm import GRPOConfig, GRPOTrainer, HFGenerator, VLLMGenerator


def _length_reward(prompts, completions, **_):
    """Varies within a group, so every optimiser step moves the weights."""
    return [float(len(c)) for c in completions]


@dataclass
class _SamplingParams:  # the fields VLLMGenerator sets
    n: int
    temperature: float
    top_p: float
    top_k: int
    max_tokens: int
    logprobs: int


class _EngineModel:
    """What ``apply_model`` hands over: the engine's own weights, reachable only by ``load_weights``."""

    def __init__(self, hf_model):
        self.hf = hf_model
        self.loads = 0

    def load_weights(self, weights):
        self.hf.load_state_dict(dict(weights), strict=True)
        self.loads += 1


class _FakeLLM:
    """``vllm.LLM``'s surface as VLLMGenerator uses it; generation by the engine's own copy."""

    def __init__(self, hf_model, tokenizer):
        self.model = _EngineModel(copy.deepcopy(hf_model))
        self.tokenizer = tokenizer
        self.generate_calls = 0
        self.loads_at_generate: list[int] = []

    def apply_model(self, fn):
        return fn(self.model)

    def generate(self, prompts, params, use_tqdm=False):
        self.generate_calls += 1
        self.loads_at_generate.append(self.model.loads)
        rows = [p["prompt_token_ids"] for p in prompts]
        P = max(len(r) for r in rows)
        pad = self.tokenizer.pad_token_id
        ids = torch.tensor([[pad] * (P - len(r)) + r for r in rows])
        mask = torch.tensor([[0] * (P - len(r)) + [1] * len(r) for r in rows])
        gen = HFGenerator(self.model.hf, self.tokenizer, max_new_tokens=params.max_tokens, temperature=params.temperature or 1.0)
        out = gen.generate(ids, mask, greedy=params.temperature == 0.0)
        results = []
        for toks, m, lp in zip(out["completion_ids"], out["completion_mask"], out["sample_log_prob"]):
            kept = toks[m].tolist()
            logprobs = [{t: types.SimpleNamespace(logprob=float(x))} for t, x in zip(kept, lp[m].tolist())]
            results.append(types.SimpleNamespace(outputs=[types.SimpleNamespace(token_ids=kept, logprobs=logprobs)]))
        return results


@pytest.fixture
def fake_vllm(monkeypatch):
    module = types.ModuleType("vllm")
    module.SamplingParams = _SamplingParams
    monkeypatch.setitem(sys.modules, "vllm", module)


def _data(task):
    import datasets

    return datasets.Dataset.from_list(task.rows(64, seed=3))


@pytest.mark.parametrize("epochs,minibatch", [(1, None), (2, 4)])
def test_one_push_per_round_however_many_optimiser_steps(tiny, task, fake_vllm, epochs, minibatch):
    _, model, tok = tiny
    engine = _FakeLLM(model, tok)
    gen = VLLMGenerator(None, tok, max_new_tokens=3, temperature=1.0, engine=engine)
    cfg = GRPOConfig(steps=3, prompts_per_step=2, group_size=4, max_new_tokens=3, lr=1e-2, epochs=epochs,
                     minibatch_size=minibatch, warmup_steps=0, progress=False, fused_logprobs=False,
                     share_prefix=False, fused_loss=False)
    trainer = GRPOTrainer(model, tok, [_length_reward], _data(task), cfg, generator=gen)
    trainer.train()
    steps_per_round = epochs * (8 // (minibatch or 8))
    assert trainer._optimizer_steps == 3 * steps_per_round
    # one push before each round: the first (the engine may hold other weights), then one per round
    assert engine.generate_calls == 3 and engine.model.loads == 3 and gen.weight_pushes == 3
    assert engine.loads_at_generate == [1, 2, 3]
    # the engine holds the weights of the last push (before round 3), not those round 3 made
    engine_params = list(engine.model.hf.parameters())
    assert any(not torch.equal(q, p) for q, p in zip(engine_params, model.parameters()))
    assert trainer.sync_generator() is True and engine.model.loads == 4
    for (name, p), q in zip(model.named_parameters(), engine.model.hf.parameters(), strict=True):
        torch.testing.assert_close(q, p.detach(), msg=name)
    assert trainer.sync_generator() is False and engine.model.loads == 4  # unchanged weights: no push


def test_lora_adapters_are_pushed_merged(tiny, fake_vllm):
    pytest.importorskip("peft")
    from tdrl.llm import apply_lora

    _, model, tok = tiny
    engine = _FakeLLM(model, tok)
    peft_model = apply_lora(model, r=2, alpha=4)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    VLLMGenerator(None, tok, max_new_tokens=3, engine=engine).update_weights(peft_model)
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        want = peft_model(input_ids=ids).logits
        got = engine.model.hf(input_ids=ids).logits
        with peft_model.disable_adapter():
            base = peft_model(input_ids=ids).logits
    assert (want - base).abs().max() > 1e-2  # the adapters matter
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
