"""TRL's GRPO quick start (TRL docs, "GRPO Trainer", quick start with ``reward_len``), run on tdrl.

Same steps as TRL's script, in TRL's spelling: a dataset, a reward function with TRL's
signature, ``GRPOConfig(...)``, ``GRPOTrainer(model=..., reward_funcs=..., args=...,
train_dataset=...)``, ``trainer.train()``. What differs: the import line, and what stands in
for the hub on a machine without one (:func:`local_stand_ins`: the embedded tiny model's folder
for ``"Qwen/Qwen2-0.5B-Instruct"``, a local dataset for ``load_dataset("trl-lib/tldr")``), and
a budget that runs in seconds on one CPU thread (TRL's names: ``max_steps``, ...).

    python apps/examples/trl_grpo_quickstart.py [output_dir]
"""

from __future__ import annotations

import sys

from datasets import Dataset

from tdrl.llm import GRPOConfig, GRPOTrainer
from tdrl.llm.tiny import make_tiny_lm

POSTS = [
    "My neighbour's cat keeps sleeping on my car. It leaves paw prints everywhere. What do I do?",
    "I forgot my friend's birthday and she is upset. How do I make it up to her?",
    "Our team lost the final by one goal after leading the whole game.",
    "I moved to a new city and I do not know anyone here yet.",
    "The bus was late again so I walked to work in the rain.",
    "My plant lost all its leaves after I moved it next to the window.",
    "I started learning to cook and burned the rice three times this week.",
    "We adopted a dog and he chews every shoe in the house.",
]


def local_stand_ins(output_dir: str) -> tuple[str, Dataset]:
    """The tiny model's folder (for ``"Qwen/Qwen2-0.5B-Instruct"``) and a local dataset of posts to
    summarise (for ``load_dataset("trl-lib/tldr", split="train")``, whose column is ``prompt`` too)."""
    model_name = f"{output_dir}/tiny_model"
    make_tiny_lm(model_name, POSTS, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64)
    return model_name, Dataset.from_dict({"prompt": [f"{post}\nTL;DR:" for post in POSTS]})


# Define the reward function, which rewards completions that are close to 20 characters
def reward_len(completions, **kwargs):
    return [-abs(20 - len(completion)) for completion in completions]


def main(output_dir: str = "runs/trl_grpo_quickstart") -> GRPOTrainer:
    model_name, dataset = local_stand_ins(output_dir)

    training_args = GRPOConfig(output_dir=output_dir, max_steps=3, per_device_train_batch_size=8, num_generations=4,
                               max_completion_length=8, learning_rate=1e-3, report_to="none")
    trainer = GRPOTrainer(
        model=model_name,
        reward_funcs=reward_len,
        args=training_args,
        train_dataset=dataset,
    )
    trainer.train()
    return trainer


if __name__ == "__main__":
    trainer = main(*sys.argv[1:2])
    print({k: round(v, 3) for k, v in trainer.metrics.rows[-1].items() if k in ("step", "reward", "completion_len")})
