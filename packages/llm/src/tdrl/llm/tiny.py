"""The embedded default model: a tiny causal LM built from a config, and a local tokenizer.

Nothing is downloaded. The tokenizer is a byte-pair encoding trained with ``tokenizers`` on a
corpus the caller provides (digits are split one per token so arithmetic stays learnable);
the model is a randomly initialised Qwen2 or Llama. Both are saved to a folder and reloaded
with ``from_pretrained``, the same path any local Hugging Face model takes.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator

__all__ = ["train_tokenizer", "build_tiny_model", "make_tiny_lm", "load_model_and_tokenizer"]

SPECIAL_TOKENS = {"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}


def train_tokenizer(texts: Iterable[str], vocab_size: int = 64):
    """Train a small BPE tokenizer (individual digits, whitespace-split words).

    Args:
        texts: the training corpus.
        vocab_size: target vocabulary size (special tokens included).

    Returns:
        A ``transformers.PreTrainedTokenizerFast`` with pad/bos/eos/unk tokens, left padding.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=SPECIAL_TOKENS["unk_token"]))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS.values()),
        show_progress=False,
    )
    tok.train_from_iterator(list(texts), trainer=trainer)
    # padding_side must go to the constructor to be saved (see PITFALLS.md).
    return PreTrainedTokenizerFast(tokenizer_object=tok, padding_side="left", **SPECIAL_TOKENS)


def build_tiny_model(
    tokenizer,
    arch: str = "qwen2",
    hidden_size: int = 128,
    num_layers: int = 3,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 384,
    max_position_embeddings: int = 128,
    seed: int = 0,
):
    """A randomly initialised causal LM sized for a CPU.

    Args:
        tokenizer: supplies the vocabulary size and special token ids.
        arch: ``"qwen2"`` or ``"llama"``.
        hidden_size, num_layers, num_heads, num_kv_heads, intermediate_size,
        max_position_embeddings: the transformer's shape.
        seed: initialisation seed.

    Returns:
        A ``transformers`` causal LM (``Qwen2ForCausalLM`` or ``LlamaForCausalLM``).
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    archs = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM)}
    if arch not in archs:
        raise ValueError(f"build_tiny_model: arch must be one of {sorted(archs)}, got {arch!r}")
    config_cls, model_cls = archs[arch]
    config = config_cls(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_cls(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def load_model_and_tokenizer(path: str | os.PathLike, dtype=None):
    """Load a local causal LM and its tokenizer with ``from_pretrained``.

    A tokenizer trained with ``tokenizers`` is loaded with ``PreTrainedTokenizerFast`` (``AutoTokenizer``
    may pick an architecture-specific class that tokenises differently, see PITFALLS.md); any
    other tokenizer goes through ``AutoTokenizer``. A missing pad token falls back to EOS.

    Args:
        path: a local folder holding ``config.json``, weights and tokenizer files.
        dtype: optional torch dtype for the weights.

    Returns:
        ``(model, tokenizer)``.
    """
    import json

    from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

    path = os.fspath(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"load_model_and_tokenizer: {path!r} is not a local model folder")
    tok_cfg_path = os.path.join(path, "tokenizer_config.json")
    tok_cfg = {}
    if os.path.exists(tok_cfg_path):
        with open(tok_cfg_path) as f:
            tok_cfg = json.load(f)
    # transformers 5 saves a plain `tokenizers` tokenizer as "TokenizersBackend", 4.x as
    # "PreTrainedTokenizerFast"
    if tok_cfg.get("tokenizer_class") in ("PreTrainedTokenizerFast", "TokenizersBackend"):
        tokenizer = PreTrainedTokenizerFast.from_pretrained(path)
    else:
        tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    kwargs = {"dtype": dtype} if dtype is not None else {}
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def make_tiny_lm(folder: str | os.PathLike, corpus: Iterable[str], arch: str = "qwen2", vocab_size: int = 64, seed: int = 0, **model_kwargs):
    """Train a tokenizer, build a tiny model, save both to ``folder`` and reload them.

    Args:
        folder: output folder (created).
        corpus: texts to train the tokenizer on.
        arch: ``"qwen2"`` or ``"llama"``.
        vocab_size: tokenizer vocabulary size.
        seed: model initialisation seed.
        **model_kwargs: forwarded to :func:`build_tiny_model`.

    Returns:
        ``(model, tokenizer)`` as reloaded from ``folder``.
    """
    folder = os.fspath(folder)
    os.makedirs(folder, exist_ok=True)
    tokenizer = train_tokenizer(corpus, vocab_size=vocab_size)
    model = build_tiny_model(tokenizer, arch=arch, seed=seed, **model_kwargs)
    with no_hf_progress():  # no "Writing model shards" / "Loading weights" bars for a tiny model
        tokenizer.save_pretrained(folder)
        model.save_pretrained(folder)
        return load_model_and_tokenizer(folder)


@contextlib.contextmanager
def no_hf_progress() -> Iterator[None]:
    """Turn off ``transformers``' progress bars inside the block (restored after)."""
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    if shown:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if shown:
            hf_logging.enable_progress_bar()
