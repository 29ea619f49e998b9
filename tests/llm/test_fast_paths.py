"""The fast paths (shared prompt KV cache, decoder-only hidden states, trimmed batches,
inverse-CDF sampling) against the plain paths they replace, and the fallbacks."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdrl.core.train import MetricHistory, truncate_csv
from tdrl.llm import GRPOConfig, GRPOTrainer, HFGenerator, completion_logprobs, fused_path_matches, tokenize_prompts
from tdrl.llm import keys as K
from tdrl.llm.generation import unique_prompts
from tdrl.llm.logprobs import LMHead

PROMPTS = ["Q: 1+2=", "Q: 13+4=", "Q: 5+15="]


def _group_rollout(model, tok, G=4, C=5, seed=0):
    """Three prompts x G completions (left padding differs by prompt), plus a column of
    padding on the left of every prompt and a completion column past every row's end."""
    ids, mask = tokenize_prompts(tok, PROMPTS)
    ids, mask = ids.repeat_interleave(G, 0), mask.repeat_interleave(G, 0)
    torch.manual_seed(seed)
    gen = HFGenerator(model, tok, max_new_tokens=C, share_prefix=False).generate(ids, mask)
    n = ids.shape[0]
    cmask = gen[K.COMPLETION_MASK].clone()
    cmask[torch.arange(n) % 3 == 1, 2:] = False  # some rows end early
    pad = torch.full((n, 1), tok.pad_token_id)
    return TensorDict(
        {
            K.PROMPT_IDS: torch.cat([pad, ids], 1),
            K.PROMPT_MASK: torch.cat([torch.zeros_like(pad), mask], 1),
            K.COMPLETION_IDS: torch.cat([gen[K.COMPLETION_IDS], pad], 1),
            K.COMPLETION_MASK: torch.cat([cmask, torch.zeros_like(pad, dtype=torch.bool)], 1),
        },
        batch_size=[n],
    )


def _logp_and_grads(model, td, **kw):
    model.zero_grad(set_to_none=True)
    logp, ent = completion_logprobs(model, td, 0.8, return_entropy=True, **kw)
    (logp * torch.linspace(-1, 1, logp.numel()).reshape(logp.shape)).sum().backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    return logp.detach(), ent.detach(), grads


def test_unique_prompts():
    ids = torch.tensor([[0, 5, 6], [7, 8, 9], [0, 5, 6], [7, 8, 9]])
    mask = (ids != 0).long()
    u_ids, u_mask, inv = unique_prompts(ids, mask)
    assert u_ids.shape == (2, 3) and torch.equal(u_ids[inv], ids) and torch.equal(u_mask[inv], mask)
    assert unique_prompts(ids[:2], mask[:2]) is None  # nothing to share


def test_shared_prefix_equals_plain_paths_values_and_gradients(tiny):
    _, model, tok = tiny
    model.lm_head.weight.data.mul_(4.0)  # a sharper model: differences would show
    td = _group_rollout(model, tok)
    assert unique_prompts(td[K.PROMPT_IDS], td[K.PROMPT_MASK])[0].shape[0] == 3
    shared = _logp_and_grads(model, td, fused=True, share_prefix=True)
    per_row = _logp_and_grads(model, td, fused=True, share_prefix=False)
    logits = _logp_and_grads(model, td, fused=False)
    for other in (per_row, logits):
        torch.testing.assert_close(shared[0], other[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(shared[1], other[1], rtol=1e-5, atol=1e-5)
        assert shared[2].keys() == other[2].keys() and len(shared[2]) == len(list(model.parameters()))
        for k, g in shared[2].items():
            torch.testing.assert_close(g, other[2][k], rtol=1e-4, atol=1e-5, msg=f"gradient of {k}")
    assert (shared[0][~td[K.COMPLETION_MASK]] == 0).all()
    assert fused_path_matches(model, td, share_prefix=True)


def test_shared_prefix_on_a_llama_model(tmp_path, task):
    from tdrl.llm import make_tiny_lm

    model, tok = make_tiny_lm(tmp_path, task.corpus(), arch="llama", hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64, seed=1)
    td = _group_rollout(model, tok, G=3)
    shared = _logp_and_grads(model, td, fused=True, share_prefix=True)
    logits = _logp_and_grads(model, td, fused=False)
    torch.testing.assert_close(shared[0], logits[0], rtol=1e-5, atol=1e-5)
    for k, g in shared[2].items():
        torch.testing.assert_close(g, logits[2][k], rtol=1e-4, atol=1e-5, msg=f"gradient of {k}")


class _NoDecoder(torch.nn.Module):
    """A causal LM behind a wrapper that exposes no separate decoder (``base_model``)."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, **kw):
        return self.lm(**kw)

    def get_output_embeddings(self):
        return self.lm.get_output_embeddings()


def test_plain_fallback_without_a_decoder(tiny):
    _, model, tok = tiny
    td = _group_rollout(model, tok)
    fast = completion_logprobs(model, td, 0.8)
    plain = completion_logprobs(_NoDecoder(model), td, 0.8)  # all hidden states through the wrapper
    torch.testing.assert_close(fast, plain, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("greedy", [True, False])
def test_generation_with_shared_prefill_equals_full_prefill(tiny, greedy):
    _, model, tok = tiny
    model.lm_head.weight.data.mul_(6.0)  # EOS early in some rows
    ids, mask = tokenize_prompts(tok, PROMPTS)
    ids, mask = ids.repeat_interleave(5, 0), mask.repeat_interleave(5, 0)
    outs = []
    for share in (True, False):
        torch.manual_seed(3)
        outs.append(HFGenerator(model, tok, max_new_tokens=6, temperature=0.9, share_prefix=share).generate(ids, mask, greedy=greedy))
    a, b = outs
    assert torch.equal(a[K.COMPLETION_IDS], b[K.COMPLETION_IDS]) and torch.equal(a[K.COMPLETION_MASK], b[K.COMPLETION_MASK])
    torch.testing.assert_close(a[K.SAMPLE_LOG_PROB], b[K.SAMPLE_LOG_PROB], rtol=1e-5, atol=1e-5)


def test_sampling_draws_the_distribution(tiny):
    _, model, tok = tiny
    n = 6000
    ids, mask = tokenize_prompts(tok, ["Q: 3+4="])
    ids, mask = ids.expand(n, -1).contiguous(), mask.expand(n, -1).contiguous()
    torch.manual_seed(0)
    out = HFGenerator(model, tok, max_new_tokens=1, temperature=1.3).generate(ids, mask)
    first = out[K.COMPLETION_IDS][:, 0]
    with torch.no_grad():
        probs = torch.softmax(model(input_ids=ids[:1]).logits[0, -1] / 1.3, -1)
    freq = torch.bincount(first, minlength=probs.numel()).double() / n
    # every draw's log-prob is its token's log-prob; frequencies within 4.5 binomial sigmas
    torch.testing.assert_close(out[K.SAMPLE_LOG_PROB][:, 0], probs.log()[first].float(), rtol=1e-4, atol=1e-5)
    sigma = (probs * (1 - probs) / n).sqrt().double()
    assert ((freq - probs.double()).abs() <= 4.5 * sigma + 1e-4).all(), (freq, probs)
    # filtered tokens (probability 0) are never drawn
    top2 = HFGenerator(model, tok, max_new_tokens=1, temperature=1.3, top_k=2).generate(ids, mask)[K.COMPLETION_IDS][:, 0]
    assert set(top2.unique().tolist()) == set(probs.topk(2).indices.tolist())


def test_trainer_falls_back_when_logits_are_post_processed(_tiny, task):
    import copy

    _, base, tok = _tiny
    model = copy.deepcopy(base)
    # logit scaling after the LM head (as some architectures do): hidden x weight != logits
    model.lm_head.register_forward_hook(lambda mod, inp, out: out * 1.5)
    train, _ = task.splits(64, 8, seed=0)

    def reward(prompts, completions, **_):
        return [float(len(c)) for c in completions]

    trainer = GRPOTrainer(model, tok, [reward], train, GRPOConfig(steps=1, prompts_per_step=4, group_size=4, max_new_tokens=3, progress=False))
    # settled at construction, before any rollout, into plain booleans the loss reads
    assert trainer.lm_head == LMHead(fused=False, share_prefix=True, fused_loss=True)
    assert trainer.loss_fn.head is trainer.lm_head and trainer.loss_fn.fused is False
    head = trainer.lm_head
    trainer.train()
    assert trainer.lm_head is head and trainer.loss_fn.head is head  # nothing flipped during training
    with pytest.raises(AttributeError):
        trainer.loss_fn.fused = True  # a loss's path is its head's, not a flag to flip
    ok = GRPOTrainer(copy.deepcopy(base), tok, [reward], train, GRPOConfig(steps=1, prompts_per_step=4, group_size=4, max_new_tokens=3, progress=False))
    assert ok.lm_head == LMHead(fused=True, share_prefix=True, fused_loss=True)
    ok.train()
    assert ok.loss_fn.fused and ok.loss_fn.share_prefix


def test_grpo_loss_is_a_loss_module_summed_by_total_loss(tiny):
    from tdrl.core.objectives import LossModule
    from tdrl.llm import GRPOLoss

    loss = GRPOLoss().set_keys(advantage="adv")  # LossModule's set_keys
    assert isinstance(loss, LossModule) and loss.tensor_keys.advantage == "adv"
    with pytest.raises(KeyError, match="unknown names"):
        loss.set_keys(advantages="adv")


def test_metric_history_and_truncate_csv(tmp_path):
    from tdrl.core.train import CSVLogger

    hist = MetricHistory([CSVLogger(tmp_path, "run")])
    for s in range(1, 5):
        hist.log({"reward": s / 10, "loss": torch.tensor(float(s))}, step=s)
    hist.close()
    assert hist.column("reward") == [0.1, 0.2, 0.3, 0.4]
    assert truncate_csv(tmp_path / "run" / "metrics.csv", 2) == 2
    assert CSVLogger(tmp_path, "run").read() == {"step": [1.0, 2.0], "reward": [0.1, 0.2], "loss": [1.0, 2.0]}
    state = hist.state_dict()
    hist.truncate(3)
    assert [r["step"] for r in hist.rows] == [1.0, 2.0, 3.0]
    hist.load_state_dict(state)
    assert len(hist.rows) == 4
    with pytest.raises(ValueError, match="scalars"):
        hist.log({"x": torch.zeros(2)}, step=5)


def test_public_hidden_then_fused_head_equals_plain_logprobs(tiny):
    """``completion_hidden`` + ``logprobs_from_hidden`` (the two public halves of the fused path)
    give the plain full-logits log-probs and entropy, 0 off the mask, and flow gradients."""
    from tdrl.llm import completion_hidden, logprobs_from_hidden

    _, model, tok = tiny
    td = _group_rollout(model, tok)
    cids, cmask = td[K.COMPLETION_IDS], td[K.COMPLETION_MASK].bool()
    hidden = completion_hidden(model, td[K.PROMPT_IDS], td[K.PROMPT_MASK], cids, cmask, share_prefix=False)
    assert hidden.shape == (*cids.shape, model.config.hidden_size)
    logp, ent = logprobs_from_hidden(hidden, model.lm_head, cids, cmask, cmask, 0.8, return_entropy=True)
    ref_logp, ref_ent = completion_logprobs(model, td, 0.8, return_entropy=True, fused=False)
    assert logp.shape == cids.shape and not logp[~cmask].any() and not ent[~cmask].any()
    torch.testing.assert_close(logp, ref_logp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent, ref_ent, atol=1e-5, rtol=1e-5)
    logp.sum().backward()
    assert model.lm_head.weight.grad is not None and model.lm_head.weight.grad.abs().sum() > 0


def test_prefix_tree_rows_by_hand():
    from tdrl.llm.prefix_rows import prefix_tree_rows

    # prompts [pad, 5] and [6, 7]; completions: row 0 -> prompt 1, rows 1, 2 -> prompt 0 (row 2 ends early)
    pids, pmask = torch.tensor([[0, 5], [6, 7]]), torch.tensor([[0, 1], [1, 1]])
    inv = torch.tensor([1, 0, 0])
    cids, cmask = torch.tensor([[11, 12], [21, 22], [31, 0]]), torch.tensor([[1, 1], [1, 1], [1, 0]])
    ids, pos, mask, rows, cols = prefix_tree_rows(pids, pmask, inv, cids, cmask)
    assert ids.tolist() == [[0, 5, 21, 22, 31, 0], [6, 7, 11, 12, 0, 0]]
    assert pos[0].tolist()[:5] == [0, 0, 1, 2, 1] and pos[1].tolist()[:4] == [0, 1, 2, 3]
    allowed = (mask[:, 0] == 0).int()
    assert allowed[0].tolist() == [[1, 0, 0, 0, 0, 0],   # left padding: itself only (no all-masked row)
                                   [0, 1, 0, 0, 0, 0],
                                   [0, 1, 1, 0, 0, 0],   # completion 1: its prompt and itself
                                   [0, 1, 1, 1, 0, 0],
                                   [0, 1, 0, 0, 1, 0],   # completion 2 does not see completion 1
                                   [0, 1, 0, 0, 1, 1]]   # past its end: real keys of its own, then itself
    # hidden states predicting each completion token: the prompt's last position, then its own
    assert rows.tolist() == [1, 0, 0] and cols.tolist() == [[1, 2, 3], [1, 2, 3], [1, 4, 5]]


def test_one_row_per_prompt_and_kv_cache_layouts_equal_the_per_row_path(tiny):
    """Rows shuffled and groups of unequal size (a minibatch); short completions take the
    prefix-tree rows, long ones the shared KV cache: both equal the per-row forward."""
    from tdrl.llm.logprobs import trim_completions
    from tdrl.llm.prefix_rows import tree_is_cheaper

    _, model, tok = tiny
    H = model.config.hidden_size
    for C, tree in ((5, True), (40, False)):
        td = _group_rollout(model, tok, G=4, C=C)
        td = td[torch.tensor([5, 0, 11, 3, 7, 1, 9, 2, 10])]  # groups of 3 rows each, interleaved
        pids, width = trim_completions(td)[0], trim_completions(td)[-1]
        P, W = pids.shape[1], width - 1  # what completion_hidden sees
        assert tree_is_cheaper(P, W, 3, H) == tree
        shared = _logp_and_grads(model, td, fused=True, share_prefix=True)
        per_row = _logp_and_grads(model, td, fused=True, share_prefix=False)
        torch.testing.assert_close(shared[0], per_row[0], rtol=1e-5, atol=1e-5)
        for k, g in shared[2].items():
            torch.testing.assert_close(g, per_row[2][k], rtol=1e-4, atol=1e-5, msg=f"gradient of {k} (C={C})")
