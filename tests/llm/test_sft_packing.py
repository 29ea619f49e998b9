"""SFT as TRL users use it: text columns, max_length, packing without cross-example attention,
completion_only_loss / assistant_only_loss."""

from __future__ import annotations

import copy

import datasets
import pytest
import torch

from tdrl.llm import SFTConfig, SFTTrainer
from tdrl.llm import keys as K
from tdrl.llm.logprobs import row_outputs
from tdrl.llm.losses import SFTLoss
from tdrl.llm.packing import block_causal_mask, collate, pack_lengths, target_mask, tokenize_example, tokenize_text

torch.set_num_threads(1)


def test_best_fit_decreasing_by_hand():
    # sorted 5,4,3,2,1 into rows of 6: 5 | 4 | 3; 2 fills the row of 4 (best fit); 1 fills the row of 5
    assert pack_lengths([5, 4, 3, 2, 1], 6) == [[0, 4], [1, 3], [2]]
    with pytest.raises(ValueError, match="exceeds the row capacity 6.*max_length"):
        pack_lengths([7], 6)


def test_block_mask_and_targets_by_hand():
    td = collate([([5, 6, 7], [False, True, True]), ([8, 9], [True, True])], pad_id=0, rows=[[0, 1]])
    assert td[K.INPUT_IDS].tolist() == [[5, 6, 7, 8, 9]]
    assert td[K.POSITION_IDS].tolist() == [[0, 1, 2, 0, 1]]
    assert td[K.SEGMENT_IDS].tolist() == [[1, 1, 1, 2, 2]]
    # 7 -> 8 crosses examples: not a target although 8 is in the loss mask
    assert target_mask(td).tolist() == [[True, True, False, True]]
    allowed = block_causal_mask(td[K.SEGMENT_IDS])[0, 0] == 0
    assert allowed.int().tolist() == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [0, 0, 0, 1, 0], [0, 0, 0, 1, 1]]


def _examples(tok):
    prompts = ["Q: 1+2=", "Q: 7+8=", "Q: 3+3=", "Q: 9+0="]
    answers = ["3", "15", "6", "9"]
    return [tokenize_example(tok, p, a) for p, a in zip(prompts, answers)] + [tokenize_text(tok, "Q: 4+4=8 Q: 1+1=2")]


@pytest.mark.parametrize("fused", [True, False])
def test_packed_row_equals_each_example_alone(tiny, fused):
    """Hidden states and per-example losses of a packed row equal those of each example run alone."""
    _, model, tok = tiny
    examples = _examples(tok)
    packed = collate(examples, tok.pad_token_id, rows=[list(range(len(examples)))])
    assert packed.shape[0] == 1
    seg = packed[K.SEGMENT_IDS]
    with torch.no_grad():
        h_packed = row_outputs(model, packed[K.INPUT_IDS], block_causal_mask(seg), packed[K.POSITION_IDS])[0]
        plain = row_outputs(model, packed[K.INPUT_IDS], block_causal_mask(torch.ones_like(seg)), packed[K.POSITION_IDS])[0]
    loss_fn = SFTLoss(fused=fused)
    total, count = 0.0, 0.0
    for i, ex in enumerate(examples):
        alone = collate([ex], tok.pad_token_id)
        with torch.no_grad():
            h_alone = row_outputs(model, alone[K.INPUT_IDS], block_causal_mask(alone[K.SEGMENT_IDS]), alone[K.POSITION_IDS])[0]
            out = loss_fn(model, alone)
        torch.testing.assert_close(h_packed[seg[0] == i + 1], h_alone, rtol=1e-5, atol=1e-5)
        if i > 0:  # the check has teeth: attention across examples changes the later ones
            assert not torch.allclose(plain[seg[0] == i + 1], h_alone, atol=1e-3)
        total += float(out["loss_sft"]) * float(out["num_tokens"])
        count += float(out["num_tokens"])
    with torch.no_grad():
        out = loss_fn(model, packed)
    assert float(out["num_tokens"]) == count
    assert float(out["loss_sft"]) == pytest.approx(total / count, rel=1e-5)


def test_rows_loss_equals_the_prompt_completion_loss(tiny, task):
    """The row layout's loss equals the left-padded prompt/completion layout's (tokenize_sft)."""
    from tdrl.llm.data import tokenize_sft

    _, model, tok = tiny
    train, _ = task.splits(8, 2, seed=0)
    prompts, completions = train["prompt"], train["completion"]
    rows = collate([tokenize_example(tok, p, c) for p, c in zip(prompts, completions)], tok.pad_token_id)
    with torch.no_grad():
        a = SFTLoss()(model, rows)["loss_sft"]
        b = SFTLoss()(model, tokenize_sft(tok, prompts, completions))["loss_sft"]
    assert float(a) == pytest.approx(float(b), rel=1e-5)


def _sft(model, tok, ds, **kw):
    cfg = dict(steps=1, batch_size=8, lr=1e-2, warmup_steps=0, progress=False, seed=0)
    cfg.update(kw)
    return SFTTrainer(model, tok, ds, SFTConfig(**cfg))


def test_a_packed_step_equals_an_unpacked_step(tiny, task):
    """Same batch, packed (and split in 2 micro-batches) or not: same loss and gradient."""
    _, model, tok = tiny
    train, _ = task.splits(16, 2, seed=0)
    a = _sft(copy.deepcopy(model), tok, train, lr=0.0)
    b = _sft(copy.deepcopy(model), tok, train, lr=0.0, packing=True, max_length=40, grad_accum=2)
    ma, mb = a.step(), b.step()
    assert ma["fill"] < mb["fill"]  # packed rows hold less padding
    assert mb["loss"] == pytest.approx(ma["loss"], rel=1e-5)
    for pa, pb in zip(a.model.parameters(), b.model.parameters()):
        torch.testing.assert_close(pa.grad, pb.grad, rtol=1e-4, atol=1e-6)


def test_text_column_max_length_and_completion_only_switch(tiny, task):
    _, model, tok = tiny
    train, _ = task.splits(16, 2, seed=0)
    texts = datasets.Dataset.from_dict({"body": [p + c for p, c in zip(train["prompt"], train["completion"])]})
    with pytest.raises(KeyError, match="dataset_text_field"):
        _sft(model, tok, texts)
    trainer = _sft(model, tok, texts, dataset_text_field="body", max_length=5, packing=True)
    rows = texts[:8]
    examples = trainer.tokenize(rows)
    full = [tokenize_text(tok, t) for t in rows["body"]]
    assert [e[0] for e in examples] == [f[0][:5] for f in full]  # the first max_length tokens
    assert all(all(m) for _, m in examples)  # plain text: every token a target
    td = trainer.batch(rows)
    assert td[K.INPUT_IDS].shape[1] <= 5 and td.shape[0] == 8  # 5 tokens each, one per row of 5
    before = [p.detach().clone() for p in trainer.model.parameters()]
    assert trainer.step()["loss"] > 0
    assert any(not torch.equal(p, q) for p, q in zip(before, trainer.model.parameters()))

    pairs = train.select(range(8))
    on = _sft(model, tok, pairs).tokenize(pairs[:8])
    off = _sft(model, tok, pairs, completion_only_loss=False).tokenize(pairs[:8])
    n_completion = [len(tok(c, add_special_tokens=False)["input_ids"]) + 1 for c in pairs["completion"]]
    assert [sum(m) for _, m in on] == n_completion
    assert [sum(m) for _, m in off] == [len(ids) for ids, _ in off]


def test_assistant_only_loss_switch(tiny):
    _, model, tok = tiny
    tok = copy.deepcopy(tok)
    tok.chat_template = "{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }} {% endfor %}"
    conv = [{"role": "user", "content": "1+2="}, {"role": "assistant", "content": "3"},
            {"role": "user", "content": "2+2="}, {"role": "assistant", "content": "4"}]
    ds = datasets.Dataset.from_dict({"messages": [conv] * 8})
    on = _sft(model, tok, ds)
    assert len(on.sampler.dataset) == 16  # one example per assistant turn
    targets = on.tokenize(on.sampler.dataset[:2])
    assert [sum(m) for _, m in targets] == [2, 2]  # the answer digit and EOS
    off = _sft(model, tok, ds, assistant_only_loss=False)
    whole = off.tokenize(ds[:1])
    rendered = tok.apply_chat_template(conv, tokenize=False)
    assert whole[0][0] == tok(rendered, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert all(whole[0][1])
