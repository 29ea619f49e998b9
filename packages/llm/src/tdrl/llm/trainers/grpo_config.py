"""Settings of the GRPO trainer (:class:`GRPOConfig`), checked before any model work."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tdrl.llm.agents import make_tool
from tdrl.llm.generation import check_sampling
from tdrl.llm.losses import LOSS_PRESETS, GRPOLossConfig
from tdrl.llm.rewards.compute import DEFAULT_REWARD_TIMEOUT_S, ON_REWARD_ERROR
from tdrl.llm.trainers.base import TrainerSettings
from tdrl.llm.trainers.common import check_int, check_number, check_update_settings
from tdrl.llm.trl_names import GRPO_CONFIG_NAMES, accept_trl_names

__all__ = ["GRPOConfig"]


@accept_trl_names(GRPO_CONFIG_NAMES)
@dataclass
class GRPOConfig(TrainerSettings):
    """Settings of :class:`GRPOTrainer`.

    TRL's field names are accepted too (``num_generations=``, ``learning_rate=``,
    ``loss_type="dapo"``, ...), translated by :mod:`tdrl.llm.trl_names` (its table is in
    ``packages/llm/README.md``); TRL names for what tdrl lacks are refused with what to use.

    Attributes:
        steps: generation rounds (``train()`` default).
        prompts_per_step: prompts per round per rank.
        group_size: completions per prompt ``G``.
        max_new_tokens: completion cap ``C``.
        temperature, top_p, top_k: sampling.
        epochs: passes over each rollout (TRL's ``num_iterations``).
        minibatch_size: completions per optimiser step (default: the whole rollout).
        grad_accum: micro-batches each minibatch is split into (memory only: the gradient is the
            minibatch's for every reduction, :func:`tdrl.llm.losses.micro_batch_weights`).
        lr, weight_decay, warmup_steps, max_grad_norm: optimisation (cosine decay to 10%).
        loss: a :class:`tdrl.llm.losses.GRPOLossConfig` (variants live there), or a preset's name
            (``"grpo"``, ``"dapo"``, ``"dr_grpo"``, ``"gspo"``).
        reward_weights: one weight per reward function (default all 1).
        reward_timeout: seconds each reward function may take per round (default 60); one that
            takes longer scores 0 for the round and is counted in ``reward_errors`` /
            ``reward_timeouts`` (each call, coroutine rewards included, runs in a forked worker
            process killed at the limit; one marked ``thread_safe_reward`` runs in a thread,
            left running, or cancelled if a coroutine: see :mod:`tdrl.llm.rewards.workers`).
            ``evaluate`` uses the same limit.
            ``None`` or ``0``: no limit, the function runs in the trainer's thread.
        on_reward_error: what a reward function that raises does
            (:func:`tdrl.llm.rewards.compute_rewards`): ``"raise_if_all"`` (default) stops the run
            with its traceback when it fails on every completion of a round (a bug must not
            train on zeros) and scores 0 the completions that fail alone (counted in
            ``reward_errors``, the first traceback logged once); ``"zero"`` never stops;
            ``"raise"`` stops at the first failure of any kind (timeouts included).
        fused_logprobs: use the fused LM-head kernel; ``None`` checks at construction, on a
            probe batch, that it matches the model's logits (else logits are used).
        share_prefix: generate and score each group's prompt once and share its KV cache
            (fused path only); ``None`` checks at construction that it matches the plain path.
        fused_loss: on the fused path, fuse the token-level loss into the LM-head kernel
            (:func:`tdrl.kernels.fused_linear_pg_loss`; GSPO never is); ``None`` checks at
            construction that it reproduces the two-step loss (value, statistics, gradients).
            The three are settled once into ``GRPOTrainer.lm_head`` (:class:`~tdrl.llm.logprobs.LMHead`)
            and never change during training.
        async_generation: overlap generation with training, one step off-policy: while round
            ``k`` trains, a background thread generates (and scores) round ``k+1`` with a snapshot
            of the weights taken before round ``k``'s updates. Set ``loss.tis_cap`` to correct the
            lag with truncated importance sampling (the generator's log-probs against the
            trainer's). Sampling then depends on thread timing (not bit-reproducible), and a
            resumed run regenerates its first round. Needs the default generator.
        tools: tool names (:data:`tdrl.llm.agents.TOOLS`, e.g. ``("python",)``) and / or Python
            functions (TRL's ``tools=[fn]``: their signature and docstring are the JSON schema the
            prompt shows, :mod:`tdrl.llm.agents.callables`; called with ``<tool_call>`` JSON): multi-turn
            rollouts (:func:`tdrl.llm.agents.tool_rollout`) where the policy's turn may call the
            tool, the tool's output is appended and read by the next turn, up to ``max_turns``
            policy turns or a turn without a call (the answer). Only the policy's tokens are
            trained; log-probs, old log-probs and the reference KL run over the whole sequence
            with the tool outputs attended and masked out of the loss. Rewards receive the last
            policy turn as the completion and the whole text after the prompt as the
            ``conversation`` column; tool calls, the call rate and errors by kind are metrics.
            Empty: single-turn rollouts.
        max_turns: policy turns at most per conversation (with ``tools``); ``max_new_tokens``
            caps each turn.
        tool_timeout: seconds per tool call (the sandbox is killed after it; an error text).
        tool_workers: tool calls run at once.
        show_tool_schemas: show the function tools' schemas in each prompt (the chat template's
            ``tools=``, or :func:`tdrl.llm.agents.tools_prompt_text`); ``False`` for a model taught
            the calls otherwise (the tiny recipe's SFT warm-up).
        tools_in_sandbox: run the function tools' source in the code sandbox (self-contained
            functions, JSON arguments and results) instead of a killable worker process.
        tool_sandbox: the code sandbox's mode for tool calls: ``"bwrap"`` (default) isolated, or
            the run stops with bubblewrap's error; ``"rlimit"``: NOT isolation, only by name.

    The model's memory, seed, logging and checkpoint settings are keyword-only fields shared
    with the other trainer: :class:`~tdrl.llm.trainers.base.TrainerSettings` (50 rounds between checkpoints).
    """

    steps: int = 100
    prompts_per_step: int = 16
    group_size: int = 8
    max_new_tokens: int = 32
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    epochs: int = 1
    minibatch_size: int | None = None
    grad_accum: int = 1
    lr: float = 1e-5
    weight_decay: float = 0.0
    warmup_steps: int = 0
    max_grad_norm: float = 1.0
    loss: GRPOLossConfig = field(default_factory=GRPOLossConfig)
    reward_weights: Sequence[float] | None = None
    reward_timeout: float | None = DEFAULT_REWARD_TIMEOUT_S
    on_reward_error: str = "raise_if_all"
    fused_logprobs: bool | None = None
    share_prefix: bool | None = None
    fused_loss: bool | None = None
    async_generation: bool = False
    tools: Sequence[str | Callable] = ()
    max_turns: int = 3
    tool_timeout: float = 2.0
    tool_workers: int = 4
    tool_sandbox: str = "bwrap"
    show_tool_schemas: bool = True
    tools_in_sandbox: bool = False
    # TrainerSettings' field with GRPO's default (kw_only keeps it in the base's place)
    checkpoint_every: int = field(default=50, kw_only=True)

    def __post_init__(self):
        """Check every setting before any model work; errors name the field, the value and the range."""
        own = "GRPOConfig"
        if isinstance(self.loss, str):
            if self.loss not in LOSS_PRESETS:
                raise ValueError(f"GRPOConfig.loss={self.loss!r}: expected a GRPOLossConfig or a preset name, one of {LOSS_PRESETS}")
            self.loss = GRPOLossConfig.preset(self.loss)
        elif not isinstance(self.loss, GRPOLossConfig):
            raise TypeError(f"GRPOConfig.loss={self.loss!r}: expected a GRPOLossConfig or a preset name, one of {LOSS_PRESETS}")
        check_update_settings(own, self)
        for name, minimum in (("prompts_per_step", 1), ("epochs", 1), ("max_turns", 1), ("tool_workers", 1)):
            check_int(own, name, getattr(self, name), minimum)
        if isinstance(self.group_size, bool) or not isinstance(self.group_size, int) or self.group_size < 2:
            raise ValueError(f"GRPOConfig.group_size={self.group_size!r}: expected an integer >= 2 for group advantages")
        if self.minibatch_size is not None:
            check_int(own, "minibatch_size", self.minibatch_size, 1)
        check_sampling(own, self.max_new_tokens, self.temperature, self.top_p, self.top_k)
        check_number(own, "loss.beta", self.loss.beta, ge=0)
        check_number(own, "tool_timeout", self.tool_timeout, gt=0)
        self.tools = (self.tools,) if isinstance(self.tools, str) or callable(self.tools) else tuple(self.tools or ())
        # checks names, schemas and mode (building a tool starts nothing)
        make_tool(self.tools, mode=self.tool_sandbox, sandbox=self.tools_in_sandbox)
        if self.reward_timeout is not None:
            check_number(own, "reward_timeout", self.reward_timeout, ge=0)
        if self.on_reward_error not in ON_REWARD_ERROR:
            raise ValueError(f"GRPOConfig.on_reward_error={self.on_reward_error!r}: expected one of {ON_REWARD_ERROR}")
        if self.reward_weights is not None:
            for i, w in enumerate(self.reward_weights):
                check_number(own, f"reward_weights[{i}]", w)
        n = self.prompts_per_step * self.group_size
        mb = self.minibatch_size or n
        if n % mb or mb % self.grad_accum:
            raise ValueError(
                f"GRPOConfig: prompts_per_step*group_size={n} must be divisible by minibatch_size={mb}, "
                f"and minibatch_size by grad_accum={self.grad_accum}"
            )
        if self.loss.reduction == "constant" and self.loss.max_len is None:
            self.loss = self.loss.update(max_len=self.max_new_tokens)

    @property
    def rollout_size(self) -> int:
        return self.prompts_per_step * self.group_size
