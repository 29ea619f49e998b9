"""GRPO/SFT trainers on the tiny model: learning, exact resume, LoRA, SFT, evaluation."""

from __future__ import annotations

import pytest
import torch

from tdrl.core.train import CSVLogger
from tdrl.llm import (
    GRPOConfig,
    GRPOLossConfig,
    GRPOTrainer,
    SFTConfig,
    SFTTrainer,
    apply_lora,
    evaluate,
    math_answer_reward,
)


def digit_fraction_reward(prompts, completions, **_):
    """Trivially learnable: the share of digit characters among 4 generated positions."""
    return [sum(ch.isdigit() for ch in c) / 4.0 for c in completions]


def _grpo(model, tok, ds, tmp_path=None, **kw):
    cfg = dict(steps=12, prompts_per_step=8, group_size=8, max_new_tokens=4, lr=1e-2, seed=0, progress=False)
    cfg.update(kw)
    return GRPOTrainer(model, tok, [digit_fraction_reward], ds, GRPOConfig(**cfg))


@pytest.fixture(scope="module")
def data(task):
    return task.splits(128, 16, seed=0)


def test_grpo_raises_reward(tiny, data):
    _, model, tok = tiny
    trainer = _grpo(model, tok, data[0], steps=15)
    hist = trainer.train()
    first = sum(m["reward"] for m in hist[:3]) / 3
    last = sum(m["reward"] for m in hist[-3:]) / 3
    assert last > first + 0.15, f"mean reward did not rise enough: {first:.3f} -> {last:.3f}"
    assert {"kl", "clip_frac", "tokens_per_s", "reward_errors", "entropy"} <= set(hist[-1])


def test_grpo_variants_run_with_reference_and_minibatches(tiny, data):
    _, model, tok = tiny
    before = {k: v.clone() for k, v in model.state_dict().items()}
    loss = GRPOLossConfig.dapo(beta=0.05, tis_cap=2.0)
    trainer = _grpo(model, tok, data[0], steps=2, epochs=2, minibatch_size=32, grad_accum=2, loss=loss)
    hist = trainer.train()
    assert trainer.ref_model is not None
    assert hist[-1]["kl"] > 0, "after updates the policy must differ from the reference"
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    dr = _grpo(model, tok, data[0], steps=1, loss=GRPOLossConfig.dr_grpo())
    assert dr.config.loss.max_len == 4  # filled in from max_new_tokens
    dr.train()
    _grpo(model, tok, data[0], steps=1, loss=GRPOLossConfig.gspo()).train()


def test_grpo_step_frees_gradients_after_the_update(tiny, data):
    """The gradients (as large as the weights) are dropped once the optimiser has used them, so
    the next round's generation does not hold them; the update itself still happened."""
    _, model, tok = tiny
    before = {k: v.clone() for k, v in model.named_parameters()}
    trainer = _grpo(model, tok, data[0], steps=2, epochs=2, minibatch_size=32)
    m = trainer.step()
    assert m["grad_norm"] > 0
    assert all(p.grad is None for p in model.parameters())
    assert any(not torch.equal(before[k], p) for k, p in model.named_parameters())
    assert trainer._optimizer_steps == 4  # 2 epochs x 2 minibatches of the 64-completion round


def test_tied_embedding_sparse_grad_gives_the_dense_gradient(tiny, data):
    """The tied embedding's sparse gradient, added into the LM head's, equals the dense one."""
    from tdrl.core.objectives import total_loss
    from tdrl.llm.trainers.common import tied_embedding_sparse_grad

    _, model, tok = tiny
    trainer = _grpo(model, tok, data[0], steps=1)
    td, _ = trainer.rollout(next(trainer.sampler))
    td.set("advantage", torch.linspace(-1.0, 1.0, td.shape[0]))
    emb = model.get_input_embeddings()
    assert model.get_output_embeddings().weight is emb.weight
    grads = {}
    for sparse in (False, True):
        model.zero_grad(set_to_none=True)
        with tied_embedding_sparse_grad(model, enabled=sparse):
            assert emb.sparse == sparse
            total_loss(trainer.loss_fn(model, td)).backward()
        assert not emb.sparse  # restored
        grads[sparse] = emb.weight.grad
    assert grads[True].layout == torch.strided and grads[True].abs().sum() > 0
    torch.testing.assert_close(grads[True], grads[False], rtol=1e-5, atol=1e-7)


def test_checkpoint_resume_is_exact(tiny, data, tmp_path):
    _, model, tok = tiny
    import copy

    model_b = copy.deepcopy(model)
    straight = _grpo(model, tok, data[0], steps=3, epochs=2, minibatch_size=32)
    straight.train()
    ckpt, logs = str(tmp_path / "ckpt.pt"), str(tmp_path / "grpo")
    first = _grpo(model_b, tok, data[0], steps=3, epochs=2, minibatch_size=32, checkpoint_path=ckpt, checkpoint_every=2, log_dir=logs)
    first.train(2)
    fresh = copy.deepcopy(model_b)
    first.step()  # a step past the checkpoint (then a "crash"): logged, not saved
    with torch.no_grad():
        for p in fresh.parameters():
            p.add_(1.0)  # garbage: the checkpoint must overwrite it
    resumed = _grpo(fresh, tok, data[0], steps=3, epochs=2, minibatch_size=32, checkpoint_path=ckpt, checkpoint_every=2, log_dir=logs)
    assert resumed.step_count == 2 and [r["step"] for r in resumed.metrics.rows] == [1.0, 2.0]
    resumed.train()
    # the CSV holds every round once, and the rewritten round 3 is the resumed run's
    logged = CSVLogger(tmp_path, "grpo").read()
    assert logged["step"] == [1.0, 2.0, 3.0]
    assert logged["reward"] == pytest.approx([m["reward"] for m in straight.metrics.rows])
    for (k, a), b in zip(model.state_dict().items(), fresh.state_dict().values()):
        torch.testing.assert_close(a, b, msg=f"parameter {k} differs after resume")


def test_lora_trains_adapters_only(tiny, data, tmp_path):
    pytest.importorskip("peft")
    _, model, tok = tiny
    model = apply_lora(model, r=4, alpha=8)
    base = {k: v.clone() for k, v in model.state_dict().items() if "lora_" not in k}
    lora = {k: v.clone() for k, v in model.state_dict().items() if "lora_B" in k}
    trainer = _grpo(model, tok, data[0], steps=2, loss=GRPOLossConfig(beta=0.1))
    trainer.train()
    after = model.state_dict()
    assert all(torch.equal(v, after[k]) for k, v in base.items()), "base weights must stay frozen"
    assert any(not torch.equal(v, after[k]) for k, v in lora.items()), "adapters must train"
    trainer.save_pretrained(str(tmp_path / "adapter"))
    assert (tmp_path / "adapter" / "adapter_config.json").exists()


def test_sft_learns_and_evaluates(tiny, data, tmp_path):
    _, model, tok = tiny
    train, test = data
    trainer = SFTTrainer(model, tok, train, SFTConfig(steps=30, batch_size=32, grad_accum=2, lr=1e-2, progress=False, log_dir=str(tmp_path / "sft")))
    hist = trainer.train()
    assert hist[-1]["loss"] < 0.6 * hist[0]["loss"]
    logged = CSVLogger(tmp_path, "sft").read()  # written through tdrl.core.train.CSVLogger
    assert logged["step"] == [float(i) for i in range(1, 31)]
    assert logged["loss"] == pytest.approx([m["loss"] for m in hist])
    assert (tmp_path / "sft" / "hparams.json").exists()
    acc = evaluate(model, tok, test, math_answer_reward, max_new_tokens=4)
    assert 0.0 <= acc <= 1.0
    # the model learnt the answer format: greedy completions are numbers
    from tdrl.llm import HFGenerator, completion_texts, tokenize_prompts

    ids, mask = tokenize_prompts(tok, test["prompt"][:8])
    out = HFGenerator(model, tok, max_new_tokens=4).generate(ids, mask, greedy=True)
    texts = completion_texts(tok, out["completion_ids"], out["completion_mask"])
    assert sum(t.strip().isdigit() for t in texts) >= 6, texts


def test_config_errors(tiny, data):
    with pytest.raises(ValueError, match="group_size"):
        GRPOConfig(group_size=1)
    with pytest.raises(ValueError, match="divisible"):
        GRPOConfig(prompts_per_step=3, group_size=4, minibatch_size=5)
    _, model, tok = tiny
    with pytest.raises(KeyError, match="completion"):
        SFTTrainer(model, tok, data[0].remove_columns("completion"), SFTConfig(progress=False))


def test_grpo_step_returns_when_a_reward_hangs(tiny, data):
    """A reward that never returns must not stall training: the round ends after reward_timeout."""
    import threading
    import time

    release = threading.Event()

    def hanging_reward(prompts, completions, **_):
        release.wait()
        return [0.0] * len(completions)

    _, model, tok = tiny
    cfg = GRPOConfig(steps=1, prompts_per_step=2, group_size=2, max_new_tokens=2, progress=False, reward_timeout=0.5)
    trainer = GRPOTrainer(model, tok, [digit_fraction_reward, hanging_reward], data[0], cfg)
    try:
        t = time.monotonic()
        m = trainer.step()
        assert time.monotonic() - t < 30
        assert m["reward_timeouts"] == 1.0 and m["reward_errors"] == 4.0
    finally:
        release.set()


def test_gradient_checkpointing_recomputes_and_gives_the_same_update(tiny, data):
    """On, every decoder layer runs again in the backward pass (its MLP is called twice with grad
    on per forward) and the update equals the one without it; off is the default."""
    import copy

    _, model, tok = tiny

    def run(on: bool, kind: str):
        m = copy.deepcopy(model)
        calls = []
        mlp = m.model.layers[0].mlp
        forward = mlp.forward

        def counted(*args, **kwargs):  # a forward hook would not see the recomputation
            if torch.is_grad_enabled():
                calls.append(1)
            return forward(*args, **kwargs)

        mlp.forward = counted
        if kind == "sft":
            t = SFTTrainer(m, tok, data[0], SFTConfig(steps=1, batch_size=8, lr=1e-2, progress=False,
                                                     gradient_checkpointing=on))
        else:
            t = _grpo(m, tok, data[0], steps=1, prompts_per_step=2, group_size=4, fused_logprobs=True,
                      share_prefix=False, fused_loss=True, gradient_checkpointing=on)
        torch.manual_seed(0)
        t.step()
        return len(calls), m.state_dict()

    for kind in ("sft", "grpo"):
        n_off, w_off = run(False, kind)
        n_on, w_on = run(True, kind)
        assert n_off >= 1 and n_on == 2 * n_off, (kind, n_off, n_on)
        changed = [k for k in w_off if not torch.equal(w_off[k], model.state_dict()[k])]
        assert changed, kind
        for k in w_off:
            torch.testing.assert_close(w_on[k], w_off[k], atol=1e-6, rtol=1e-5, msg=f"{kind}: {k}")
