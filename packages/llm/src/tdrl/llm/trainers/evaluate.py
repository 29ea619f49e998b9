"""Held-out evaluation: greedy completions scored by a verifier."""

from __future__ import annotations

import torch

from tdrl.llm.agents.callables import tools_prompt_text
from tdrl.llm.agents.environments import EnvironmentTool, start_environments
from tdrl.llm.data import completion_texts, render_prompts, tokenize_prompts
from tdrl.llm.generation import HFGenerator, unwrap_model
from tdrl.llm.rewards.compute import DEFAULT_REWARD_TIMEOUT_S, compute_rewards

__all__ = ["evaluate"]


@torch.no_grad()
def evaluate(model, tokenizer, dataset, reward_fn, max_new_tokens: int = 32, batch_size: int = 128, generator=None,
             tool=None, max_turns: int = 3, tool_stats=None, tool_workers: int = 4,
             reward_timeout: float | None = DEFAULT_REWARD_TIMEOUT_S, on_reward_error: str = "raise_if_all",
             show_tool_schemas: bool = True, environment_factory=None, tool_timeout: float = 2.0) -> float:
    """Mean verifier score of greedy completions over a dataset (accuracy for 0/1 verifiers).

    Args:
        model: the causal LM.
        tokenizer: its tokenizer.
        dataset: rows with ``"prompt"`` and the columns ``reward_fn`` needs.
        reward_fn: ``(prompts, completions, **columns) -> list[float]``, called as training
            calls it (:func:`tdrl.llm.compute_rewards`: keywords when its signature allows
            them, TRL's message lists for chat prompts, a killable worker at the timeout).
        max_new_tokens: completion cap.
        batch_size: prompts per generate call.
        generator: a :class:`tdrl.llm.generation.Generator` (default: an HFGenerator on ``model``).
        tool: a tool (:class:`tdrl.llm.agents.PythonTool`): greedy multi-turn conversations of up
            to ``max_turns`` policy turns (:func:`tdrl.llm.agents.tool_rollout`), scored as the
            GRPO trainer scores them (the last policy turn is the completion, the whole text the
            ``conversation`` column); ``None``: single-turn.
        max_turns, tool_workers: with ``tool``.
        tool_stats: a :class:`tdrl.llm.agents.ToolStats` that receives the calls, the call rate
            and the errors (with ``tool``).
        reward_timeout: seconds ``reward_fn`` may take per batch (as ``GRPOConfig.reward_timeout``:
            it runs in a forked worker killed at the limit, and the batch scores 0); ``None``:
            no limit, called in this thread.
        on_reward_error: as ``GRPOConfig.on_reward_error`` (:func:`tdrl.llm.compute_rewards`).
        show_tool_schemas: as ``GRPOConfig.show_tool_schemas``.
        environment_factory: as ``GRPOTrainer(environment_factory=)``: one fresh environment per
            row, reset on it, driving a greedy multi-turn conversation (instead of ``tool``); the
            reward receives ``environments=`` and ``turns=`` as in training.
        tool_timeout: seconds per environment method call (with ``environment_factory``).

    Returns:
        The mean score.
    """
    gen = generator or HFGenerator(unwrap_model(model), tokenizer, max_new_tokens=max_new_tokens)
    device = next(unwrap_model(model).parameters()).device
    total, n = 0.0, 0
    for start in range(0, len(dataset), batch_size):
        rows = dataset[start : start + batch_size]
        cols = {k: v for k, v in rows.items() if k != "prompt"}
        shown, row_tool, envs = rows["prompt"], tool, None
        if environment_factory is not None:  # one environment per row, as training starts them
            envs, shown = start_environments(environment_factory, rows["prompt"], cols)
            row_tool = [EnvironmentTool(e, tool_timeout) for e in envs]
        first = row_tool[0] if isinstance(row_tool, list) else row_tool
        schemas = getattr(first, "schemas", None) if show_tool_schemas else None  # shown to the model as training shows them
        prompts = render_prompts(tokenizer, shown, tools=schemas, tools_text=tools_prompt_text(schemas) if schemas else "")
        ids, mask = tokenize_prompts(tokenizer, prompts, device)
        if row_tool is None:
            out = gen.generate(ids, mask, greedy=True)
            texts = completion_texts(tokenizer, out["completion_ids"], out["completion_mask"])
        else:
            from tdrl.llm.agents.rollout import tool_rollout

            res = tool_rollout(gen, tokenizer, ids, mask, row_tool, max_turns, workers=tool_workers, greedy=True)
            texts, cols["conversation"] = res.final_turns, res.conversations
            if envs is not None:
                cols.update(environments=envs, turns=res.turns)
            if tool_stats is not None:
                tool_stats.merge(res.stats)
        scores, _, _ = compute_rewards([reward_fn], rows["prompt"], texts, cols, timeout=reward_timeout,
                                       on_error=on_reward_error)
        total += float(scores.sum())
        n += len(texts)
    return total / max(1, n)
