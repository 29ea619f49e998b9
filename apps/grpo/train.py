"""GRPO fine-tuning of a causal LM on a synthetic arithmetic task: the project's main job.

On its defaults (no download) it trains a tokenizer locally, builds a tiny Qwen2 model from a
config, saves both and reloads them with ``from_pretrained``, warms the model up with a short
SFT, then runs GRPO with a verifier reward, and reports held-out accuracy after SFT and after
GRPO. ``--model PATH`` starts from any local Hugging Face causal LM instead.

    python apps/grpo/train.py                 # the embedded default (~minutes on 2 CPU cores)
    python apps/grpo/train.py --tiny          # a seconds-long smoke run (CI)
    python apps/grpo/train.py --loss dapo --beta 0.02 --lora

Outputs in ``--out``: ``sft/metrics.csv``, ``grpo/metrics.csv`` (with ``hparams.json``), ``reward_curve.png``,
``summary.json``, the tiny model folder and the final model (``final/``). A rerun into the
same ``--out`` starts afresh; ``--resume`` continues the GRPO phase from ``checkpoint.pt``
(written every ``--checkpoint-every`` rounds and at the end) without redoing the SFT.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import time
from dataclasses import dataclass

import torch

from tdrl.llm import (
    ArithmeticTask,
    GRPOConfig,
    GRPOLossConfig,
    GRPOTrainer,
    SFTConfig,
    SFTTrainer,
    apply_lora,
    evaluate,
    load_model_and_tokenizer,
    make_tiny_lm,
    math_answer_reward,
)

LOSS_PRESETS = {
    "grpo": GRPOLossConfig.grpo,
    "dapo": GRPOLossConfig.dapo,
    "dr_grpo": GRPOLossConfig.dr_grpo,
    "gspo": GRPOLossConfig.gspo,
}


@dataclass
class Config:
    """Every knob of the app; each field is a ``--flag`` (underscores become dashes)."""

    out: str = "runs/grpo"
    model: str = ""  # local HF causal LM folder; empty: build the tiny embedded model
    arch: str = "qwen2"  # tiny model architecture: qwen2 | llama
    hidden_size: int = 96
    num_layers: int = 2
    seed: int = 0
    threads: int = 1  # torch threads; more than 1 on a shared 2-core machine is 10x slower under load
    # task
    max_value: int = 19
    ops: str = "+"
    n_train: int = 2000
    n_test: int = 200
    # SFT warm start
    sft_steps: int = 150
    sft_batch: int = 64
    sft_lr: float = 3e-3
    # GRPO
    steps: int = 250
    prompts_per_step: int = 64
    group_size: int = 8
    max_new_tokens: int = 4
    temperature: float = 1.0
    lr: float = 2e-4
    warmup: int = 20  # a fresh Adam without warm-up kicks every weight by ~lr and undoes SFT
    epochs: int = 1
    minibatch_size: int = 256  # 0: the whole rollout
    grad_accum: int = 1
    loss: str = "grpo"  # grpo | dapo | dr_grpo | gspo
    beta: float = 0.0
    tis_cap: float = 0.0  # 0: off
    lora: bool = False
    lora_rank: int = 8
    checkpoint_every: int = 0  # 0: only at the end
    resume: bool = False  # continue GRPO from --out/checkpoint.pt (SFT skipped); else start afresh
    eval_every: int = 25  # held-out accuracy every N GRPO rounds (0: only at the end)
    tiny: bool = False  # seconds-long smoke sizes (CI) for the settings not given as flags

    def __post_init__(self):
        if self.loss not in LOSS_PRESETS:
            raise SystemExit(f"--loss must be one of {sorted(LOSS_PRESETS)}, got {self.loss!r}")


TINY = dict(hidden_size=32, num_layers=1, n_train=256, n_test=32, sft_steps=20, sft_batch=32, steps=4,
            prompts_per_step=4, group_size=4, minibatch_size=0)


def parse_args(argv=None) -> Config:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], argument_default=argparse.SUPPRESS)
    for f in dataclasses.fields(Config):
        name = "--" + f.name.replace("_", "-")
        if f.type == "bool":
            p.add_argument(name, action=argparse.BooleanOptionalAction, help=f"(default: {f.default})")
        else:
            typ = {"int": int, "float": float, "str": str}[f.type]
            p.add_argument(name, type=typ, help=f"(default: {f.default!r})")
    given = vars(p.parse_args(argv))  # only the flags on the command line
    if given.get("tiny"):  # smoke sizes for every setting not given as a flag
        given = {**TINY, **given}
    return Config(**given)


def plot_rewards(rows: list[dict], path: str, curve: list[tuple[int, float]]) -> None:
    """Train reward per GRPO round (and a moving average) and the held-out accuracy curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in rows]
    reward = [r["reward"] for r in rows]
    k = max(1, len(reward) // 10)
    smooth = [sum(reward[max(0, i - k + 1) : i + 1]) / len(reward[max(0, i - k + 1) : i + 1]) for i in range(len(reward))]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(steps, reward, alpha=0.35, label="train reward")
    ax.plot(steps, smooth, label=f"moving average ({k})")
    ax.plot([c[0] for c in curve], [c[1] for c in curve], "o-", c="green",
            label=f"held-out accuracy (greedy): {curve[0][1]:.2f} -> {curve[-1][1]:.2f}")
    ax.set_xlabel("GRPO round")
    ax.set_ylabel("reward / accuracy")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> dict:
    cfg = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    os.makedirs(cfg.out, exist_ok=True)
    t_start = time.time()

    task = ArithmeticTask(max_value=cfg.max_value, ops=cfg.ops)
    train_ds, test_ds = task.splits(cfg.n_train, cfg.n_test, seed=cfg.seed)
    if cfg.model:
        model, tokenizer = load_model_and_tokenizer(cfg.model)
    else:
        model, tokenizer = make_tiny_lm(
            os.path.join(cfg.out, "tiny_model"), task.corpus(), arch=cfg.arch, seed=cfg.seed,
            hidden_size=cfg.hidden_size, num_layers=cfg.num_layers, intermediate_size=3 * cfg.hidden_size,
        )
    if cfg.lora:
        model = apply_lora(model, r=cfg.lora_rank, alpha=2 * cfg.lora_rank)
    n_params = sum(p.numel() for p in model.parameters())

    def accuracy() -> float:
        return evaluate(model, tokenizer, test_ds, math_answer_reward, max_new_tokens=cfg.max_new_tokens)

    ckpt = os.path.join(cfg.out, "checkpoint.pt")
    sft_file = os.path.join(cfg.out, "sft", "accuracy.json")
    resuming = cfg.resume and os.path.exists(ckpt)
    if os.path.exists(ckpt) and not cfg.resume:
        print(f"[grpo] {ckpt} is an earlier run's: starting afresh (--resume continues it)", flush=True)
        os.remove(ckpt)
    if resuming:  # the checkpoint holds the weights after SFT and the GRPO rounds done so far
        print(f"[grpo] resuming GRPO from {ckpt}; SFT skipped", flush=True)
        done = json.loads(open(sft_file).read()) if os.path.exists(sft_file) else {}
        acc0, acc_sft = done.get("start", float("nan")), done.get("after_sft", float("nan"))
    else:
        acc0 = accuracy()
        sft = SFTTrainer(model, tokenizer, train_ds, SFTConfig(
            steps=cfg.sft_steps, batch_size=cfg.sft_batch, lr=cfg.sft_lr, warmup_steps=10, seed=cfg.seed,
            log_dir=os.path.join(cfg.out, "sft"),
        ))
        sft.train()
        acc_sft = accuracy()
        with open(sft_file, "w") as f:
            json.dump({"start": acc0, "after_sft": acc_sft}, f)
    print(f"held-out accuracy: start {acc0:.3f} -> after SFT {acc_sft:.3f}", flush=True)

    loss_cfg = LOSS_PRESETS[cfg.loss](beta=cfg.beta, tis_cap=cfg.tis_cap or None)
    every = cfg.checkpoint_every or cfg.steps
    grpo = GRPOTrainer(model, tokenizer, [math_answer_reward], train_ds, GRPOConfig(
        steps=cfg.steps, prompts_per_step=cfg.prompts_per_step, group_size=cfg.group_size,
        max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, lr=cfg.lr, epochs=cfg.epochs,
        minibatch_size=cfg.minibatch_size or None, grad_accum=cfg.grad_accum, loss=loss_cfg,
        seed=cfg.seed, warmup_steps=cfg.warmup, log_dir=os.path.join(cfg.out, "grpo"),
        checkpoint_path=ckpt, checkpoint_every=every,
    ))
    curve: list[tuple[int, float]] = [(0, acc_sft)]

    def on_round(trainer, metrics):
        if cfg.eval_every and trainer.step_count % cfg.eval_every == 0 and trainer.step_count < cfg.steps:
            curve.append((trainer.step_count, accuracy()))

    grpo.callback = on_round
    grpo.train()
    acc_grpo = accuracy()
    curve.append((grpo.step_count, acc_grpo))
    grpo.save_pretrained(os.path.join(cfg.out, "final"))
    plot_rewards(grpo.metrics.rows, os.path.join(cfg.out, "reward_curve.png"), curve)
    rows = grpo.metrics.rows
    summary = {
        "params": n_params,
        "accuracy_start": acc0,
        "accuracy_after_sft": acc_sft,
        "accuracy_after_grpo": acc_grpo,
        "heldout_accuracy_curve": curve,
        "train_reward_first": rows[0]["reward"] if rows else None,
        "train_reward_last10": sum(r["reward"] for r in rows[-10:]) / max(1, len(rows[-10:])),
        "wall_s": time.time() - t_start,
        "config": dataclasses.asdict(cfg),
    }
    with open(os.path.join(cfg.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(
        f"held-out accuracy after SFT {acc_sft:.3f} -> after GRPO {acc_grpo:.3f} "
        f"({acc_grpo - acc_sft:+.3f}); {n_params / 1e6:.2f}M params; {summary['wall_s']:.0f}s; outputs in {cfg.out}",
        flush=True,
    )
    return summary


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
