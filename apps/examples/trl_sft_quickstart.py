"""TRL's SFT quick start (TRL docs, "SFT Trainer", quick start), run on tdrl.

Same steps as TRL's script, in TRL's spelling: ``SFTTrainer(model=..., args=SFTConfig(...),
train_dataset=...)`` then ``trainer.train()``. What differs: the import line, and what stands in
for the hub on a machine without one (:func:`local_stand_ins`: the embedded tiny model's folder
for ``"Qwen/Qwen3-0.6B"``, a local prompt-completion dataset, a format TRL's ``SFTTrainer`` takes,
for ``load_dataset("trl-lib/Capybara")``), and a budget that runs in seconds on one CPU thread
(``args=SFTConfig(max_steps=..., ...)``, TRL's names).

    python apps/examples/trl_sft_quickstart.py [output_dir]
"""

from __future__ import annotations

import sys

from datasets import Dataset

from tdrl.llm import ArithmeticTask, SFTConfig, SFTTrainer
from tdrl.llm.tiny import make_tiny_lm


def local_stand_ins(output_dir: str) -> tuple[str, Dataset]:
    """The tiny model's folder (for ``"Qwen/Qwen3-0.6B"``) and a local prompt-completion dataset
    (``"Q: 3+4="`` -> ``"7"``, for ``load_dataset("trl-lib/Capybara", split="train")``)."""
    task = ArithmeticTask(max_value=9, ops="+")
    model_name = f"{output_dir}/tiny_model"
    make_tiny_lm(model_name, task.corpus(), hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64)
    train, _ = task.splits(n_train=64, n_test=8, seed=0)
    return model_name, train.select_columns(["prompt", "completion"])


def main(output_dir: str = "runs/trl_sft_quickstart") -> SFTTrainer:
    model_name, dataset = local_stand_ins(output_dir)

    trainer = SFTTrainer(
        model=model_name,
        args=SFTConfig(output_dir=output_dir, max_steps=10, per_device_train_batch_size=16, learning_rate=3e-3,
                       report_to="none"),
        train_dataset=dataset,
    )
    trainer.train()
    return trainer


if __name__ == "__main__":
    trainer = main(*sys.argv[1:2])
    print({k: round(v, 3) for k, v in trainer.metrics.rows[-1].items() if k in ("step", "loss")})
