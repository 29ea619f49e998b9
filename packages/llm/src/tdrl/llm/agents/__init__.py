"""Multi-turn rollouts with tools (first part): the sandboxed Python tool, tool-call parsing,
the conversation loop and the policy-token loss mask. Not yet wired into ``GRPOTrainer``."""

from __future__ import annotations

from tdrl.llm.agents.conversation import Turn, policy_token_mask, run_conversation
from tdrl.llm.agents.tools import PythonTool, ToolResult, ToolStats, parse_tool_call

__all__ = ["PythonTool", "ToolResult", "ToolStats", "Turn", "parse_tool_call", "policy_token_mask", "run_conversation"]
