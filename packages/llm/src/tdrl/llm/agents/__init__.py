"""Multi-turn rollouts with tools: the sandboxed Python tool, Python callables as tools (their
JSON schemas and one dispatcher), environments (a protocol and an example game), the
conversation loop, the token-space batched rollout the GRPO trainer runs (``GRPOConfig.tools``,
``GRPOTrainer(environment_factory=)``) and the policy-token loss mask."""

from __future__ import annotations

from tdrl.llm.agents.callables import CallableTools, make_tool, parse_tool_calls, tool_schema, tools_prompt_text
from tdrl.llm.agents.conversation import Turn, policy_token_mask, run_conversation, tool_token_ids
from tdrl.llm.agents.environments import (
    Environment,
    EnvironmentTool,
    GuessNumberEnv,
    environment_reward,
    start_environments,
)
from tdrl.llm.agents.rollout import ToolRollout, tool_rollout
from tdrl.llm.agents.tools import ERROR_KINDS, TOOLS, PythonTool, ToolResult, ToolStats, escape_output, parse_tool_call

__all__ = ["ERROR_KINDS", "TOOLS", "CallableTools", "Environment", "EnvironmentTool", "GuessNumberEnv", "PythonTool",
           "ToolResult", "ToolRollout", "ToolStats", "Turn", "environment_reward", "escape_output", "make_tool",
           "parse_tool_call", "parse_tool_calls", "policy_token_mask", "run_conversation", "start_environments",
           "tool_rollout", "tool_schema", "tool_token_ids", "tools_prompt_text"]
