"""Supervised fine-tuning: masked CE on (prompt, completion) pairs, conversations or plain text,
optionally truncated to ``max_length`` and packed into full rows (:mod:`tdrl.llm.packing`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tdrl.llm import keys as K
from tdrl.llm.data import PromptSampler, completion_text, expand_conversations, render_prompts
from tdrl.llm.packing import Example, collate, pack_lengths, target_mask, tokenize_example, tokenize_text, truncate
from tdrl.llm.losses import SFTLoss
from tdrl.llm.trl_names import SFT_CONFIG_NAMES, SFT_TRAINER_NAMES, accept_trl_names
from tdrl.core.train import Logger, Run
from tdrl.llm.trainers.base import TrainerBase, TrainerSettings, model_and_tokenizer
from tdrl.llm.trainers.common import all_reduce_mean, check_int, check_update_settings, dist_info, set_gradient_checkpointing

__all__ = ["SFTConfig", "SFTTrainer"]

log = logging.getLogger(__name__)


@accept_trl_names(SFT_CONFIG_NAMES)
@dataclass
class SFTConfig(TrainerSettings):
    """Settings of :class:`SFTTrainer`.

    TRL's field names are accepted too (``max_steps=``, ``learning_rate=``,
    ``per_device_train_batch_size=``, ...), translated by :mod:`tdrl.llm.trl_names`.

    Attributes:
        steps: optimiser steps (``train()`` default).
        batch_size: examples per optimiser step per rank.
        grad_accum: micro-batches each step is split into.
        lr, weight_decay, warmup_steps, max_grad_norm: optimisation (cosine decay to 10%).
        completion_column: the dataset column holding targets (strings, or TRL's
            ``[{"role": "assistant", "content": ...}]``).
        messages_column: the column of whole conversations (TRL's conversational format), used
            when the dataset has no ``completion_column``: each assistant turn is one example,
            the loss on its tokens only (:func:`tdrl.llm.data.conversation_pairs`).
        text_column: the column of plain texts (TRL's ``dataset_text_field``), used when the
            dataset has neither of the above: language modelling, every token a target.
        max_length: tokens kept of each example (its first ``max_length``; TRL truncates the same
            way); with ``packing`` also the length of a packed row. ``None``: no truncation.
        packing: place the examples of each batch into rows of ``max_length`` tokens (1024 when
            ``max_length`` is ``None``, TRL's default) by best-fit decreasing, instead of one
            padded row each. No attention crosses examples (position ids restart, a
            block-diagonal causal mask), so the loss equals the unpacked one.
        completion_only_loss: with prompt + completion data, the loss on the completion only
            (default, as in TRL; ``None`` means ``True``); ``False``: on the prompt tokens too.
        assistant_only_loss: with conversations, the loss on the assistant turns only (default,
            TRL's default is ``False``); ``False``: the whole conversation rendered by the chat
            template is trained as text.
        fused_logprobs: compute the loss from the decoder's hidden states through the fused
            LM-head cross-entropy (:func:`tdrl.kernels.fused_linear_cross_entropy`); ``False``
            goes through the model's full logits.

    The model's memory, seed, logging and checkpoint settings are keyword-only fields shared
    with the other trainer: :class:`~tdrl.llm.trainers.base.TrainerSettings` (100 steps between checkpoints).
    """

    steps: int = 200
    batch_size: int = 32
    grad_accum: int = 1
    lr: float = 1e-3
    weight_decay: float = 0.0
    warmup_steps: int = 10
    max_grad_norm: float = 1.0
    completion_column: str = "completion"
    messages_column: str = "messages"
    text_column: str = "text"
    max_length: int | None = None
    packing: bool = False
    completion_only_loss: bool = True
    assistant_only_loss: bool = True
    fused_logprobs: bool = True

    def __post_init__(self):
        """Check every setting before any model work; errors name the field, the value and the range."""
        own = "SFTConfig"
        check_update_settings(own, self)
        check_int(own, "batch_size", self.batch_size, 1)
        if self.completion_only_loss is None:  # TRL's None: on for prompt-completion data
            self.completion_only_loss = True
        if self.max_length is not None:
            check_int(own, "max_length", self.max_length, 2)
        if self.batch_size % self.grad_accum:
            raise ValueError(f"SFTConfig: batch_size={self.batch_size} must be divisible by grad_accum={self.grad_accum}")


@accept_trl_names(SFT_TRAINER_NAMES)
class SFTTrainer(TrainerBase):
    """Supervised fine-tuning of a causal LM; loss only on completion tokens (+ EOS).

    TRL's keywords work too: ``SFTTrainer(model=..., args=SFTConfig(...), train_dataset=...,
    eval_dataset=..., processing_class=..., peft_config=...)`` (:mod:`tdrl.llm.trl_names`).

    Args:
        model: a ``transformers`` causal LM (optionally peft), or a name / path to load (a
            registered name such as ``"smollm2-135m-instruct"``, a local folder or a hub id).
        tokenizer: its tokenizer; optional when ``model`` is a name / path.
        train_dataset: rows with ``"prompt"`` and ``config.completion_column``, whole
            conversations in ``config.messages_column``, or plain texts in ``config.text_column``.
        config: an :class:`SFTConfig`.
        loggers: extra :class:`tdrl.core.train.Logger` s (TensorBoard, wandb) fed on rank 0.
        run: a :class:`tdrl.core.train.Run` to log and checkpoint through (it restores the
            trainer when it resumes); ``None``: ``config.log_dir`` / ``config.checkpoint_path``.
        eval_dataset: rows like ``train_dataset``, whose loss :meth:`evaluate` returns.
        peft_config: a ``peft`` config (``LoraConfig``) the model is wrapped with (TRL's keyword).

    Attributes:
        metrics: a :class:`tdrl.core.train.MetricHistory` of one row per step.
    """

    progress_desc = "sft"

    def __init__(self, model, tokenizer=None, train_dataset=None, config: SFTConfig | None = None,
                 loggers: Sequence[Logger] = (), run: Run | None = None, eval_dataset=None, peft_config=None):
        self.config = cfg = config or SFTConfig()
        if train_dataset is None:
            raise TypeError("SFTTrainer: train_dataset is required")
        if not isinstance(cfg, SFTConfig):
            raise TypeError(f"SFTTrainer: config (TRL: args) must be an SFTConfig, got {type(cfg).__name__}")
        train_dataset = self._examples(train_dataset)
        self.eval_dataset = None if eval_dataset is None else self._examples(eval_dataset)
        model, tokenizer = model_and_tokenizer(model, tokenizer, "SFTTrainer", peft_config)
        self.rank, self.world_size = dist_info()
        self.model, self.tokenizer = model, tokenizer
        set_gradient_checkpointing(model, cfg.gradient_checkpointing)
        self.ddp_model = self._wrap_model(model, "SFTConfig")
        self.device = next(model.parameters()).device
        self.sampler = PromptSampler(train_dataset, cfg.batch_size, cfg.seed, self.rank, self.world_size)
        self._make_optimizer(model)
        self.loss_fn = SFTLoss(fused=cfg.fused_logprobs and not cfg.fsdp)
        self._open_run(run, loggers)

    def _examples(self, dataset):
        """``dataset`` with a completion column (conversations expanded into one example per
        assistant turn), whole conversations (``assistant_only_loss=False``) or a text column."""
        cfg, names = self.config, dataset.column_names
        if cfg.completion_column in names:
            if "prompt" not in names:
                raise KeyError(f"SFTTrainer: dataset has a {cfg.completion_column!r} column but no 'prompt' column; "
                               f"columns are {names}")
            return dataset
        if cfg.messages_column in names:
            if cfg.assistant_only_loss:
                return expand_conversations(dataset, cfg.messages_column, cfg.completion_column)
            return dataset
        if cfg.text_column in names:
            return dataset
        raise KeyError(f"SFTTrainer: dataset has no {cfg.completion_column!r} (with 'prompt'), {cfg.messages_column!r} "
                       f"or {cfg.text_column!r} column; columns are {names}. Name yours with completion_column=, "
                       "messages_column= or text_column= (TRL: dataset_text_field=)")

    def tokenize(self, rows: dict[str, list]) -> list[Example]:
        """A batch of dataset rows (a dict of columns) as ``(ids, loss_mask)`` examples, truncated
        to ``max_length``."""
        cfg, tok = self.config, self.tokenizer
        if cfg.completion_column in rows:
            prompts = render_prompts(tok, rows["prompt"])
            targets = [completion_text(c) for c in rows[cfg.completion_column]]
            examples = [tokenize_example(tok, p, c, cfg.completion_only_loss) for p, c in zip(prompts, targets)]
        elif cfg.messages_column in rows:
            if getattr(tok, "chat_template", None) is None:
                raise ValueError("SFTTrainer: assistant_only_loss=False trains whole conversations rendered by the chat "
                                 "template, and the tokenizer has none: set tokenizer.chat_template")
            texts = [tok.apply_chat_template(list(m), tokenize=False) for m in rows[cfg.messages_column]]
            examples = [tokenize_text(tok, t) for t in texts]
        else:
            examples = [tokenize_text(tok, t) for t in rows[cfg.text_column]]
        limit = cfg.max_length or (1024 if cfg.packing else None)
        return [truncate(e, limit) for e in examples]

    def batch(self, rows: dict[str, list]):
        """A batch of dataset rows as SFT rows (:func:`tdrl.llm.packing.collate`), packed with
        ``config.packing``."""
        cfg = self.config
        examples = self.tokenize(rows)
        layout = None
        if cfg.packing:
            layout = pack_lengths([len(e[0]) for e in examples], cfg.max_length or 1024)
        return collate(examples, self.tokenizer.pad_token_id, layout, self.device)

    @torch.no_grad()
    def evaluate(self, eval_dataset=None) -> dict[str, float]:
        """The token-mean completion loss of ``eval_dataset`` (default: the trainer's).

        Returns:
            ``{"eval_loss": ...}``.
        """
        cfg = self.config
        dataset = self.eval_dataset if eval_dataset is None else self._examples(eval_dataset)
        if dataset is None:
            raise ValueError("SFTTrainer.evaluate: no eval_dataset (pass one here or to SFTTrainer(eval_dataset=...))")
        self.ddp_model.eval()
        total, count = 0.0, 0.0
        for start in range(0, len(dataset), cfg.batch_size):
            td = self.batch(dataset[start : start + cfg.batch_size])
            n = float(target_mask(td).sum())
            total += float(self.loss_fn(self.ddp_model, td)["loss_sft"]) * n
            count += n
        return {"eval_loss": total / max(count, 1.0)}

    def step(self) -> dict[str, float]:
        """One optimiser step on one batch. Returns its metrics."""
        cfg = self.config
        t0 = time.perf_counter()
        td = self.batch(next(self.sampler))
        self.ddp_model.train()
        self.optimizer.zero_grad(set_to_none=True)
        chunks = td.split(-(-td.shape[0] // cfg.grad_accum))  # packed batches have fewer rows than examples
        targets = target_mask(td)
        n_tok = targets.sum().clamp(min=1)
        loss_sum = 0.0
        for j, chunk in enumerate(chunks):
            with self._micro_batch(j, len(chunks)):
                out = self.loss_fn(self.ddp_model, chunk)
                # weight by token count so accumulation equals one big token-mean
                w = target_mask(chunk).sum() / n_tok
                (out["loss_sft"] * w).backward()
            loss_sum += float(out["loss_sft"].detach()) * float(w)
        gn = self._clip_grad_norm()
        self.optimizer.step()
        self.scheduler.step()
        self.step_count += 1
        dt = time.perf_counter() - t0
        n_all = int((td[K.SEGMENT_IDS] > 0).sum())  # real tokens, padding not counted
        metrics = all_reduce_mean({"loss": loss_sum, "grad_norm": float(gn), "tokens_per_s": n_all / dt,
                                   "lr": self.scheduler.get_last_lr()[0], "fill": n_all / td[K.SEGMENT_IDS].numel()})
        self._record(metrics)
        metrics["step"] = float(self.step_count)
        return metrics

    def _progress_fields(self, m: dict[str, float]) -> dict:
        return dict(loss=m["loss"], tok_s=round(m["tokens_per_s"]))
