"""GRPO trainer: generate groups -> rewards -> group advantages -> epochs x minibatches.

One :meth:`GRPOTrainer.step` is one generation round followed by ``epochs`` passes over
the rollout in minibatches, each minibatch one optimiser step accumulated over
``grad_accum`` micro-batches. The generator receives the trainer's weights once per round, just
before it generates, and only when an optimiser step changed them since its last push
(``epochs`` and ``minibatch_size`` add optimiser steps, not pushes: a vLLM engine is loaded
once a round). Under ``torch.distributed`` every rank draws its own prompts,
DDP averages gradients, and all replicas keep identical weights.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext

import torch
from tensordict import TensorDict

from tdrl.llm import keys as K
from tdrl.llm.advantages import group_advantages
from tdrl.llm.agents import EnvironmentTool, environment_reward, make_tool, start_environments, tool_rollout, tools_prompt_text
from tdrl.llm.data import PromptSampler, completion_texts, render_prompts, tokenize_prompts
from tdrl.llm.generation import Generator, HFGenerator, unwrap_model
from tdrl.llm.logprobs import LMHead
from tdrl.llm.losses import GRPOLoss, micro_batch_weights
from tdrl.llm.trl_names import GRPO_TRAINER_NAMES, accept_trl_names
from tdrl.llm.rewards.compute import compute_rewards
from tdrl.llm.rewards.reward_model import reward_functions
from tdrl.core.objectives import total_loss
from tdrl.core.train import Logger, Run
from tdrl.llm.trainers.base import TrainerBase, model_and_tokenizer
from tdrl.llm.trainers.grpo_config import GRPOConfig
from tdrl.llm.trainers.common import all_reduce_mean, all_reduce_sum, dist_info, set_gradient_checkpointing
from tdrl.llm.trainers.sharding import check_fsdp, shard_model

__all__ = ["GRPOConfig", "GRPOTrainer"]

log = logging.getLogger(__name__)


@accept_trl_names(GRPO_TRAINER_NAMES)
class GRPOTrainer(TrainerBase):
    """Group Relative Policy Optimisation of a Hugging Face causal LM.

    TRL's keywords work too: ``GRPOTrainer(model=..., reward_funcs=..., args=GRPOConfig(...),
    train_dataset=..., eval_dataset=..., processing_class=..., peft_config=...)``
    (:mod:`tdrl.llm.trl_names`).

    Args:
        model: the policy (a ``transformers`` causal LM, optionally a peft model), or, as TRL's
            trainers take it, a name / path to load: a registered name (``"smollm2-135m-instruct"``),
            a local folder or a hub id (:func:`tdrl.llm.models.load_model_and_tokenizer`).
        tokenizer: its tokenizer (with a pad token); optional when ``model`` is a name / path.
        reward_fns: callables ``(prompts, completions, **columns) -> list[float]``, or reward models
            (a local folder or an ``AutoModelForSequenceClassification``, scored by
            :class:`tdrl.llm.rewards.RewardModel` on the policy's device); with
            conversational prompts the completions are message lists
            ``[{"role": "assistant", "content": text}]`` as in TRL (tdrl's own rewards get text).
        train_dataset: rows with ``"prompt"`` (a string, or a chat-message list rendered with the
            tokenizer's chat template) and the columns the rewards read.
        config: a :class:`GRPOConfig`.
        ref_model: frozen reference for the KL term (default: a copy of ``model`` when
            ``config.loss.beta > 0``; for a peft model, the base with adapters disabled).
        generator: a :class:`tdrl.llm.generation.Generator` (default: :class:`HFGenerator`).
        callback: called as ``callback(trainer, metrics)`` after each round.
        loggers: extra :class:`tdrl.core.train.Logger` s (TensorBoard, wandb) fed on rank 0.
        run: a :class:`tdrl.core.train.Run` to log and checkpoint through (the apps' run
            folder; it restores the trainer when it resumes); ``None``: ``config.log_dir`` /
            ``config.checkpoint_path``.
        eval_dataset: rows like ``train_dataset``, scored by :meth:`evaluate`.
        peft_config: a ``peft`` config (``LoraConfig``) the model is wrapped with (TRL's keyword).
        environment_factory: makes one environment per completion (TRL's keyword;
            :mod:`tdrl.llm.agents.environments`): multi-turn rollouts where it answers each turn
            (``step``) or its public methods are the tools; rewards receive ``environments=`` and
            ``turns=`` (default reward: :func:`tdrl.llm.agents.environment_reward`).
        reward_processing_classes: tokenizers of the reward models in ``reward_fns`` (TRL's keyword;
            default: each model's own).
        tools: function tools (TRL's keyword), added to ``config.tools``.

    Attributes:
        metrics: a :class:`tdrl.core.train.MetricHistory` of one row per round.
    """

    progress_desc = "grpo"

    def __init__(
        self,
        model,
        tokenizer=None,
        reward_fns: Sequence[Callable] | Callable | None = None,
        train_dataset=None,
        config: GRPOConfig | None = None,
        ref_model=None,
        generator: Generator | None = None,
        callback: Callable | None = None,
        loggers: Sequence[Logger] = (),
        run: Run | None = None,
        eval_dataset=None,
        peft_config=None,
        environment_factory: Callable[[], object] | None = None,
        reward_processing_classes=None,
        tools: Sequence | None = None,
    ):
        self.config = cfg = config or GRPOConfig()
        if tools:  # TRL's GRPOTrainer(tools=[fn]): the config's field
            import dataclasses

            self.config = cfg = dataclasses.replace(cfg, tools=(*cfg.tools, *tools))
        if environment_factory is not None and reward_fns is None:
            reward_fns = [environment_reward]
        if reward_fns is None or train_dataset is None:
            raise TypeError("GRPOTrainer: reward_fns (TRL: reward_funcs) and train_dataset are required (positional "
                            "order: model, tokenizer, reward_fns, train_dataset, config; TRL's order needs keywords)")
        if environment_factory is not None and cfg.tools:
            raise ValueError("GRPOTrainer: give tools (GRPOConfig.tools) or environment_factory, not both: an "
                             "environment's public methods are its tools")
        if not isinstance(cfg, GRPOConfig):
            raise TypeError(f"GRPOTrainer: config (TRL: args) must be a GRPOConfig, got {type(cfg).__name__}")
        if cfg.async_generation and generator is not None:
            raise ValueError("GRPOConfig.async_generation=True needs the default generator (generator=None): "
                             "it generates with a snapshot copy of the model")
        reward_fns = list(reward_fns) if isinstance(reward_fns, Sequence) and not isinstance(reward_fns, str) else [reward_fns]
        if cfg.reward_weights is not None and len(cfg.reward_weights) != len(reward_fns):
            raise ValueError(f"GRPOTrainer: {len(reward_fns)} reward functions but {len(cfg.reward_weights)} "
                             "reward_weights in the config: give one weight per function (checked before loading the model)")
        model, tokenizer = model_and_tokenizer(model, tokenizer, "GRPOTrainer", peft_config)
        self.eval_dataset = eval_dataset
        self.rank, self.world_size = dist_info()
        self.tokenizer = tokenizer
        self.model = model
        # reward models (a folder, a sequence-classification model) become scoring functions on the policy's device
        self.reward_fns = reward_functions(reward_fns, reward_processing_classes, next(model.parameters()).device)
        if cfg.fsdp:
            check_fsdp("GRPOConfig")
            if generator is not None or cfg.async_generation:
                raise ValueError("GRPOConfig.fsdp=True needs the default generator (generator=None, async_generation=False): "
                                 "it generates with the sharded model itself")
        set_gradient_checkpointing(model, cfg.gradient_checkpointing)
        self.ref_model = ref_model
        if cfg.loss.beta > 0 and ref_model is None and not _is_peft(model):
            import copy

            self.ref_model = copy.deepcopy(model).eval().requires_grad_(False)
            if cfg.fsdp:  # the frozen copy is sharded too (its forward all-gathers like the policy's)
                shard_model(self.ref_model, "GRPOConfig")
        self.ddp_model = self._wrap_model(model, "GRPOConfig")
        self.device = next(model.parameters()).device
        self.lm_head = self._choose_head(model)
        self.generator = generator or HFGenerator(
            model, tokenizer, cfg.max_new_tokens, cfg.temperature, cfg.top_p, cfg.top_k, share_prefix=self.lm_head.share_prefix
        )
        self.tool = make_tool(cfg.tools, cfg.tool_timeout, cfg.tool_sandbox, sandbox=cfg.tools_in_sandbox)
        self.environment_factory = environment_factory
        self.sampler = PromptSampler(train_dataset, cfg.prompts_per_step, cfg.seed, self.rank, self.world_size)
        self._make_optimizer(model)
        self.loss_fn = GRPOLoss(cfg.loss, temperature=cfg.temperature, head=self.lm_head)
        self._optimizer_steps = 0  # optimiser steps taken; the generator holds the weights of _pushed_at
        self._pushed_at: int | None = None  # None: never pushed (the engine may hold other weights)
        self.callback = callback
        self._reward_errors_logged: set[str] = set()  # reward functions whose first traceback is logged
        self._pending = None  # async_generation: the background round (a Future) and its thread pool
        if cfg.async_generation:
            import copy
            from concurrent.futures import ThreadPoolExecutor

            from tdrl.core.threads import thread_initializer

            snapshot = copy.deepcopy(unwrap_model(model)).eval().requires_grad_(False)
            self._async_generator = HFGenerator(snapshot, tokenizer, cfg.max_new_tokens, cfg.temperature, cfg.top_p,
                                                cfg.top_k, share_prefix=self.lm_head.share_prefix)
            self._async_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tdrl-grpo-gen",
                                                  initializer=thread_initializer())
        torch.manual_seed(cfg.seed + self.rank)
        self._open_run(run, loggers)

    # ----------------------------------------------------------------------------- rollout
    @torch.no_grad()
    def rollout(self, batch: dict[str, list], generator: Generator | None = None) -> tuple[TensorDict, dict[str, float]]:
        """Generate ``group_size`` completions per prompt and score them.

        Args:
            batch: dataset columns, each a list of ``prompts_per_step`` values.
            generator: what generates (default ``self.generator``).

        Returns:
            ``(td, stats)``: the rollout TensorDict ``[prompts_per_step * group_size]`` and
            reward statistics.
        """
        cfg = self.config
        G = cfg.group_size
        prompts = [p for p in batch["prompt"] for _ in range(G)]
        columns = {k: [v for v in vals for _ in range(G)] for k, vals in batch.items() if k != "prompt"}
        tool, tool_stats = self.tool, None
        if self.environment_factory is not None:  # one environment per completion, reset on its row
            envs, shown = start_environments(self.environment_factory, prompts, columns)
            tool = [EnvironmentTool(e, cfg.tool_timeout) for e in envs]
            ids, mask = tokenize_prompts(self.tokenizer, self._render(shown, tool[0]), self.device)
        else:  # tokenise each prompt once, then repeat its row for the group
            ids, mask = tokenize_prompts(self.tokenizer, self._render(batch["prompt"], tool), self.device)
            ids, mask = ids.repeat_interleave(G, dim=0), mask.repeat_interleave(G, dim=0)
        if generator is None or generator is self.generator:
            self.sync_generator()
        if tool is None:
            gen = (generator or self.generator).generate(ids, mask)
            texts = completion_texts(self.tokenizer, gen[K.COMPLETION_IDS], gen[K.COMPLETION_MASK])
        else:
            res = tool_rollout(generator or self.generator, self.tokenizer, ids, mask, tool, cfg.max_turns,
                               workers=cfg.tool_workers)
            gen, texts, tool_stats = res.td, res.final_turns, res.stats
            columns["conversation"] = res.conversations
            if self.environment_factory is not None:
                columns.update(environments=envs, turns=res.turns)
        rewards, per_fn, stats = compute_rewards(
            self.reward_fns, prompts, texts, columns, cfg.reward_weights, timeout=cfg.reward_timeout,
            on_error=cfg.on_reward_error, logged=self._reward_errors_logged,
        )
        n = len(prompts)
        td = TensorDict(
            {
                K.PROMPT_IDS: ids,
                K.PROMPT_MASK: mask,
                **gen.to_dict(),
                K.REWARD: rewards.to(self.device),
                K.GROUP_ID: torch.arange(n, device=self.device) // G,
                K.ADVANTAGE: group_advantages(rewards, G, scale=cfg.loss.scale_rewards).to(self.device),
            },
            batch_size=[n],
            device=self.device,
        )
        r = rewards.reshape(-1, G)
        stats.update(
            reward=rewards.mean().item(),
            # the first reward function is taken as the verifier: a score >= 1 is a correct answer
            accuracy=(per_fn[:, 0] >= 1.0).float().mean().item() if per_fn.shape[1] else 0.0,
            reward_std=r.std(dim=1).mean().item(),
            frac_zero_std=(r.max(1).values == r.min(1).values).float().mean().item(),
            completion_len=gen[K.COMPLETION_MASK].sum(-1).float().mean().item(),
        )
        if tool_stats is not None:
            stats.update(tool_stats.as_metrics(), turns=sum(t.from_policy for c in res.turns for t in c) / max(1, n))
            self.last_conversations = res.conversations
        self.last_completions = texts
        # the round as TRL's log_completions shows it: one entry per completion
        self.last_round = {"prompt": prompts, "completion": texts, "reward": rewards.tolist(),
                           "rewards": per_fn.tolist()}
        return td, stats

    def _render(self, prompts, tool) -> list[str]:
        """Prompts as text, showing the function tools' schemas (:func:`tdrl.llm.data.render_prompts`)."""
        schemas = getattr(tool, "schemas", None) if self.config.show_tool_schemas else None
        return render_prompts(self.tokenizer, prompts, tools=schemas, tools_text=tools_prompt_text(schemas) if schemas else "")

    @torch.no_grad()
    def _add_logprobs(self, td: TensorDict) -> None:
        cfg, mb = self.config, self._micro_size()
        n_updates = cfg.epochs * (cfg.rollout_size // (cfg.minibatch_size or cfg.rollout_size))
        need_old = n_updates > 1 or cfg.loss.tis_cap is not None
        need_ref = cfg.loss.beta > 0
        if not (need_old or need_ref):
            return
        olds, refs = [], []
        for chunk in td.split(mb):
            if need_old:
                olds.append(self._logprobs(self.model, chunk))
            if need_ref:
                ctx = unwrap_model(self.model).disable_adapter() if self.ref_model is None else nullcontext()
                with ctx:
                    ref = self.ref_model if self.ref_model is not None else self.model
                    refs.append(self._logprobs(ref, chunk))
        if need_old:
            td[K.OLD_LOG_PROB] = torch.cat(olds)
        if need_ref:
            td[K.REF_LOG_PROB] = torch.cat(refs)

    def _logprobs(self, model, td: TensorDict) -> torch.Tensor:
        return self.lm_head.logprobs(model, td, self.config.temperature)

    def _choose_head(self, model) -> LMHead:
        """The LM-head path, settled once before training from the plain config: ``None``
        settings are checked on a probe batch (:meth:`LMHead.choose`); FSDP takes the plain path
        (the fused kernels read the head's weight outside the forward: a shard under FSDP)."""
        cfg = self.config
        if cfg.fsdp:
            return LMHead(fused=False, share_prefix=False, fused_loss=False)

        def loss_matches(head: LMHead, model, td: TensorDict) -> bool:
            loss = GRPOLoss(cfg.loss, temperature=cfg.temperature, head=head)
            if not loss.uses_fused_loss:
                return True  # the setting has no effect for this loss: keep the default
            td = td.clone(recurse=False)  # advantages of both signs, so that some ratios clip
            td.set(K.ADVANTAGE, torch.linspace(-1.0, 1.0, td.shape[0], device=td.device))
            with torch.enable_grad():
                return loss.fused_loss_matches(model, td)

        return LMHead.choose(model, cfg.fused_logprobs, cfg.share_prefix, cfg.fused_loss, loss_matches)

    def _micro_size(self) -> int:
        cfg = self.config
        return (cfg.minibatch_size or cfg.rollout_size) // cfg.grad_accum

    # ----------------------------------------------------------------------------- update
    def step(self) -> dict[str, float]:
        """One generation round and its updates. Returns the round's metrics."""
        cfg = self.config
        t0 = time.perf_counter()
        td, stats = self._next_rollout()
        t_gen = time.perf_counter() - t0
        self._add_logprobs(td)
        mb_size = cfg.minibatch_size or cfg.rollout_size
        micro = self._micro_size()
        sums: dict[str, torch.Tensor] = {}  # detached tensors: no host sync inside the loop
        n_micro = 0
        self.ddp_model.train()
        for _ in range(cfg.epochs):
            perm = torch.randperm(td.shape[0], device=self.device)
            for mb in td[perm].split(mb_size):
                chunks = self.accumulate(mb, micro, sums)
                n_micro += len(chunks)
                gn = self._clip_grad_norm()
                gn = gn.detach().float() * len(chunks)
                sums["grad_norm"] = sums["grad_norm"] + gn if "grad_norm" in sums else gn
                self.optimizer.step()
                self._optimizer_steps += 1
        # drop the gradients (as large as the weights) now rather than at the next minibatch:
        # the next round's generation and forward run without them (peak RSS between steps)
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        self.step_count += 1
        dt = time.perf_counter() - t0
        n_tokens = int(td[K.COMPLETION_MASK].sum()) + int(td[K.PROMPT_MASK].sum())
        values = torch.stack(list(sums.values())).div(max(1, n_micro)).tolist() if sums else []
        metrics = dict(zip(sums, values))
        metrics.update(stats)
        metrics.update(step_time=dt, gen_time=t_gen, tokens_per_s=n_tokens / dt, lr=self.scheduler.get_last_lr()[0])
        metrics = all_reduce_mean(metrics)
        self._record(metrics)
        metrics["step"] = float(self.step_count)
        if self.callback is not None:
            self.callback(self, metrics)
        return metrics

    def accumulate(self, mb: TensorDict, micro: int, sums: dict[str, torch.Tensor] | None = None) -> tuple[TensorDict, ...]:
        """Zero the gradients and backpropagate one minibatch's loss in micro-batches of ``micro``
        rows. Chunk ``j`` is weighted by :func:`~tdrl.llm.losses.micro_batch_weights`, so the
        gradient equals the whole minibatch's for every reduction (DAPO's token mean included,
        over the minibatches of all ranks under data parallelism unless
        ``loss.token_mean_over_ranks`` is off).
        Adds each chunk's detached outputs into ``sums``; returns the chunks."""
        self.optimizer.zero_grad(set_to_none=True)
        chunks = mb.split(micro)
        masks, loss_cfg = [c[K.COMPLETION_MASK] for c in chunks], self.config.loss
        all_tokens = None
        if loss_cfg.reduction == "token" and loss_cfg.token_mean_over_ranks and self.world_size > 1:
            all_tokens = all_reduce_sum(float(mb[K.COMPLETION_MASK].sum()))
        weights = micro_batch_weights(masks, loss_cfg.reduction, self.world_size, all_tokens).tolist()
        for j, (chunk, w) in enumerate(zip(chunks, weights)):
            with self._micro_batch(j, len(chunks)):
                out = self.loss_fn(self.ddp_model, chunk)
                loss = total_loss(out)
                (loss * w).backward()
            if sums is not None:
                for k, v in out.items():
                    sums[k] = sums[k] + v.detach() if k in sums else v.detach().float()
        return chunks

    @torch.no_grad()
    def evaluate(self, eval_dataset=None, max_new_tokens: int | None = None) -> dict[str, float]:
        """Greedy completions of ``eval_dataset`` (default: the one given to the trainer) scored
        by each reward function (:func:`tdrl.llm.trainers.evaluate`), with the trainer's tools or
        ``environment_factory`` driving multi-turn conversations as in training.

        Returns:
            ``{"eval_<reward function name>": mean score}``.
        """
        from tdrl.llm.trainers.evaluate import evaluate

        dataset = self.eval_dataset if eval_dataset is None else eval_dataset
        if dataset is None:
            raise ValueError("GRPOTrainer.evaluate: no eval_dataset (pass one here or to GRPOTrainer(eval_dataset=...))")
        n = max_new_tokens or self.config.max_new_tokens
        cfg = self.config
        return {f"eval_{getattr(fn, '__name__', f'reward_{i}')}": evaluate(
                    self.model, self.tokenizer, dataset, fn, n, tool=self.tool,
                    max_turns=cfg.max_turns, tool_workers=cfg.tool_workers, reward_timeout=cfg.reward_timeout,
                    on_reward_error=cfg.on_reward_error, show_tool_schemas=cfg.show_tool_schemas,
                    environment_factory=self.environment_factory, tool_timeout=cfg.tool_timeout)
                for i, fn in enumerate(self.reward_fns)}

    def sync_generator(self) -> bool:
        """Push the trainer's weights to the generator (``Generator.update_weights``) when an
        optimiser step changed them since the last push, or when it never had them (a fresh or
        resumed trainer). Called before each round's generation; returns whether it pushed."""
        if self._pushed_at == self._optimizer_steps:
            return False
        self.generator.update_weights(self.model)
        self._pushed_at = self._optimizer_steps
        return True

    def _next_rollout(self) -> tuple[TensorDict, dict[str, float]]:
        """This round's rollout; with ``async_generation``, the one generated in the background
        during the previous round (the first round generates in the foreground), after starting
        the next one with a snapshot of the current weights."""
        if not self.config.async_generation:
            return self.rollout(next(self.sampler))
        if self._pending is None:
            td, stats = self.rollout(next(self.sampler), self._async_generator)
        else:
            td, stats = self._pending.result()
        snapshot = self._async_generator.model
        with torch.no_grad():
            for dst, src in zip(snapshot.parameters(), unwrap_model(self.model).parameters(), strict=True):
                dst.copy_(src)
        self._pending = self._async_pool.submit(self.rollout, next(self.sampler), self._async_generator)
        return td, stats

    def _progress_fields(self, m: dict[str, float]) -> dict:
        return dict(reward=m["reward"], acc=m["accuracy"], kl=m.get("kl", 0.0), clip=m.get("clip_frac", 0.0),
                    tok_s=round(m["tokens_per_s"]))

    def _end_training(self) -> None:
        if self._pending is not None:  # the round generated for a step that will not run
            self._pending.result()
            self._pending = None



def _is_peft(model) -> bool:
    return hasattr(unwrap_model(model), "disable_adapter")
