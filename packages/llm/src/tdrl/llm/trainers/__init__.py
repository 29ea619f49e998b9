"""GRPO and SFT trainers."""

from __future__ import annotations

from tdrl.llm.trainers.base import TrainerSettings
from tdrl.llm.trainers.evaluate import evaluate
from tdrl.llm.trainers.grpo import GRPOConfig, GRPOTrainer
from tdrl.llm.trainers.sft import SFTConfig, SFTTrainer

__all__ = ["GRPOConfig", "GRPOTrainer", "SFTConfig", "SFTTrainer", "TrainerSettings", "evaluate"]
