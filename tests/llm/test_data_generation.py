"""Tiny model round trip, data layout, HF generation log-probs, fused log-probs, SFT masking."""

from __future__ import annotations

import json

import pytest
import torch
from tensordict import TensorDict

from tdrl.llm import (
    HFGenerator,
    SFTLoss,
    completion_logprobs,
    completion_mask_from_eos,
    fused_path_matches,
    load_model_and_tokenizer,
    load_prompt_dataset,
    render_prompts,
    tokenize_prompts,
    tokenize_sft,
)
from tdrl.llm import keys as K


def test_from_pretrained_round_trip(tiny):
    folder, model, tok = tiny
    model2, tok2 = load_model_and_tokenizer(folder)
    assert "Qwen2" not in type(tok2).__name__, "a locally trained tokenizer must not load as Qwen2Tokenizer"
    assert tok2.padding_side == "left"
    text = "Q: 12+7=19"
    assert tok2(text)["input_ids"] == tok(text)["input_ids"]
    digits = [tok.convert_ids_to_tokens(i) for i in tok("1234")["input_ids"]]
    assert digits == ["1", "2", "3", "4"], "digits must be single tokens"
    x = torch.tensor([tok(text)["input_ids"]])
    torch.testing.assert_close(model(x).logits, model2(x).logits)


def test_completion_mask_from_eos():
    ids = torch.tensor([[5, 6, 2, 0, 0], [5, 2, 2, 2, 2], [7, 7, 7, 7, 7]])
    m = completion_mask_from_eos(ids, 2)
    assert m.tolist() == [[1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]]
    assert completion_mask_from_eos(ids, [6, 7]).tolist()[2] == [1, 0, 0, 0, 0]


def test_prompts_left_padded_and_sft_layout(tiny):
    _, _, tok = tiny
    ids, mask = tokenize_prompts(tok, ["Q: 1+2=", "Q: 11+12="])
    assert ids[0, 0] == tok.pad_token_id and mask[0, 0] == 0 and mask[:, -1].all()
    td = tokenize_sft(tok, ["Q: 1+2=", "Q: 11+12="], ["3", "23"])
    assert td[K.COMPLETION_MASK].tolist() == [[True, True, False], [True, True, True]]
    assert td[K.COMPLETION_IDS][0, 1] == tok.eos_token_id and td[K.COMPLETION_IDS][1, 2] == tok.eos_token_id


def test_load_prompt_dataset_sources(tmp_path, tiny):
    rows = [{"question": "Q: 1+1=", "answer": "2"}, {"question": "Q: 2+2=", "answer": "4"}]
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    for src in (str(path), rows, {"question": [r["question"] for r in rows], "answer": ["2", "4"]}):
        ds = load_prompt_dataset(src, prompt_column="question")
        assert ds["prompt"] == ["Q: 1+1=", "Q: 2+2="] and ds["answer"] == ["2", "4"]
    with pytest.raises(KeyError, match="prompt_column"):
        load_prompt_dataset(rows)
    _, _, tok = tiny
    tok = tok.__class__.from_pretrained(tiny[0])
    tok.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}A: {% endif %}"
    out = render_prompts(tok, [[{"role": "user", "content": "1+1"}], "plain"])
    assert out == ["user: 1+1\nA: ", "plain"]


def _rollout(model, tok, temperature=0.7, n=6, max_new_tokens=5, seed=0):
    ids, mask = tokenize_prompts(tok, ["Q: 1+2=", "Q: 13+4=", "Q: 5+5="] * (n // 3))
    torch.manual_seed(seed)
    gen = HFGenerator(model, tok, max_new_tokens=max_new_tokens, temperature=temperature).generate(ids, mask)
    return TensorDict({K.PROMPT_IDS: ids, K.PROMPT_MASK: mask, **gen.to_dict()}, batch_size=[n])


def test_generator_logprobs_match_trainer(tiny):
    _, model, tok = tiny
    model.lm_head.weight.data.mul_(8.0)  # sharpen the random model so EOS shows up early in some rows
    td = _rollout(model, tok, temperature=0.7, n=12)
    mask = td[K.COMPLETION_MASK]
    assert mask.any(1).all() and (td[K.SAMPLE_LOG_PROB][~mask] == 0).all()
    logp = completion_logprobs(model, td, temperature=0.7)
    torch.testing.assert_close(logp, td[K.SAMPLE_LOG_PROB], rtol=1e-4, atol=1e-4)
    # the lean sampling loop and model.generate agree token for token in greedy mode
    a = HFGenerator(model, tok, max_new_tokens=5).generate(td[K.PROMPT_IDS], td[K.PROMPT_MASK], greedy=True)
    b = HFGenerator(model, tok, max_new_tokens=5, use_generate=True).generate(td[K.PROMPT_IDS], td[K.PROMPT_MASK], greedy=True)
    C = min(a[K.COMPLETION_IDS].shape[1], b[K.COMPLETION_IDS].shape[1])
    assert torch.equal(a[K.COMPLETION_IDS][:, :C] * a[K.COMPLETION_MASK][:, :C], b[K.COMPLETION_IDS][:, :C] * b[K.COMPLETION_MASK][:, :C])
    torch.testing.assert_close(a[K.SAMPLE_LOG_PROB][:, :C], b[K.SAMPLE_LOG_PROB][:, :C], rtol=1e-4, atol=1e-4)
    # model.generate's sampled log-probs also match the trainer's
    torch.manual_seed(1)
    s = HFGenerator(model, tok, max_new_tokens=5, temperature=0.7, use_generate=True).generate(td[K.PROMPT_IDS], td[K.PROMPT_MASK])
    td2 = TensorDict({K.PROMPT_IDS: td[K.PROMPT_IDS], K.PROMPT_MASK: td[K.PROMPT_MASK], **s.to_dict()}, batch_size=[12])
    torch.testing.assert_close(completion_logprobs(model, td2, temperature=0.7), s[K.SAMPLE_LOG_PROB], rtol=1e-4, atol=1e-4)


def test_top_k_top_p_filtering():
    from tdrl.llm.generation import _filter_top_k_top_p

    x = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.isinf(_filter_top_k_top_p(x, 2, 1.0)).tolist() == [[False, False, True, True]]
    # nucleus 0.7: 0.5 then 0.8 >= 0.7 -> keep the first two
    assert torch.isinf(_filter_top_k_top_p(x, 0, 0.7)).tolist() == [[False, False, True, True]]
    assert torch.isinf(_filter_top_k_top_p(x, 0, 0.4)).tolist() == [[False, True, True, True]]


def test_fused_path_equals_logits_path(tiny):
    _, model, tok = tiny
    td = _rollout(model, tok)
    assert fused_path_matches(model, td)
    a, ea = completion_logprobs(model, td, 0.9, return_entropy=True, fused=True)
    b, eb = completion_logprobs(model, td, 0.9, return_entropy=True, fused=False)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ea, eb, rtol=1e-5, atol=1e-5)


def test_gradients_only_through_generated_tokens(tiny):
    _, model, tok = tiny
    td = _rollout(model, tok)
    td[K.COMPLETION_MASK][:, -2:] = False  # pretend the last two tokens are padding after EOS
    logp = completion_logprobs(model, td)
    assert (logp[~td[K.COMPLETION_MASK]] == 0).all()
    g = torch.autograd.grad(logp.sum(), model.lm_head.weight)[0]
    td2 = td.clone()
    td2[K.COMPLETION_IDS][:, -2:] = tok.pad_token_id + 5  # change the padded tokens only
    g2 = torch.autograd.grad(completion_logprobs(model, td2).sum(), model.lm_head.weight)[0]
    torch.testing.assert_close(g, g2)


def test_sft_fused_loss_equals_full_logits_path(tiny):
    """SFTLoss' fused path (hidden states -> fused_linear_cross_entropy, gradients formed in
    the forward) gives the full-logits loss and the same gradient for every parameter."""
    _, model, tok = tiny
    td = tokenize_sft(tok, ["Q: 1+2=", "Q: 11+12=", "Q: 3+4="], ["3", "23", "7 "])
    params = [p for p in model.parameters() if p.requires_grad]
    out = {}
    for fused in (True, False):
        loss = SFTLoss(fused=fused)(model, td)["loss_sft"]
        out[fused] = (loss, torch.autograd.grad(loss, params))
    torch.testing.assert_close(out[True][0], out[False][0], rtol=1e-5, atol=1e-5)
    for a, b in zip(out[True][1], out[False][1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_sft_ignores_prompt_tokens(tiny):
    _, model, tok = tiny
    td = tokenize_sft(tok, ["Q: 1+2=", "Q: 11+12="], ["3", "23"])
    loss = SFTLoss()(model, td)["loss_sft"]
    # reference: HF cross-entropy with prompt (and padding) labels set to -100
    ids = torch.cat([td[K.PROMPT_IDS], td[K.COMPLETION_IDS]], 1)
    attn = torch.cat([td[K.PROMPT_MASK], td[K.COMPLETION_MASK].long()], 1)
    labels = ids.clone()
    labels[:, : td[K.PROMPT_IDS].shape[1]] = -100
    labels[:, td[K.PROMPT_IDS].shape[1] :][~td[K.COMPLETION_MASK]] = -100
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    ref = model(input_ids=ids, attention_mask=attn, position_ids=pos, labels=labels).loss
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-5)
    # the same loss with the prompt tokens labelled is different: the mask matters
    labels_all = ids.clone()
    labels_all[attn == 0] = -100
    with_prompt = model(input_ids=ids, attention_mask=attn, position_ids=pos, labels=labels_all).loss
    assert abs(with_prompt.item() - loss.item()) > 1e-3
