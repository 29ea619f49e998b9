"""A reward model as a reward function: a sequence-classification model scores prompt + completion.

TRL's ``reward_funcs`` takes a model id / path or a model beside plain functions; so does the GRPO
trainer (``reward_fns=["path/to/rm"]``) and the app (``reward=path/to/rm``). :class:`RewardModel`
scores each (prompt, completion) pair with the model's first logit: chat prompts (message lists)
go through the reward tokenizer's chat template with the completion as the assistant's message,
plain prompts are joined to their completion as text. Scoring runs batched, without gradients,
on the device the trainer gives (:meth:`RewardModel.to`), and in the trainer's thread (it is
marked :func:`thread_safe_reward`: a model does not belong in a forked worker).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

__all__ = ["RewardModel", "is_reward_model", "reward_functions"]


def is_reward_model(obj) -> bool:
    """Whether ``obj`` names or is a reward model: a folder, or a ``torch`` module with a ``config``."""
    return (isinstance(obj, (str, os.PathLike)) and os.path.isdir(obj)) or (
        isinstance(obj, torch.nn.Module) and hasattr(obj, "config"))


class RewardModel:
    """Score completions with a sequence-classification model (``num_labels`` 1: its logit).

    Args:
        model: a local folder holding an ``AutoModelForSequenceClassification`` and its tokenizer,
            or such a model.
        tokenizer: its tokenizer (default: loaded from the folder).
        batch_size: pairs per forward pass.
        device: where it runs (the trainer moves it to the policy's device).

    Raises:
        ValueError: the folder does not hold a sequence-classification model (named, with what it holds).
    """

    reward_in_thread = True  # scored in the trainer's thread (thread_safe_reward): a model is not forked

    def __init__(self, model, tokenizer=None, batch_size: int = 16, device: torch.device | str | None = None):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        name = os.fspath(model) if isinstance(model, (str, os.PathLike)) else type(model).__name__
        if isinstance(model, (str, os.PathLike)):
            if not os.path.isfile(os.path.join(model, "config.json")):
                raise ValueError(f"reward model {name!r}: no config.json there; expected a folder written by "
                                 "save_pretrained of an AutoModelForSequenceClassification")
            try:
                model_obj = AutoModelForSequenceClassification.from_pretrained(model)
            except Exception as exc:
                raise ValueError(f"reward model {name!r} does not load as AutoModelForSequenceClassification: "
                                 f"{type(exc).__name__}: {exc}") from exc
            tokenizer = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(model)
            model = model_obj
        if tokenizer is None:
            raise ValueError(f"reward model {name}: a tokenizer is needed (TRL: reward_processing_classes=)")
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        if getattr(model.config, "pad_token_id", None) is None:
            model.config.pad_token_id = tokenizer.pad_token_id  # the model finds each row's last token by it
        self.model = model.eval().requires_grad_(False)
        self.tokenizer, self.batch_size = tokenizer, batch_size
        self.__name__ = "reward_model_" + os.path.basename(name.rstrip("/"))
        if device is not None:
            self.to(device)

    def to(self, device) -> RewardModel:
        self.model.to(device)
        return self

    def texts(self, prompts: Sequence, completions: Sequence) -> list[str]:
        """The scored texts: chat template of prompt + assistant message, or prompt + completion."""
        out = []
        for p, c in zip(prompts, completions, strict=True):
            c = c[-1]["content"] if isinstance(c, list) else c  # TRL's message-list completions
            if isinstance(p, str):
                out.append(p + c)
            else:
                out.append(self.tokenizer.apply_chat_template([*p, {"role": "assistant", "content": c}], tokenize=False))
        return out

    @torch.no_grad()
    def __call__(self, prompts, completions, **_) -> list[float]:
        texts = self.texts(prompts, completions)
        device = next(self.model.parameters()).device
        scores: list[float] = []
        for i in range(0, len(texts), self.batch_size):
            # right padding: each row keeps the positions it has alone (the model reads its last real token)
            enc = self.tokenizer(texts[i:i + self.batch_size], return_tensors="pt", padding=True, padding_side="right",
                                 add_special_tokens=False).to(device)
            scores += self.model(**enc).logits[:, 0].float().tolist()
        return scores


def reward_functions(items: Sequence, tokenizers: Sequence | None = None, device=None) -> list:
    """The trainer's reward functions: functions as they are, reward models (:func:`is_reward_model`)
    as :class:`RewardModel` s on ``device``; ``tokenizers`` (TRL's ``reward_processing_classes``)
    one per item, ``None`` where not a model."""
    tokenizers = list(tokenizers) if tokenizers is not None else [None] * len(items)
    if len(tokenizers) != len(items):
        raise ValueError(f"reward_processing_classes: {len(tokenizers)} for {len(items)} reward functions; give one per "
                         "function (None for a plain function)")
    out = []
    for fn, tok in zip(items, tokenizers):
        if is_reward_model(fn):
            out.append(RewardModel(fn, tok, device=device))
        elif isinstance(fn, RewardModel):
            out.append(fn.to(device) if device is not None else fn)
        elif callable(fn):
            out.append(fn)
        else:
            raise ValueError(f"reward function {fn!r}: expected a callable (completions, **kwargs) -> list[float], a "
                             "reward model folder, or an AutoModelForSequenceClassification")
    return out
