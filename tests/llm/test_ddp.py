"""Data parallelism: two CPU processes on gloo end with identical weights (GRPO, then SFT
through the fused LM-head cross-entropy under DDP)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

WORKER = textwrap.dedent(
    """
    import os, sys, json, torch, torch.distributed as dist
    torch.set_num_threads(1)
    rank, world, folder, out, init = int(sys.argv[1]), 2, sys.argv[2], sys.argv[3], sys.argv[4]
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    from tdrl.llm import ArithmeticTask, GRPOConfig, GRPOTrainer, load_model_and_tokenizer

    def reward(prompts, completions, **_):
        return [sum(ch.isdigit() for ch in c) / 4.0 for c in completions]

    model, tok = load_model_and_tokenizer(folder)
    # plain rows (no `datasets` import), one per distinct prompt
    train = list({r["prompt"]: r for r in ArithmeticTask(max_value=9).rows(200, seed=0)}.values())
    cfg = GRPOConfig(steps=2, prompts_per_step=4, group_size=4, max_new_tokens=4, lr=1e-2,
                     minibatch_size=8, grad_accum=2, progress=False, seed=0,
                     loss="dapo")  # the token mean over both ranks' tokens (an all_reduce per minibatch)
    trainer = GRPOTrainer(model, tok, [reward], train, cfg)
    seen = []
    orig = trainer.rollout
    def rollout(batch):
        seen.extend(batch["prompt"])
        return orig(batch)
    trainer.rollout = rollout
    trainer.train()
    from tdrl.llm import SFTConfig, SFTTrainer
    sft_train, _ = ArithmeticTask(max_value=9).splits(64, 8, seed=0)
    sft = SFTTrainer(model, tok, sft_train, SFTConfig(steps=2, batch_size=8, grad_accum=2, lr=1e-2, progress=False))
    sft_losses = [m["loss"] for m in sft.train()]
    torch.save({"state": model.state_dict(), "prompts": seen, "sft_losses": sft_losses}, f"{out}/rank{rank}.pt")
    dist.destroy_process_group()
    """
)


@pytest.mark.slow
def test_ddp_replicas_agree(_tiny, tmp_path):
    folder, model, _ = _tiny
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    init = f"file://{tmp_path / 'store'}"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen([sys.executable, str(script), str(r), str(folder), str(tmp_path), init], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for r in range(2)
    ]
    for p in procs:
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0, out.decode()[-3000:]
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in range(2))
    assert set(r0["prompts"]).isdisjoint(r1["prompts"]), "ranks must draw different prompts"
    assert r0["sft_losses"] == r1["sft_losses"], "SFT losses are averaged over the ranks"
    init_state = model.state_dict()
    changed = False
    for k, v in r0["state"].items():
        torch.testing.assert_close(v, r1["state"][k], rtol=0, atol=0, msg=f"replicas differ at {k}")
        changed |= not torch.equal(v, init_state[k])
    assert changed, "training must have changed the weights"
