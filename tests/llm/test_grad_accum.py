"""Gradient accumulation is exact for every reduction (issue 42, item 2), and TRL's KL bias
correction, each against a hand computation or the one-chunk gradient."""

from __future__ import annotations

import math

import pytest
import torch

from tdrl.llm import GRPOConfig, GRPOLossConfig, GRPOTrainer, grpo_objective, keys, micro_batch_weights


def test_dapo_token_weights_by_hand():
    """Two micro-batches of one sequence each, 3 and 1 tokens; ratio 1, beta 0, so each token's
    loss is -A_b and its gradient -A_b * (its weight). DAPO weighs every token of the minibatch
    1/4; the old ``loss_j / 2`` gave 1/6 and 1/2."""
    adv = [2.0, -1.0]
    masks = [torch.tensor([[1, 1, 1]], dtype=torch.bool), torch.tensor([[1, 0, 0]], dtype=torch.bool)]
    weights = micro_batch_weights(masks, "token")
    assert weights.tolist() == [0.75, 0.25]
    grads = []
    for j, (m, w) in enumerate(zip(masks, weights)):
        logp = torch.full((1, 3), -1.0, requires_grad=True)
        loss, _ = grpo_objective(logp, logp.detach(), torch.tensor([adv[j]]), m, GRPOLossConfig(reduction="token"))
        (loss * w).backward()
        grads.append(logp.grad)
    torch.testing.assert_close(grads[0], torch.tensor([[-2.0 / 4, -2.0 / 4, -2.0 / 4]]))
    torch.testing.assert_close(grads[1], torch.tensor([[1.0 / 4, 0.0, 0.0]]))
    # sequence / constant reductions weigh chunks by rows: 1/2 each here
    assert micro_batch_weights(masks, "sequence").tolist() == [0.5, 0.5]
    assert micro_batch_weights(masks, "constant").tolist() == [0.5, 0.5]


def test_dapo_over_ranks_by_hand():
    """Two ranks whose gradients are averaged: rank 0 holds chunks of 3 and 1 tokens, rank 1 holds 2.
    DAPO weighs every token of the job 1/6: rank 0's chunk token means get 2 * 3/6 and 2 * 1/6 (the
    average halves them); bnpo (no all_tokens) keeps rank 0's own token mean."""
    masks = [torch.tensor([[1, 1, 1]], dtype=torch.bool), torch.tensor([[1, 0, 0]], dtype=torch.bool)]
    weights = micro_batch_weights(masks, "token", world_size=2, all_tokens=6)
    assert weights.tolist() == pytest.approx([1.0, 1.0 / 3])
    per_token = [w / 2 / int(m.sum()) for w, m in zip(weights.tolist(), masks)]  # after the average over 2 ranks
    assert per_token == pytest.approx([1 / 6, 1 / 6])
    assert micro_batch_weights(masks, "token", world_size=2).tolist() == [0.75, 0.25]
    assert micro_batch_weights(masks, "sequence", world_size=2, all_tokens=6).tolist() == [0.5, 0.5]


def test_kl_bias_correction_by_hand():
    """``use_bias_correction_kl``: the k3 term times the ratio ``pi/pi_old`` (with its gradient).
    Advantages 0, so the loss is ``beta * mean_t(r_t * k3_t)`` over the two tokens."""
    beta = 0.1
    lp = [math.log(0.5), math.log(0.25)]
    old = [math.log(0.4), math.log(0.25)]
    ref = [math.log(0.4), math.log(0.5)]
    ratio = [math.exp(a - b) for a, b in zip(lp, old)]  # 1.25, 1
    d = [r - a for r, a in zip(ref, lp)]
    k3 = [math.exp(x) - x - 1 for x in d]
    expect = beta * sum(r * k for r, k in zip(ratio, k3)) / 2
    # d/dlogp (r * k3) = r * k3 + r * (1 - exp(ref - logp))
    expect_grad = [beta * r * (k + 1 - math.exp(x)) / 2 for r, k, x in zip(ratio, k3, d)]
    logp = torch.tensor([lp], dtype=torch.float64, requires_grad=True)
    mask = torch.ones(1, 2, dtype=torch.bool)
    cfg = GRPOLossConfig(beta=beta, reduction="token", kl_bias_correction=True)
    loss, stats = grpo_objective(logp, torch.tensor([old], dtype=torch.float64), torch.zeros(1, dtype=torch.float64),
                                 mask, cfg, ref_logp=torch.tensor([ref], dtype=torch.float64))
    loss.backward()
    assert loss.item() == pytest.approx(expect, rel=1e-9)
    assert logp.grad[0].tolist() == pytest.approx(expect_grad, rel=1e-9)
    assert stats["kl"].item() == pytest.approx(sum(k3) / 2, rel=1e-9)  # the diagnostic stays the plain KL
    plain, _ = grpo_objective(logp.detach(), torch.tensor([old], dtype=torch.float64), torch.zeros(1, dtype=torch.float64),
                              mask, cfg.update(kl_bias_correction=False), ref_logp=torch.tensor([ref], dtype=torch.float64))
    assert plain.item() == pytest.approx(beta * sum(k3) / 2, rel=1e-9)


# TRL's loss_type values (and GSPO's sequence ratio): grad_accum must never change the gradient
CASES = {
    "grpo": dict(loss_type="grpo"),
    "bnpo": dict(loss_type="bnpo"),
    "dapo": dict(loss_type="dapo", beta=0.05),
    "dr_grpo": dict(loss_type="dr_grpo"),
    "sequence": dict(loss_type="grpo", importance_sampling_level="sequence", beta=0.05),
    "dapo_bias_corrected_kl": dict(loss_type="dapo", beta=0.05, use_bias_correction_kl=True),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_grad_accum_equals_one_chunk(tiny, task, name):
    folder, model, tok = tiny
    torch.manual_seed(0)
    config = GRPOConfig(num_generations=4, generation_batch_size=8, max_completion_length=6, disable_tqdm=True,
                        num_iterations=2, fused_logprobs=True, share_prefix=False, fused_loss=True, **CASES[name])
    trainer = GRPOTrainer(model, tok, [lambda completions, **kw: [float(len(c)) for c in completions]],
                          task.splits(16, 4)[0], config)
    td, _ = trainer.rollout(next(trainer.sampler))
    n, width = td[keys.COMPLETION_MASK].shape
    lengths = torch.tensor([1, 6, 2, 5, 3, 6, 1, 4])[:n].clamp(max=width)  # ragged: chunks hold unequal token counts
    td[keys.COMPLETION_MASK] = torch.arange(width)[None, :] < lengths[:, None]
    td[keys.ADVANTAGE] = torch.linspace(-1.5, 2.0, n)
    trainer._add_logprobs(td)  # old (num_iterations=2) and reference log-probs
    td[keys.OLD_LOG_PROB] = td[keys.OLD_LOG_PROB] + 0.1 * torch.randn(n, width)  # ratios off 1, some clipped
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    grads = {}
    for k in (1, 2, 4):
        trainer.accumulate(td, n // k)
        grads[k] = [p.grad.clone() for p in params]
    for k in (2, 4):
        for g1, gk in zip(grads[1], grads[k]):
            torch.testing.assert_close(gk, g1, rtol=1e-4, atol=1e-7)
    assert any(g.abs().sum() > 0 for g in grads[1])
