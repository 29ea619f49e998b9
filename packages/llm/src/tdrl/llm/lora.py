"""LoRA adapters through ``peft`` (optional dependency)."""

from __future__ import annotations

from collections.abc import Sequence

from tdrl.llm._optional import require

__all__ = ["apply_lora", "merged_state_dict"]


def _require_peft():
    require("peft", extra="peft", what="LoRA (apply_lora)")


def apply_lora(model, r: int = 8, alpha: int = 16, dropout: float = 0.0, target_modules: Sequence[str] | str | None = "all-linear"):
    """Wrap a causal LM with LoRA adapters; only the adapters stay trainable.

    Args:
        model: a ``transformers`` causal LM.
        r: adapter rank.
        alpha: scaling numerator (``alpha / r``).
        dropout: adapter dropout.
        target_modules: module names to adapt; ``"all-linear"`` (default) adapts every linear
            layer except the LM head.

    Returns:
        A ``peft.PeftModel``.
    """
    _require_peft()
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=target_modules, task_type="CAUSAL_LM")
    return get_peft_model(model, cfg)


def merged_state_dict(model) -> dict:
    """The state dict a plain (adapter-free) model would have: adapters merged in.

    For a non-peft model this is ``model.state_dict()``. Used to push weights to inference
    engines that know nothing about LoRA.
    """
    if not hasattr(model, "merge_adapter"):
        return model.state_dict()
    model.merge_adapter()
    try:
        out = {}
        for k, v in model.state_dict().items():
            if "lora_" in k:
                continue
            k = k.removeprefix("base_model.model.").replace(".base_layer.", ".")
            out[k] = v.detach().clone()
    finally:
        model.unmerge_adapter()
    return out
