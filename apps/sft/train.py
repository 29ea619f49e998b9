"""Supervised fine-tuning of a causal LM on (prompt, completion) pairs.

On its defaults it trains the tiny embedded model on the synthetic arithmetic task and
reports held-out accuracy; ``--model PATH`` takes a local Hugging Face causal LM and
``--data FILE`` a local ``.jsonl``/``.csv``/``.parquet`` with ``prompt`` and ``completion``
columns (and optionally ``answer`` for the accuracy check).

    python apps/sft/train.py --steps 300
    python apps/sft/train.py --model ./my_model --data train.jsonl --lora
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from dataclasses import dataclass

import torch

from tdrl.llm import (
    ArithmeticTask,
    SFTConfig,
    SFTTrainer,
    apply_lora,
    evaluate,
    load_model_and_tokenizer,
    load_prompt_dataset,
    make_tiny_lm,
    math_answer_reward,
)


@dataclass
class Config:
    """Every knob of the app; each field is a ``--flag``."""

    out: str = "runs/sft"
    model: str = ""
    data: str = ""
    arch: str = "qwen2"
    hidden_size: int = 96
    num_layers: int = 2
    steps: int = 300
    batch_size: int = 64
    grad_accum: int = 1
    lr: float = 3e-3
    warmup: int = 10
    lora: bool = False
    seed: int = 0
    threads: int = 1  # torch threads; more than 1 on a shared 2-core machine is 10x slower under load
    max_new_tokens: int = 4
    tiny: bool = False

    def __post_init__(self):
        if self.tiny:
            self.hidden_size, self.num_layers, self.steps, self.batch_size = 32, 1, 10, 16


def parse_args(argv=None) -> Config:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for f in dataclasses.fields(Config):
        name = "--" + f.name.replace("_", "-")
        if f.type == "bool":
            p.add_argument(name, action=argparse.BooleanOptionalAction, default=f.default)
        else:
            p.add_argument(name, type={"int": int, "float": float, "str": str}[f.type], default=f.default)
    return Config(**vars(p.parse_args(argv)))


def main(argv=None) -> dict:
    cfg = parse_args(argv)
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    os.makedirs(cfg.out, exist_ok=True)
    task = ArithmeticTask()
    if cfg.data:
        ds = load_prompt_dataset(cfg.data).train_test_split(test_size=0.1, seed=cfg.seed)
        train, test = ds["train"], ds["test"]
    else:
        train, test = task.splits(2000, 200, seed=cfg.seed)
    if cfg.model:
        model, tok = load_model_and_tokenizer(cfg.model)
    else:
        model, tok = make_tiny_lm(os.path.join(cfg.out, "tiny_model"), task.corpus(), arch=cfg.arch, seed=cfg.seed,
                                  hidden_size=cfg.hidden_size, num_layers=cfg.num_layers, intermediate_size=3 * cfg.hidden_size)
    if cfg.lora:
        model = apply_lora(model)
    trainer = SFTTrainer(model, tok, train, SFTConfig(
        steps=cfg.steps, batch_size=cfg.batch_size, grad_accum=cfg.grad_accum, lr=cfg.lr, warmup_steps=cfg.warmup,
        seed=cfg.seed, log_dir=os.path.join(cfg.out, "sft"),
    ))
    hist = trainer.train()
    summary = {"final_loss": hist[-1]["loss"] if hist else None}
    if "answer" in test.column_names:
        summary["accuracy"] = evaluate(model, tok, test, math_answer_reward, max_new_tokens=cfg.max_new_tokens)
    trainer.save_pretrained(os.path.join(cfg.out, "final"))
    with open(os.path.join(cfg.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(f"SFT done: {summary}; model in {os.path.join(cfg.out, 'final')}", flush=True)
    return summary


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
