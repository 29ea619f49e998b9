"""Multi-turn rollouts with tools: the sandboxed Python tool, tool-call parsing, the
conversation loop, the token-space batched rollout the GRPO trainer runs (``GRPOConfig.tools``)
and the policy-token loss mask."""

from __future__ import annotations

from tdrl.llm.agents.conversation import Turn, policy_token_mask, run_conversation, tool_token_ids
from tdrl.llm.agents.rollout import ToolRollout, tool_rollout
from tdrl.llm.agents.tools import TOOLS, PythonTool, ToolResult, ToolStats, escape_output, make_tool, parse_tool_call

__all__ = ["TOOLS", "PythonTool", "ToolResult", "ToolRollout", "ToolStats", "Turn", "escape_output", "make_tool",
           "parse_tool_call", "policy_token_mask", "run_conversation", "tool_rollout", "tool_token_ids"]
