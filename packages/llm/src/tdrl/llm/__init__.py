"""tdrl.llm: GRPO and SFT post-training of Hugging Face causal LMs.

Data move as TensorDicts with one row per completion (keys in :mod:`tdrl.llm.keys`).
"""

from __future__ import annotations

from tdrl.kernels._dist import installed_version as _installed_version

from tdrl.llm import keys
from tdrl.llm.advantages import group_advantages
from tdrl.llm.data import (
    PromptSampler,
    completion_text,
    completion_texts,
    concat_prompt_completion,
    conversation_pairs,
    expand_conversations,
    load_prompt_dataset,
    render_prompts,
    tokenize_prompts,
    tokenize_sft,
)
from tdrl.llm.generation import Generator, HFGenerator, completion_mask_from_eos, unique_prompts
from tdrl.llm.logprobs import completion_hidden, completion_logprobs, fused_path_matches, logprobs_from_hidden
from tdrl.llm.losses import (
    GRPOLoss,
    GRPOLossConfig,
    SFTLoss,
    grpo_objective,
    k3_kl,
    masked_reduce,
    micro_batch_weights,
    sequence_level_logprobs,
    tis_weights,
)
from tdrl.llm.lora import apply_lora
from tdrl.llm.models import MODELS, check_model_source, is_model_source, load_model_and_tokenizer, model_installed, resolve_model
from tdrl.llm.rewards import (
    SandboxUnavailable,
    code_execution_reward,
    compute_rewards,
    math_answer_reward,
    number_only_format_reward,
    regex_format_reward,
    run_python_sandboxed,
    think_answer_format_reward,
    thread_safe_reward,
)
from tdrl.llm.rewards.compute import ON_REWARD_ERROR, RewardFunctionError
from tdrl.llm.tasks import ArithmeticTask, FunctionToolArithmeticTask, ToolArithmeticTask
from tdrl.llm.tiny import build_tiny_model, make_tiny_lm, train_tokenizer
from tdrl.llm.trainers import GRPOConfig, GRPOTrainer, SFTConfig, SFTTrainer, evaluate
from tdrl.llm.vllm_generator import VLLMGenerator

__version__ = _installed_version("tdrl-llm")  # the version in this package's pyproject.toml

__all__ = [
    "__version__",
    "ArithmeticTask",
    "ToolArithmeticTask",
    "FunctionToolArithmeticTask",
    "GRPOConfig",
    "MODELS",
    "ON_REWARD_ERROR",
    "GRPOLoss",
    "GRPOLossConfig",
    "GRPOTrainer",
    "Generator",
    "HFGenerator",
    "PromptSampler",
    "RewardFunctionError",
    "SandboxUnavailable",
    "SFTConfig",
    "SFTLoss",
    "SFTTrainer",
    "VLLMGenerator",
    "apply_lora",
    "build_tiny_model",
    "check_model_source",
    "code_execution_reward",
    "completion_hidden",
    "completion_logprobs",
    "completion_mask_from_eos",
    "completion_text",
    "completion_texts",
    "compute_rewards",
    "concat_prompt_completion",
    "conversation_pairs",
    "evaluate",
    "expand_conversations",
    "fused_path_matches",
    "group_advantages",
    "grpo_objective",
    "is_model_source",
    "k3_kl",
    "keys",
    "load_model_and_tokenizer",
    "load_prompt_dataset",
    "logprobs_from_hidden",
    "make_tiny_lm",
    "masked_reduce",
    "micro_batch_weights",
    "model_installed",
    "math_answer_reward",
    "number_only_format_reward",
    "regex_format_reward",
    "render_prompts",
    "resolve_model",
    "run_python_sandboxed",
    "sequence_level_logprobs",
    "think_answer_format_reward",
    "thread_safe_reward",
    "tis_weights",
    "tokenize_prompts",
    "tokenize_sft",
    "train_tokenizer",
    "unique_prompts",
]
