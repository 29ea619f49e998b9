"""What :class:`GRPOTrainer` and :class:`SFTTrainer` share: their state for checkpoints, the
run they log and checkpoint through, and ``save_pretrained``.

With a :class:`tdrl.core.train.Run` (what the apps pass) the trainer's metrics are the run's
history (``<out>/metrics.csv``, TensorBoard / wandb as the run is configured), its checkpoints
are the run's (``<out>/checkpoints/step_<n>.pt``, every rank its own under data parallelism)
and a resumed run restores the trainer exactly. Without one, the config's ``log_dir`` and
``checkpoint_path`` (library use) do the same on their own.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from typing import Any

import torch

from tdrl.core.train import Logger, MetricHistory, ProgressBar, Run, rng_state, run_folder, save_checkpoint, set_rng_state
from tdrl.llm.generation import unwrap_model
from tdrl.llm.tiny import no_hf_progress
from tdrl.llm.trainers.common import (
    checkpoint_file,
    load_if_exists,
    make_optimizer,
    metric_history,
    tied_embedding_sparse_grad,
    warmup_cosine,
    wrap_ddp,
)
from tdrl.llm.trainers.sharding import (
    full_model_state,
    is_sharded,
    load_local_model,
    load_local_optimizer,
    local_state,
    no_grad_sync,
    plain,
    shard_model,
)

__all__ = ["TrainerBase", "TrainerSettings", "model_and_tokenizer"]

log = logging.getLogger(__name__)


def model_and_tokenizer(model, tokenizer, owner: str, peft_config=None):
    """``(model, tokenizer)`` for a trainer: a ``str`` / path ``model`` (a registered name such
    as ``"smollm2-135m-instruct"``, a local folder or a hub id, as TRL's trainers take) is loaded
    with :func:`tdrl.llm.models.load_model_and_tokenizer`; its tokenizer is used unless one is given.
    A ``peft_config`` (TRL's keyword, e.g. a ``peft.LoraConfig``) wraps the model with
    ``peft.get_peft_model``."""
    if tokenizer is not None and not hasattr(tokenizer, "decode"):
        raise TypeError(f"{owner}: the second positional argument is the tokenizer (tdrl's order: model, tokenizer, "
                        f"...), got {type(tokenizer).__name__}; with TRL's order pass keywords "
                        "(reward_funcs=, args=, train_dataset=, processing_class=)")
    if isinstance(model, (str, os.PathLike)):
        from tdrl.llm.models import load_model_and_tokenizer

        model, loaded = load_model_and_tokenizer(model)
        tokenizer = tokenizer if tokenizer is not None else loaded
    elif tokenizer is None:
        raise TypeError(f"{owner}: a tokenizer is needed when model is a model object (pass tokenizer= (TRL: "
                        "processing_class=), or a model name/path)")
    if peft_config is not None:
        from tdrl.llm._optional import require

        require("peft", extra="peft", what=f"{owner}(peft_config=...)")
        from peft import get_peft_model

        model = get_peft_model(model, peft_config)
    return model, tokenizer


@dataclass(kw_only=True)
class TrainerSettings:
    """The settings every LLM trainer's config has (:class:`~tdrl.llm.GRPOConfig` and
    :class:`~tdrl.llm.SFTConfig` extend it): how the model is held in memory, the seed, and the
    logging and checkpoints :class:`TrainerBase` reads. Keyword-only; a step is a GRPO round or
    an SFT optimiser step.

    Attributes:
        gradient_checkpointing: recompute each decoder layer's activations in the backward pass
            (:func:`tdrl.llm.trainers.common.set_gradient_checkpointing`): less memory, more time
            per update. Off by default (TRL's default is on); ``False`` leaves the model as it is.
        fsdp: shard the model over the ranks with FSDP2 (``fully_shard`` on each decoder layer,
            then the root; :mod:`tdrl.llm.trainers.sharding`) instead of replicating it with DDP:
            weights, gradients and AdamW state take ``1/world_size`` of the memory per rank, the
            update equals DDP's. Needs ``torch.distributed`` with 2+ ranks (refused otherwise);
            the loss then goes through the model's logits (the fused LM-head kernels read the
            head's weight outside the forward, where FSDP holds only a shard).
        seed: base seed: of the data order, and in GRPO of the sampling (rank ``r`` samples
            with ``seed + r``).
        checkpoint_path: file for resumable checkpoints (``None``: none).
        checkpoint_every: steps between checkpoints (GRPO: 50 rounds, SFT: 100 steps).
        log_dir: folder of the per-step metrics, ``<log_dir>/metrics.csv`` written by
            :class:`tdrl.core.train.CSVLogger` with ``hparams.json`` (``None``: in memory only).
        log_every: steps between metric rows (TRL's ``logging_steps``).
        progress: show a progress bar on rank 0.
    """

    gradient_checkpointing: bool = False
    fsdp: bool = False
    seed: int = 0
    checkpoint_path: str | None = None
    checkpoint_every: int = 100
    log_dir: str | None = None
    log_every: int = 1
    progress: bool = True


class TrainerBase:
    """State, logging and checkpoints of an LLM trainer (subclasses set ``model``,
    ``tokenizer``, ``optimizer``, ``scheduler``, ``sampler``, ``config``, ``rank``,
    ``world_size`` before calling :meth:`_open_run`)."""

    name = "trainer"
    progress_desc = "train"

    # ------------------------------------------------------------------ the update's mechanics
    def _wrap_model(self, model, owner: str):
        """The module the updates run through: ``model`` sharded with FSDP2 (``config.fsdp``;
        ``owner`` names the config in errors) or wrapped in DDP (``model`` itself on one rank)."""
        return shard_model(model, owner) if self.config.fsdp else wrap_ddp(model)

    def _make_optimizer(self, model) -> None:
        """``optimizer``: AdamW over ``model``'s trainable parameters (``config.lr``,
        ``weight_decay``); ``scheduler``: linear warm-up then cosine over ``config.steps``."""
        cfg = self.config
        self.optimizer = make_optimizer(model, cfg.lr, cfg.weight_decay)
        self.scheduler = warmup_cosine(self.optimizer, cfg.warmup_steps, cfg.steps)

    def _micro_batch(self, j: int, n: int) -> ExitStack:
        """The context of micro-batch ``j`` of the ``n`` accumulated into one optimiser step:
        gradients are synchronised over the ranks on the last one only, and a tied embedding's
        gradient is sparse on one rank without FSDP."""
        stack = ExitStack()
        if j < n - 1:
            stack.enter_context(no_grad_sync(self.ddp_model, self.world_size))
        stack.enter_context(tied_embedding_sparse_grad(self.model, self.world_size == 1 and not self.config.fsdp))
        return stack

    def _clip_grad_norm(self) -> torch.Tensor:
        """Clip the trainable parameters' gradients to ``config.max_grad_norm``; returns their
        norm before clipping (a plain tensor under FSDP too)."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        return plain(torch.nn.utils.clip_grad_norm_(params, self.config.max_grad_norm))

    def _open_run(self, run: Run | None, loggers: Sequence[Logger]) -> None:
        """Attach the run (restoring the trainer when it resumes) or the config's own log
        folder and checkpoint file."""
        self.run = run
        self.step_count = 0
        self.metrics = MetricHistory()
        if run is not None:
            run.start(trainer=self)
            self.metrics = run.history
            self.metrics.loggers.extend(loggers if run.main else [])
            return
        self.maybe_resume()
        # the rows restored by a resume move into the history that also feeds the loggers
        rows = self.metrics.rows
        if self.config.log_dir is not None and self.step_count == 0 and self.rank == 0:
            # a fresh run never overwrites an earlier run's metrics.csv: it goes to <log_dir>-<k> (with a warning)
            self.config.log_dir = str(run_folder(self.config.log_dir, resume=False)[0])
        self.metrics = metric_history(self.config.log_dir, self.step_count, self.rank, loggers, asdict(self.config))
        self.metrics.rows = rows

    def _record(self, metrics: Mapping[str, float]) -> None:
        """Log one step's metrics (every ``config.log_every`` steps) and checkpoint when due."""
        due = self.step_count % self.config.log_every == 0
        if self.run is not None:
            if due:
                self.run.log(self.step_count, metrics)
            self.run.maybe_checkpoint(self.step_count, trainer=self)
            return
        if due:
            self.metrics.log(metrics, self.step_count)
        cfg = self.config
        if cfg.checkpoint_path and self.step_count % cfg.checkpoint_every == 0:
            self.save_checkpoint()

    def train(self, steps: int | None = None) -> list[dict[str, float]]:
        """Run steps (GRPO rounds, SFT optimiser steps) until ``steps`` (default
        ``config.steps``) have been done in total; returns each step's metrics."""
        steps = self.config.steps if steps is None else steps
        history = []
        with ProgressBar(total=steps, desc=self.progress_desc, disable=not self._own_progress,
                         initial=self.step_count) as bar:
            while self.step_count < steps:
                m = self.step()
                history.append(m)
                bar.update(1, **self._progress_fields(m))
        self._end_training()
        self._final_checkpoint()
        return history

    def _progress_fields(self, metrics: dict[str, float]) -> dict:
        """What the progress bar shows of one step's metrics."""
        return {}

    def _end_training(self) -> None:
        """Called when :meth:`train` has done its steps, before the final checkpoint."""

    def _final_checkpoint(self) -> None:
        if self.run is not None:
            self.run.checkpoint(self.step_count, trainer=self)
        elif self.config.checkpoint_path:
            self.save_checkpoint()

    @property
    def _own_progress(self) -> bool:
        """Whether the trainer draws its own progress bar (the run has one otherwise)."""
        return self.run is None and self.config.progress and self.rank == 0

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        """Everything needed to continue exactly: weights (adapters included), optimiser,
        schedule, data order, step, RNG states and the metric rows. Under FSDP the weights and
        optimiser moments are this rank's local shards (:mod:`tdrl.llm.trainers.sharding`)."""
        sharded = is_sharded(self.model)
        model_state = unwrap_model(self.model).state_dict()
        return {
            "model": local_state(model_state) if sharded else model_state,
            "optimizer": local_state(self.optimizer.state_dict()) if sharded else self.optimizer.state_dict(),
            "sharded_world_size": self.world_size if sharded else 0,
            "scheduler": self.scheduler.state_dict(),
            "sampler": self.sampler.state_dict(),
            "step": self.step_count,
            "rng": rng_state(),
            "metrics": self.metrics.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        saved_shards = int(state.get("sharded_world_size", 0))
        sharded = is_sharded(self.model)
        if saved_shards != (self.world_size if sharded else 0):
            raise ValueError(f"{type(self).__name__}: the checkpoint holds "
                             + (f"weights sharded over {saved_shards} ranks" if saved_shards else "unsharded weights")
                             + "; this trainer " + (f"shards over {self.world_size} ranks" if sharded else "is unsharded")
                             + " (resume with the same fsdp setting and number of ranks)")
        if sharded:
            load_local_model(self.model, state["model"])
            load_local_optimizer(self.optimizer, state["optimizer"])
        else:
            unwrap_model(self.model).load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.sampler.load_state_dict(state["sampler"])
        self.step_count = int(state["step"])
        set_rng_state(state["rng"])
        self.metrics.load_state_dict(state["metrics"])

    def save_checkpoint(self, path: str | None = None) -> None:
        """Save :meth:`state_dict` to ``path`` (default ``config.checkpoint_path``; one file per
        rank under data parallelism)."""
        path = path or self.config.checkpoint_path
        if path is None:
            raise ValueError(f"{type(self).__name__}.save_checkpoint: no path given and config.checkpoint_path is None")
        save_checkpoint(checkpoint_file(path, self.rank, self.world_size), self.state_dict())

    def maybe_resume(self) -> bool:
        """Load ``config.checkpoint_path`` when it exists; returns whether it did."""
        path = self.config.checkpoint_path
        if path is None:
            return False
        state = load_if_exists(checkpoint_file(path, self.rank, self.world_size))
        if state is None:
            return False
        self.load_state_dict(state)
        log.info("resumed %s from %s at step %d", self.name, os.fspath(path), self.step_count)
        return True

    def save_pretrained(self, folder: str) -> None:
        """``save_pretrained`` of the model (adapters only for a peft model) and the tokenizer (rank 0;
        under FSDP every rank calls it: the whole weights are gathered to rank 0 first)."""
        full = full_model_state(self.model) if is_sharded(self.model) else None
        if self.rank == 0:
            with no_hf_progress():
                unwrap_model(self.model).save_pretrained(folder, **({"state_dict": full} if full is not None else {}))
                self.tokenizer.save_pretrained(folder)
