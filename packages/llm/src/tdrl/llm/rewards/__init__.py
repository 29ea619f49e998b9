"""Reward functions: plain callables ``(prompts, completions, **columns) -> list[float]``."""

from __future__ import annotations

from tdrl.llm.rewards.code import code_execution_reward, extract_code
from tdrl.llm.rewards.compute import RewardFn, compute_rewards
from tdrl.llm.rewards.format import number_only_format_reward, regex_format_reward, think_answer_format_reward
from tdrl.llm.rewards.sandbox import SandboxResult, SandboxUnavailable, run_python_sandboxed, sandbox_mode
from tdrl.llm.rewards.workers import thread_safe_reward
from tdrl.llm.rewards.loading import load_function, load_reward, load_rewards, weighted_reward
from tdrl.llm.rewards.reward_model import RewardModel, reward_functions
from tdrl.llm.rewards.math import (
    answers_match,
    boxed_answer_reward,
    extract_boxed,
    extract_final_number,
    latex_value,
    math_answer_reward,
    parse_number,
)

__all__ = [
    "RewardFn",
    "RewardModel",
    "load_function",
    "reward_functions",
    "answers_match",
    "latex_value",
    "load_reward",
    "load_rewards",
    "weighted_reward",
    "SandboxResult",
    "SandboxUnavailable",
    "boxed_answer_reward",
    "code_execution_reward",
    "compute_rewards",
    "extract_boxed",
    "extract_code",
    "extract_final_number",
    "math_answer_reward",
    "number_only_format_reward",
    "parse_number",
    "regex_format_reward",
    "run_python_sandboxed",
    "sandbox_mode",
    "think_answer_format_reward",
    "thread_safe_reward",
]
