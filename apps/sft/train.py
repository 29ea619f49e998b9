"""Supervised fine-tuning of a causal LM on (prompt, completion) pairs.

On its defaults it trains the tiny embedded model on the synthetic arithmetic task and
reports held-out accuracy; ``model=PATH`` takes a local Hugging Face causal LM and
``data=FILE`` a local ``.jsonl``/``.csv``/``.parquet`` with ``prompt`` and ``completion``
columns (and optionally ``answer`` for the accuracy check).

    python apps/sft/train.py steps=300
    python apps/sft/train.py --config-name tiny          # a seconds-long smoke run (CI)
    python apps/sft/train.py model=./my_model data=train.jsonl lora=true
    python apps/sft/train.py data=train.jsonl packing=true max_length=512   # short examples packed into full rows
    torchrun --nproc_per_node 2 apps/sft/train.py        # data parallel, one run folder
    torchrun --nproc_per_node 2 apps/sft/train.py fsdp=true   # sharded (FSDP2) instead of DDP

Outputs in ``out`` (the run harness of ``tdrl.core.train``): ``config.yaml``, ``metrics.csv``
(one row per step), ``loss_curve.png``, ``summary.json``, ``checkpoints/step_<n>.pt``
(weights, optimiser, schedule, data order, RNG; ``resume=true`` continues exactly), the tiny
model folder and the final model (``final/``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from tdrl.core.train import ConfigError, Run, hydra_app, init_from_env
from tdrl.llm import (
    ArithmeticTask,
    SFTConfig,
    SFTTrainer,
    evaluate,
    load_prompt_dataset,
    math_answer_reward,
)
from tdrl.llm.run_config import LMRunConfig


@dataclass
class Config(LMRunConfig):
    """SFT of a causal LM (the tiny embedded model on the arithmetic task by default)."""

    data: str = ""
    """Local .jsonl/.csv/.parquet with prompt and completion columns; empty: the arithmetic task."""
    steps: int = 300
    """Optimiser steps (the run's step unit)."""
    batch_size: int = 64
    """Examples per optimiser step (per rank)."""
    grad_accum: int = 1
    """Micro-batches each step is split into."""
    lr: float = 3e-3
    """AdamW learning rate (cosine decay)."""
    warmup: int = 10
    """Warm-up steps."""
    max_length: int = 0
    """Tokens kept of each example (its first ones; TRL's max_length); 0: no truncation."""
    packing: bool = False
    """Pack each batch's examples into rows of max_length tokens (1024 when 0) with no attention across
    examples (TRL's packing=True): less padding, the same loss."""
    max_new_tokens: int = 4
    """Tokens generated per held-out answer."""
    checkpoint_every: int = 100
    """Steps between checkpoints; 0: only at the end."""
    out: str = "runs/sft"
    """Run folder (a new numbered one beside it if it holds an earlier run and resume is false)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.data and not Path(self.data).is_file():
            raise ConfigError(f"Config.data={self.data!r}: no such file.")

    def sft_config(self) -> SFTConfig:
        """The trainer's settings (checked here, before any model work)."""
        return SFTConfig(steps=self.steps, batch_size=self.batch_size, grad_accum=self.grad_accum, lr=self.lr,
                         warmup_steps=self.warmup, seed=self.seed, progress=self.progress,
                         max_length=self.max_length or None, packing=self.packing,
                         gradient_checkpointing=self.gradient_checkpointing, fsdp=self.fsdp)


def train(cfg: Config) -> dict:
    init_from_env()  # torchrun: one job, rank 0 writes
    sft_cfg = cfg.sft_config()
    run = Run(cfg, "sft", total=cfg.steps, per_rank=True)
    task = ArithmeticTask()
    if cfg.data:
        ds = load_prompt_dataset(cfg.data).train_test_split(test_size=0.1, seed=cfg.seed)
        train_ds, test_ds = ds["train"], ds["test"]
    else:
        train_ds, test_ds = task.splits(2000, 200, seed=cfg.seed)
    model, tok = cfg.build_model(task.corpus())
    trainer = SFTTrainer(model, tok, train_ds, sft_cfg, run=run)
    trainer.train()
    rows = run.history.rows
    summary = {"steps": trainer.step_count, "final_loss": rows[-1]["loss"] if rows else None}
    if "answer" in test_ds.column_names:
        summary["accuracy"] = evaluate(model, tok, test_ds, math_answer_reward, max_new_tokens=cfg.max_new_tokens)
    trainer.save_pretrained(os.path.join(cfg.out, "final"))
    summary = run.finish(summary, plots={"loss_curve.png": ("step", ["loss"])}, title="SFT")
    if run.main:
        print(f"SFT done: {summary}; model in {os.path.join(cfg.out, 'final')}", flush=True)
    return summary


main = hydra_app(Config, train, name="sft", recipes=Path(__file__).parent / "recipes")

if __name__ == "__main__":
    main()
