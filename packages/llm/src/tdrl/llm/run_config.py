"""What the LLM apps share in their config: where the model comes from (a local folder, a
registered name such as ``smollm2-135m-instruct``, or the tiny embedded model built from a
config), LoRA, the device, gradient checkpointing, and building the model once per job (rank 0
first under ``torchrun`` / ``accelerate launch``)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

from tdrl.core.train import ConfigError, RunConfig, check_device, main_process_first
from tdrl.llm.lora import apply_lora
from tdrl.llm.models import check_model_source, load_model_and_tokenizer
from tdrl.llm.tiny import make_tiny_lm

__all__ = ["LMRunConfig"]


@dataclass
class LMRunConfig(RunConfig):
    """A run that fine-tunes a causal LM."""

    model: str = ""
    """Local Hugging Face causal LM folder or a registered name (smollm2-135m-instruct); empty:
    build the tiny embedded model."""
    arch: str = "qwen2"
    """Tiny model architecture: qwen2 or llama."""
    hidden_size: int = 96
    """Tiny model hidden size."""
    num_layers: int = 2
    """Tiny model layers."""
    vocab_size: int = 64
    """Tiny model: the tokenizer's vocabulary (special tokens included), trained on the task's texts."""
    lora: bool = False
    """Train LoRA adapters instead of all weights."""
    lora_rank: int = 8
    """LoRA rank (alpha = 2 x rank)."""
    device: str = "cpu"
    """Device of the model: cpu, cuda (one GPU per rank under torchrun / accelerate launch:
    cuda:<LOCAL_RANK>) or cuda:<i>."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward pass: less memory for the
    update, more time (TRL turns it on by default; tdrl does not)."""
    fsdp: bool = False
    """Shard the model over the ranks with FSDP2 (fully_shard) instead of replicating it with DDP;
    needs torchrun with 2+ ranks (refused in one process). In the GRPO app the SFT warm-up
    stays DDP and GRPO shards the model."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_device(self)
        if self.arch not in ("qwen2", "llama"):
            raise ConfigError(f"{type(self).__name__}.arch={self.arch!r} is not allowed: expected 'qwen2' or 'llama'.")
        for name in ("hidden_size", "num_layers", "lora_rank", "vocab_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{type(self).__name__}.{name}={getattr(self, name)} is not allowed: "
                                  "expected an integer >= 1.")
        if self.fsdp and int(os.environ.get("WORLD_SIZE", "1")) < 2:
            raise ConfigError(f"{type(self).__name__}.fsdp=true needs 2 or more ranks (torchrun --nproc_per_node N); "
                              f"WORLD_SIZE={os.environ.get('WORLD_SIZE', '1')}: use fsdp=false in one process.")
        if self.device != "cpu" and not self.device.startswith("cuda"):
            raise ConfigError(f"{type(self).__name__}.device={self.device!r} is not allowed: expected 'cpu', 'cuda' "
                              "or 'cuda:<index>'.")
        if self.model:  # a local folder or a registered name, loadable here
            try:
                check_model_source(self.model)
            except (FileNotFoundError, ModuleNotFoundError) as exc:
                raise ConfigError(f"{type(self).__name__}.model={self.model!r}: {exc}") from None

    def build_model(self, corpus: Iterable[str]):
        """``(model, tokenizer)``: ``model`` loaded, or the tiny model trained on ``corpus``
        and saved in ``<out>/tiny_model`` (rank 0 builds it, the other ranks load it); LoRA
        adapters on top when asked."""
        if self.model:
            model, tokenizer = load_model_and_tokenizer(self.model)
        else:
            folder = os.path.join(self.out, "tiny_model")
            with main_process_first() as first:
                model, tokenizer = make_tiny_lm(
                    folder, corpus, arch=self.arch, vocab_size=self.vocab_size, seed=self.seed, hidden_size=self.hidden_size,
                    num_layers=self.num_layers, intermediate_size=3 * self.hidden_size,
                ) if first else load_model_and_tokenizer(folder)
        if self.lora:
            model = apply_lora(model, r=self.lora_rank, alpha=2 * self.lora_rank)
        return model.to(self.torch_device()), tokenizer

    def torch_device(self):
        """The ``torch.device`` of this rank: ``cuda`` means ``cuda:<LOCAL_RANK>`` (0 for one process)."""
        import torch

        if self.device == "cuda":
            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        return torch.device(self.device)
