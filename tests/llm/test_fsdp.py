"""FSDP2 (``fsdp=True``) on 2 CPU ranks over gloo: the SFT and GRPO trainers' weights after a few
steps equal DDP's (the same ranks, the same data), a sharded checkpoint resumes to the
uninterrupted result, ``save_pretrained`` gathers the whole model, and one process is refused."""

from __future__ import annotations

import os
import textwrap

import pytest
import torch

from tdrl.llm import GRPOConfig, SFTConfig, load_model_and_tokenizer

_RANKS = textwrap.dedent("""
    import faulthandler, gc, os, torch, torch.distributed as dist
    faulthandler.enable()  # an abort (SIGABRT) prints where each thread was
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    from tdrl.llm import (ArithmeticTask, GRPOConfig, GRPOTrainer, SFTConfig, SFTTrainer,
                          load_model_and_tokenizer)
    from tdrl.llm.trainers.sharding import is_sharded
    folder, out = {folder!r}, {out!r}
    train_ds, _ = ArithmeticTask(max_value=9).splits(64, 8, seed=0)

    def sft(fsdp, steps, ckpt=None, stop=None):
        model, tok = load_model_and_tokenizer(folder)
        # the logits path on both (fsdp=True takes it: the fused kernels read the head's weight outside the forward)
        cfg = SFTConfig(steps=steps, batch_size=8, grad_accum=2, lr=1e-2, warmup_steps=0, progress=False,
                        fused_logprobs=False, fsdp=fsdp, checkpoint_path=ckpt, checkpoint_every=100)
        trainer = SFTTrainer(model, tok, train_ds, cfg)
        assert is_sharded(trainer.model) == fsdp
        trainer.train(stop)
        return trainer

    def length_reward(prompts, completions, **columns):  # varies within a group: gradients from round 1
        return [len(c) / 8 for c in completions]

    def grpo(fsdp, steps, ckpt=None, stop=None):
        model, tok = load_model_and_tokenizer(folder)
        cfg = GRPOConfig(steps=steps, prompts_per_step=2, group_size=4, max_new_tokens=4, lr=1e-2, progress=False,
                         epochs=2, fsdp=fsdp, checkpoint_path=ckpt, checkpoint_every=100)
        cfg.loss = cfg.loss.update(beta=0.1)
        trainer = GRPOTrainer(model, tok, length_reward, train_ds, cfg)
        trainer.train(stop)
        return trainer

    def main():
        results = {{}}
        for name, make, steps in (("sft", sft, 4), ("grpo", grpo, 3)):
            ddp = make(False, steps)
            ckpt = os.path.join(out, name + ".pt")
            make(True, steps, ckpt, stop=steps - 1)  # stops one step early and saves its shards
            resumed = make(True, steps, ckpt)  # a fresh sharded trainer resumes from them
            assert resumed.step_count == steps
            resumed.save_pretrained(os.path.join(out, name + "_fsdp"))  # every rank: a collective
            results[name] = {{k: v.detach().clone() for k, v in ddp.model.state_dict().items()}}
            results[name + "_metrics"] = [r["loss" if name == "sft" else "reward"] for r in resumed.metrics.rows]
        if rank == 0:
            torch.save(results, os.path.join(out, "ddp.pt"))

    main()
    # the sharded models (and any collective work they hold) are freed while the group lives: one
    # left to interpreter finalisation after the group is gone aborted a rank once in CI
    # ("terminate called without an active exception", exit -6, after the work was done)
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
""")


def test_fsdp_equals_ddp_and_resumes_sharded(fresh_python, _tiny, tmp_path):
    folder, _, _ = _tiny
    script = _RANKS.format(folder=str(folder), out=str(tmp_path))
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29647", "WORLD_SIZE": "2"}
    jobs = [fresh_python.start(script, env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}) for r in range(2)]
    for job in jobs:
        proc = job.wait(timeout=180)
        assert proc.returncode == 0, proc.stderr[-3000:]
    ddp = torch.load(tmp_path / "ddp.pt", weights_only=True)
    init = load_model_and_tokenizer(folder)[0].state_dict()
    for name in ("sft", "grpo"):
        fsdp = load_model_and_tokenizer(tmp_path / f"{name}_fsdp")[0].state_dict()
        assert set(fsdp) == set(ddp[name])
        moved = max((ddp[name][k] - init[k]).abs().max().item() for k in init)
        err = max((fsdp[k] - ddp[name][k]).abs().max().item() for k in fsdp)
        assert moved > 1e-2, (name, moved)  # training changed the weights: the equality is not trivial
        # measured: GRPO 0 (bitwise), SFT 2.4e-6 (grad_accum=2 sums in another order; AdamW at lr 1e-2
        # magnifies rounding where a gradient is near 0), against 2.7e-2 / 4.2e-2 of movement
        assert err < 1e-5, (name, err, moved)


def test_fsdp_needs_two_ranks(_tiny, task):
    folder, model, tok = _tiny
    from tdrl.llm import SFTTrainer, GRPOTrainer, math_answer_reward

    train_ds, _ = task.splits(8, 2, seed=0)
    with pytest.raises(ValueError, match=r"SFTConfig.fsdp=True needs torch.distributed with 2 or more ranks"):
        SFTTrainer(model, tok, train_ds, SFTConfig(fsdp=True, progress=False))
    with pytest.raises(ValueError, match=r"GRPOConfig.fsdp=True needs torch.distributed with 2 or more ranks"):
        GRPOTrainer(model, tok, math_answer_reward, train_ds, GRPOConfig(fsdp=True, progress=False))
