"""GRPOLoss through tdrl.kernels.fused_linear_pg_loss against the two-step path it replaces
(fused log-probs, then grpo_objective): loss, statistics and every parameter gradient on tiny
Qwen2 / Llama models built from config; the trainer's check and an end-to-end step."""

from __future__ import annotations

import copy

import pytest
import torch
from tensordict import TensorDict

from tdrl.llm import GRPOConfig, GRPOLoss, GRPOLossConfig, GRPOTrainer, HFGenerator, tokenize_prompts
from tdrl.llm import keys as K

PROMPTS = ["Q: 1+2=", "Q: 13+4=", "Q: 5+15="]
STATS = ("clip_frac", "kl", "ratio_mean", "entropy")


def _rollout(model, tok, G=4, C=6, seed=0, old=True, ref=True, sample=False):
    """Three prompts x G sampled completions, some rows ending early, a completion column past
    every row's end, advantages, and old / ref / sampler log-probs near the model's own."""
    ids, mask = tokenize_prompts(tok, PROMPTS)
    ids, mask = ids.repeat_interleave(G, 0), mask.repeat_interleave(G, 0)
    torch.manual_seed(seed)
    gen = HFGenerator(model, tok, max_new_tokens=C, share_prefix=False).generate(ids, mask)
    n = ids.shape[0]
    cmask = gen[K.COMPLETION_MASK].clone()
    cmask[torch.arange(n) % 3 == 1, 3:] = False  # ragged lengths
    cmask[:, -1] = False  # a trailing all-padding column (trimmed by the fast path)
    g = torch.Generator().manual_seed(seed)
    td = TensorDict(
        {
            K.PROMPT_IDS: ids, K.PROMPT_MASK: mask,
            K.COMPLETION_IDS: gen[K.COMPLETION_IDS], K.COMPLETION_MASK: cmask,
            K.ADVANTAGE: torch.randn(n, generator=g),
        },
        batch_size=[n],
    )
    from tdrl.llm import completion_logprobs

    with torch.no_grad():
        logp = completion_logprobs(model, td, 0.8)
    for key, on in ((K.OLD_LOG_PROB, old), (K.REF_LOG_PROB, ref), (K.SAMPLE_LOG_PROB, sample)):
        if on:  # noise large enough that some ratios clip, others do not
            td[key] = (logp + 0.3 * torch.randn(logp.shape, generator=g)) * cmask
    return td


def _loss_and_grads(model, td, cfg, fused_loss, **kw):
    model.zero_grad(set_to_none=True)
    loss_fn = GRPOLoss(cfg, temperature=0.8, fused_loss=fused_loss, **kw)
    assert loss_fn.uses_fused_loss == (fused_loss and not cfg.sequence_level)
    out = loss_fn(model, td)
    (2.0 * out["loss_objective"]).backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    return out.detach(), grads


def _assert_paths_agree(model, td, cfg, **kw):
    fused, g_fused = _loss_and_grads(model, td, cfg, True, **kw)
    plain, g_plain = _loss_and_grads(model, td, cfg, False, **kw)
    assert set(fused.keys()) == set(plain.keys()) == {"loss_objective", *STATS}
    for key in fused.keys():
        torch.testing.assert_close(fused[key], plain[key], rtol=1e-5, atol=1e-6, msg=f"{key}")
    assert g_fused.keys() == g_plain.keys() and len(g_fused) == len(list(model.parameters()))
    for k, g in g_fused.items():
        torch.testing.assert_close(g, g_plain[k], rtol=1e-4, atol=1e-6, msg=f"gradient of {k}")
    return fused


@pytest.mark.parametrize("reduction", ["token", "sequence", "constant"])
@pytest.mark.parametrize("beta", [0.0, 0.1])
def test_fused_loss_equals_two_step_path_qwen2(tiny, reduction, beta):
    _, model, tok = tiny
    model.lm_head.weight.data.mul_(4.0)  # a sharper policy: ratios move, differences would show
    td = _rollout(model, tok)
    cfg = GRPOLossConfig(eps_low=0.2, eps_high=0.28, beta=beta, reduction=reduction)
    out = _assert_paths_agree(model, td, cfg)
    assert 0 < out["clip_frac"] < 1
    assert (out["kl"] > 0) == (beta > 0)


@pytest.mark.parametrize("reduction", ["token", "sequence", "constant"])
def test_fused_loss_equals_two_step_path_llama_with_kl(tmp_path, task, reduction):
    from tdrl.llm import make_tiny_lm

    model, tok = make_tiny_lm(tmp_path, task.corpus(), arch="llama", hidden_size=32, num_layers=2, num_heads=2,
                              num_kv_heads=1, intermediate_size=64, seed=1)
    td = _rollout(model, tok, G=3, seed=1)
    _assert_paths_agree(model, td, GRPOLossConfig(beta=0.05, reduction=reduction, max_len=9))


def test_on_policy_tis_and_per_row_paths(tiny):
    _, model, tok = tiny
    # single pass, no old log-probs: the kernel's old_logp=None (ratio 1) equals logp.detach()
    td = _rollout(model, tok, old=False, ref=False)
    out = _assert_paths_agree(model, td, GRPOLossConfig(reduction="token"))
    assert out["ratio_mean"].item() == pytest.approx(1.0) and out["clip_frac"].item() == 0.0
    # truncated importance sampling: advantages x per-token weights, without prompt sharing
    td = _rollout(model, tok, sample=True, seed=2)
    _assert_paths_agree(model, td, GRPOLossConfig(tis_cap=1.5, beta=0.1), share_prefix=False)


def test_gspo_keeps_the_two_step_path_and_check(tiny):
    _, model, tok = tiny
    td = _rollout(model, tok)
    loss_fn = GRPOLoss(GRPOLossConfig.gspo(), temperature=0.8)
    assert not loss_fn.uses_fused_loss and not loss_fn.fused_loss_matches(model, td)
    torch.testing.assert_close(loss_fn(model, td)["loss_objective"],
                               GRPOLoss(GRPOLossConfig.gspo(), temperature=0.8, fused=False)(model, td)["loss_objective"])
    ok = GRPOLoss(GRPOLossConfig(beta=0.1), temperature=0.8)
    assert ok.fused_loss_matches(model, td)
    # old / ref log-probs missing: the check makes them up and still compares a clipped loss
    assert ok.fused_loss_matches(model, td.exclude(K.OLD_LOG_PROB, K.REF_LOG_PROB))


def test_trainer_step_fused_loss_equals_two_step_loss(_tiny, task):
    _, base, tok = _tiny
    train, _ = task.splits(64, 8, seed=0)

    def reward(prompts, completions, **_):
        return [float(len(c) % 3) for c in completions]

    runs = []
    for fused_loss in (None, False):
        cfg = GRPOConfig(steps=2, prompts_per_step=4, group_size=4, max_new_tokens=4, lr=1e-2, epochs=2,
                         loss=GRPOLossConfig(beta=0.05), fused_loss=fused_loss, progress=False, seed=3)
        trainer = GRPOTrainer(copy.deepcopy(base), tok, [reward], train, cfg)
        hist = trainer.train()
        assert trainer.loss_fn.uses_fused_loss == (fused_loss is None)  # the check passed
        runs.append((hist, dict(trainer.model.named_parameters())))
    (h_fused, p_fused), (h_plain, p_plain) = runs
    for key in ("loss_objective", "clip_frac", "kl", "ratio_mean", "entropy", "reward"):
        assert h_fused[-1][key] == pytest.approx(h_plain[-1][key], rel=1e-4, abs=1e-6), key
    for k, p in p_fused.items():
        torch.testing.assert_close(p, p_plain[k], rtol=1e-4, atol=1e-5, msg=k)
