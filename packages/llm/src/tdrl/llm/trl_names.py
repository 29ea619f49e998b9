"""TRL's spellings of tdrl's settings: the one place where they are accepted.

A TRL user writes ``GRPOConfig(num_generations=8, learning_rate=1e-6, loss_type="dapo")`` and
``GRPOTrainer(model=..., reward_funcs=..., args=..., processing_class=...)``. Each TRL name
is one :class:`TRLName` row of a table below, with one of four kinds:

- ``"map"``: renamed to tdrl's field (``"loss.beta"`` is a field of ``GRPOConfig.loss``), its
  value converted where TRL's values differ (strings checked, the valid ones named);
  ``"combine"``: several TRL names make one tdrl field (TRL's batch sizes count completions
  per device and micro-step, tdrl's per round and per optimiser step);
- ``"same"``: the same name and meaning in both (listed for the README table only);
- ``"noop"``: accepted for the values that have no effect here (``use_vllm=False``,
  ``report_to="none"``), refused for the others with what to use instead;
- ``"refuse"``: a concept tdrl lacks or spells differently: refused, naming what to use.

No TRL name is ever ignored silently. :func:`accept_trl_names` wraps a config's or a
trainer's ``__init__`` so that it translates its keywords through a table; tdrl's own
names keep working, and giving both spellings of one setting is an error.
:func:`trl_table_markdown` renders the tables for ``packages/llm/README.md`` (a test checks
that the README holds exactly that text).
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields, is_dataclass, replace
from typing import Any

from tdrl.llm.advantages import scale_mode
from tdrl.llm.losses import TIS_MODES, GRPOLossConfig

__all__ = [
    "TRLName",
    "TRLTable",
    "GRPO_CONFIG_NAMES",
    "SFT_CONFIG_NAMES",
    "GRPO_TRAINER_NAMES",
    "SFT_TRAINER_NAMES",
    "LOSS_TYPES",
    "IMPORTANCE_SAMPLING_LEVELS",
    "accept_trl_names",
    "translate",
    "trl_table_markdown",
    "write_readme_table",
]

LOSS_TYPES = {"grpo": "sequence", "bnpo": "token", "dapo": "token", "dr_grpo": "constant"}
IMPORTANCE_SAMPLING_LEVELS = {"token": False, "sequence": True}


@dataclass(frozen=True)
class TRLName:
    """One TRL name and what it becomes in tdrl.

    Attributes:
        trl: TRL's field or keyword.
        kind: ``"map"``, ``"combine"``, ``"same"``, ``"noop"`` or ``"refuse"`` (see the module docstring).
        tdrl: tdrl's field (``"loss.x"``: a field of ``GRPOConfig.loss``); for ``"refuse"``,
            what to use instead, in words.
        convert: TRL's value -> tdrl's value; raises ``ValueError`` naming the valid values.
        accepts: for ``"noop"``: whether a value is one that has no effect here.
        note: how the two differ, or why a value is refused.
        defaults: ``(TRL's default, tdrl's default)`` when they differ, else ``None``.
    """

    trl: str
    kind: str
    tdrl: str = ""
    convert: Callable[[Any], Any] | None = None
    accepts: Callable[[Any], bool] | None = None
    note: str = ""
    defaults: tuple[str, str] | None = None


@dataclass(frozen=True)
class TRLTable:
    """The TRL names one class accepts, and a ``finish(out, given, defaults)`` step for the settings
    that combine several names (batch sizes, the loss options); ``defaults`` are the class's."""

    owner: str
    names: tuple[TRLName, ...]
    finish: Callable[[dict, dict, dict], None] | None = None
    rows: dict[str, TRLName] = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "rows", {n.trl: n for n in self.names})


# ----------------------------------------------------------------------------- value converters
def _choice(name: str, mapping: Mapping[str, Any], also: str = "") -> Callable[[Any], Any]:
    def convert(value):
        if isinstance(value, str) and value in mapping:
            return mapping[value]
        raise ValueError(f"{name}={value!r} is not supported: expected one of {sorted(mapping)}{also}")

    return convert


def _off(value) -> bool:
    return value is None or value is False


def _no_report(value) -> bool:
    return value in (None, "none", "None", [], (), ["none"])


# ----------------------------------------------------------------------------- shared rows
_REPORT_TO = TRLName("report_to", "noop", accepts=_no_report,
                     note="`None` / `\"none\"` accepted (tdrl writes only its own `metrics.csv`); other values refused: "
                          "pass `loggers=[TensorboardLogger(folder)]` or `[WandbLogger(...)]` (`tdrl.core.train`) to the trainer")
_BF16 = TRLName("bf16", "noop", accepts=_off, defaults=("True", "the model's dtype"),
                note="`False` accepted; `True` refused: tdrl trains in the model's own dtype, load the model as "
                     "bfloat16 (`model.to(torch.bfloat16)`) instead")
_FP16 = TRLName("fp16", "noop", accepts=_off, note="`False` accepted; `True` refused: load the model as float16 instead")
_PUSH = TRLName("push_to_hub", "noop", accepts=_off, note="`False` accepted; `True` refused: `trainer.save_pretrained(folder)`")
_WARMUP_RATIO = TRLName("warmup_ratio", "refuse", "`warmup_steps`", note="give the warm-up in optimiser steps")
_SCHEDULER = TRLName("lr_scheduler_type", "refuse", "nothing (one schedule)",
                     note="tdrl's schedule is a linear warm-up then a cosine decay to 10% of `lr`",
                     defaults=("\"linear\"", "warm-up + cosine to 10%"))
_EPOCHS = TRLName("num_train_epochs", "refuse", "`max_steps` / `steps`", note="tdrl's trainers count steps, not epochs")
_COMMON = (
    TRLName("output_dir", "map", "log_dir", note="the folder of `metrics.csv` and `hparams.json`; checkpoints go to "
                                                 "`checkpoint_path`, the model to `trainer.save_pretrained(folder)`"),
    TRLName("logging_steps", "map", "log_every", defaults=("10", "1"),
            note="in `GRPOConfig` divided like `max_steps` (tdrl counts rounds)"),
    TRLName("save_steps", "map", "checkpoint_every",
            note="checkpoints are written only when `checkpoint_path` is set; in `GRPOConfig` divided like `max_steps`"),
    TRLName("gradient_accumulation_steps", "map", "grad_accum"),
    TRLName("disable_tqdm", "map", "progress", convert=lambda v: not v, note="inverted: `progress = not disable_tqdm`"),
    TRLName("seed", "same", "seed"),
    TRLName("weight_decay", "same", "weight_decay"),
    TRLName("warmup_steps", "same", "warmup_steps"),
    TRLName("max_grad_norm", "same", "max_grad_norm"),
    TRLName("gradient_checkpointing", "same", "gradient_checkpointing", defaults=("True", "False")),
    _WARMUP_RATIO, _SCHEDULER, _EPOCHS, _REPORT_TO, _BF16, _FP16, _PUSH,
)


def _positive(name: str, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r}: expected an integer >= 1 (tdrl has no 'until the data runs out' run; -1 is refused)")
    return value


# ----------------------------------------------------------------------------- GRPOConfig
def _grpo_finish(out: dict, given: dict, defaults: dict) -> None:
    """Batch sizes (TRL counts completions per device and micro-step), ``max_steps`` (TRL counts
    optimiser steps, tdrl rounds) and the loss options."""
    pdb = given.get("per_device_train_batch_size")
    spg = given.get("steps_per_generation")
    gbs = given.get("generation_batch_size")
    ga = out.get("grad_accum", defaults["grad_accum"])
    group = out.get("group_size", defaults["group_size"])
    if spg is not None and gbs is not None:
        raise ValueError("GRPOConfig: give steps_per_generation or generation_batch_size, not both (as in TRL)")
    if pdb is not None:
        _positive("per_device_train_batch_size", pdb)
        out["minibatch_size"] = pdb * ga  # completions per optimiser step
        if gbs is None:
            gbs = pdb * (ga if spg is None else spg)
    elif spg is not None:
        raise ValueError("GRPOConfig: steps_per_generation needs per_device_train_batch_size (the completions of one step)")
    if gbs is not None:
        if gbs % group:
            raise ValueError(f"GRPOConfig: {gbs} completions per generation (per_device_train_batch_size x steps_per_generation"
                             f", or generation_batch_size) is not divisible by num_generations={group}")
        out["prompts_per_step"] = gbs // group
    counted = [(t, n) for t, n in (("steps", "max_steps"), ("log_every", "logging_steps"), ("checkpoint_every", "save_steps"))
               if t in given["_targets"]]  # TRL counts these in optimiser steps, tdrl in rounds
    if counted:
        rollout = out.get("prompts_per_step", defaults["prompts_per_step"]) * group
        per_round = out.get("epochs", defaults["epochs"]) * (rollout // (out.get("minibatch_size") or rollout))
        for target, name in counted:
            if out[target] % per_round:
                raise ValueError(f"GRPOConfig: {name}={out[target]} optimiser steps is not a whole number of generation "
                                 f"rounds of {per_round} optimiser steps (num_iterations x steps_per_generation / "
                                 "gradient_accumulation_steps): give a multiple of it")
            out[target] //= per_round
    loss_kw = {k[len("loss."):]: out.pop(k) for k in list(out) if k.startswith("loss.")}
    _importance_sampling(loss_kw, given)
    if "loss_type" in given:
        loss_kw["reduction"] = LOSS_TYPES[given["loss_type"]]
        if given["loss_type"] in ("dapo", "bnpo"):
            loss_kw["token_mean_over_ranks"] = given["loss_type"] == "dapo"
    if "loss.eps_low" in given.get("_targets", ()) and "eps_high" not in loss_kw:
        loss_kw["eps_high"] = loss_kw["eps_low"]  # TRL: epsilon_high defaults to epsilon
    if not loss_kw:
        return
    base = out.get("loss")
    if base is None:
        out["loss"] = GRPOLossConfig(**loss_kw)
    elif isinstance(base, str):
        out["loss"] = GRPOLossConfig.preset(base, **loss_kw)
    else:
        out["loss"] = base.update(**loss_kw)


def _importance_sampling(loss_kw: dict, given: dict) -> None:
    """TRL's vLLM importance-sampling names: any of them turns the correction on, with TRL's
    defaults (cap 3.0, ``"sequence_mask"``) for what is not given; ``..._correction=False`` with
    a cap or mode is refused (it would have no effect)."""
    names = ("vllm_importance_sampling_clip_max", "vllm_importance_sampling_cap", "vllm_importance_sampling_mode")
    on = given.get("vllm_importance_sampling_correction")
    rest = [n for n in names if n in given]
    if on is None and not rest:
        return
    if on is not None and not isinstance(on, bool):
        raise ValueError(f"GRPOConfig: vllm_importance_sampling_correction={on!r}: expected True or False")
    if on is False:
        if rest:
            raise ValueError(f"GRPOConfig: vllm_importance_sampling_correction=False turns the correction off; drop {rest}")
        return
    if "vllm_importance_sampling_clip_max" in given and "vllm_importance_sampling_cap" in given:
        raise ValueError("GRPOConfig: give vllm_importance_sampling_clip_max or vllm_importance_sampling_cap, not both")
    cap = given.get("vllm_importance_sampling_clip_max", given.get("vllm_importance_sampling_cap", 3.0))
    for key, value in (("tis_cap", cap), ("tis_mode", given.get("vllm_importance_sampling_mode", "sequence_mask"))):
        if key in loss_kw:
            raise ValueError(f"GRPOConfig: loss.{key} was given twice (tdrl's name and TRL's): give one")
        loss_kw[key] = value


GRPO_CONFIG_NAMES = TRLTable("GRPOConfig", (
    TRLName("num_generations", "map", "group_size"),
    TRLName("max_completion_length", "map", "max_new_tokens", defaults=("512", "32")),
    TRLName("learning_rate", "map", "lr", defaults=("1e-6", "1e-5")),
    TRLName("max_steps", "map", "steps", convert=lambda v: _positive("max_steps", v), defaults=("-1 (3 epochs)", "100"),
            note="TRL counts optimiser steps, tdrl generation rounds: `steps` = `max_steps` / (optimiser steps a round "
                 "= `num_iterations` x `steps_per_generation` / `gradient_accumulation_steps`, 1 on TRL's defaults); "
                 "a count that is not a whole number of rounds is refused"),
    *_COMMON[:5],
    TRLName("per_device_train_batch_size", "combine", "minibatch_size", defaults=("8 (1 prompt x 8 a step)", "16 prompts x 8 a round"),
            note="completions per optimiser step = `per_device_train_batch_size` x `gradient_accumulation_steps`"),
    TRLName("steps_per_generation", "combine", "prompts_per_step",
            note="completions per round = `per_device_train_batch_size` x `steps_per_generation`, / `num_generations`"),
    TRLName("generation_batch_size", "combine", "prompts_per_step", note="completions per round (per rank) / `num_generations`"),
    TRLName("num_iterations", "map", "epochs"),
    TRLName("beta", "map", "loss.beta"),
    TRLName("epsilon", "map", "loss.eps_low", note="also `loss.eps_high` unless `epsilon_high` is given, as in TRL"),
    TRLName("epsilon_high", "map", "loss.eps_high"),
    TRLName("loss_type", "combine", "loss.reduction", defaults=("\"dapo\"", "\"sequence\" (grpo)"),
            convert=_choice("loss_type", {k: k for k in LOSS_TYPES}, " (tdrl has no cispo / sapo / luspo / vespo)"),
            note="grpo -> \"sequence\"; dapo -> \"token\" (each token 1 / tokens of all ranks' minibatches); bnpo -> "
                 "\"token\" with `token_mean_over_ranks=False` (each rank's whole minibatch: TRL's counts each "
                 "micro-batch, so its gradient changes with `gradient_accumulation_steps`, tdrl's does not); "
                 "dr_grpo -> \"constant\" (`max_len` = `max_completion_length`)"),
    TRLName("scale_rewards", "map", "loss.scale_rewards", convert=lambda v: scale_mode("GRPOConfig", v),
            note="\"group\" / True, \"batch\" (group mean, batch std), \"none\" / False"),
    TRLName("importance_sampling_level", "map", "loss.sequence_level",
            convert=_choice("importance_sampling_level", IMPORTANCE_SAMPLING_LEVELS), note="\"sequence\" is GSPO"),
    TRLName("use_bias_correction_kl", "map", "loss.kl_bias_correction", note="the k3 KL term times the importance ratio"),
    *(TRLName(n, "same", n) for n in ("temperature", "top_p", "top_k", "reward_weights")),
    *_COMMON[5:],
    TRLName("use_vllm", "noop", accepts=_off,
            note="`False` accepted; `True` refused: pass `generator=VLLMGenerator(path, tokenizer, ...)` to `GRPOTrainer`"),
    TRLName("vllm_importance_sampling_correction", "combine", "loss.tis_cap",
            note="`True` turns on the correction of the generator's samples with TRL's defaults: `tis_cap=3.0`, "
                 "`tis_mode=\"sequence_mask\"`; it needs generator log-probs (`VLLMGenerator`, or async generation)"),
    TRLName("vllm_importance_sampling_mode", "combine", "loss.tis_mode",
            convert=_choice("vllm_importance_sampling_mode", {m: m for m in TIS_MODES}),
            defaults=("\"sequence_mask\"", "\"token_truncate\"")),
    TRLName("vllm_importance_sampling_clip_max", "combine", "loss.tis_cap", defaults=("3.0", "None (off)")),
    TRLName("vllm_importance_sampling_cap", "combine", "loss.tis_cap", note="TRL's older name of `..._clip_max`"),
    TRLName("vllm_importance_sampling_clip_min", "noop", accepts=lambda v: v is None,
            note="`None` accepted; a lower bound refused: tdrl bounds the weight from above only"),
    TRLName("log_completions", "noop", accepts=_off,
            note="`False` accepted; `True` refused: the last round's completions are `trainer.last_completions`"),
    TRLName("remove_unused_columns", "noop", accepts=_off, note="`False` accepted (every column reaches the rewards); `True` refused"),
    TRLName("shuffle_dataset", "noop", accepts=lambda v: v in (None, True), note="`True` accepted (tdrl always shuffles); `False` refused"),
    TRLName("mask_truncated_completions", "noop", accepts=_off, note="`False` accepted; `True` refused: not supported"),
    TRLName("max_prompt_length", "refuse", "a dataset without longer prompts",
            note="tdrl never truncates prompts: filter or shorten them in the dataset"),
), finish=_grpo_finish)


# ----------------------------------------------------------------------------- SFTConfig
def _sft_finish(out: dict, given: dict, defaults: dict) -> None:
    pdb = given.get("per_device_train_batch_size")
    if pdb is not None:
        out["batch_size"] = _positive("per_device_train_batch_size", pdb) * out.get("grad_accum", defaults["grad_accum"])


SFT_CONFIG_NAMES = TRLTable("SFTConfig", (
    TRLName("learning_rate", "map", "lr", defaults=("2e-5", "1e-3")),
    TRLName("max_steps", "map", "steps", convert=lambda v: _positive("max_steps", v), defaults=("-1 (3 epochs)", "200")),
    *_COMMON[:5],
    TRLName("per_device_train_batch_size", "combine", "batch_size", defaults=("8", "32"),
            note="examples per optimiser step = `per_device_train_batch_size` x `gradient_accumulation_steps`"),
    TRLName("use_liger_kernel", "map", "fused_logprobs", defaults=("False", "True"),
            note="the fused LM-head cross-entropy (`tdrl.kernels`); same loss either way"),
    *(replace(r, defaults=("0", "10")) if r.trl == "warmup_steps" else r for r in _COMMON[5:]),
    TRLName("completion_only_loss", "same", "completion_only_loss",
            note="`None` (TRL: on for prompt-completion data) is `True`"),
    TRLName("assistant_only_loss", "same", "assistant_only_loss", defaults=("False", "True"),
            note="`False` trains the whole conversation as rendered by the chat template"),
    TRLName("packing", "same", "packing",
            note="best-fit decreasing into rows of `max_length` (TRL's `packing_strategy=\"bfd\"`); no attention across "
                 "examples (position ids restart, a block-diagonal causal mask)"),
    TRLName("max_length", "same", "max_length", defaults=("1024", "None (no truncation; 1024 rows when packing)"),
            note="keeps each example's first `max_length` tokens"),
    TRLName("dataset_text_field", "map", "text_column", note="used when the dataset has no completion / messages column"),
    TRLName("remove_unused_columns", "noop", accepts=lambda v: v in (None, True, False), note="any value: tdrl reads only its columns"),
), finish=_sft_finish)


# ----------------------------------------------------------------------------- trainers
_TRAINER_COMMON = (
    TRLName("model", "same", "model", note="a model, or a name / local folder / hub id to load"),
    TRLName("train_dataset", "same", "train_dataset"),
    TRLName("args", "map", "config"),
    TRLName("processing_class", "map", "tokenizer"),
    TRLName("eval_dataset", "same", "eval_dataset", note="kept for `trainer.evaluate()` (TRL: `eval_strategy`, off by default)"),
    TRLName("peft_config", "map", "peft_config", note="a `peft.LoraConfig`, applied with `get_peft_model` (or `apply_lora`)"),
    TRLName("callbacks", "refuse", "`callback=fn(trainer, metrics)`", note="one plain function called after each step"),
    TRLName("optimizers", "refuse", "nothing", note="the trainer builds AdamW and its schedule from the config"),
    TRLName("data_collator", "refuse", "nothing", note="the trainer tokenises and pads its own batches"),
)
GRPO_TRAINER_NAMES = TRLTable("GRPOTrainer", (
    TRLName("reward_funcs", "map", "reward_fns", convert=lambda v: _reward_funcs(v),
            note="callables, and reward models: a local folder or an `AutoModelForSequenceClassification` "
                 "(`RewardModel`; a hub id is not downloaded: save it to a folder)"),
    *_TRAINER_COMMON,
    TRLName("reward_processing_classes", "same", "reward_processing_classes", note="one tokenizer per reward model"),
    TRLName("tools", "same", "tools", note="Python functions (and `\"python\"`), as `GRPOConfig.tools`; called with "
                                           "`<tool_call>` JSON"),
    TRLName("environment_factory", "same", "environment_factory",
            note="`reset(**row)` and public methods as tools (TRL's kind), or tdrl's `step` / `reward` protocol"),
    TRLName("rollout_func", "refuse", "`environment_factory=` (or `generator=`)",
            note="the trainer drives every rollout through one loop; an environment sets what happens each turn"),
))
SFT_TRAINER_NAMES = TRLTable("SFTTrainer", (
    *_TRAINER_COMMON,
    TRLName("formatting_func", "refuse", "a `prompt` / `completion` dataset (`dataset.map(...)`)"),
))


def _reward_funcs(value):
    import os

    items = value if isinstance(value, (list, tuple)) else [value]
    for v in items:
        if isinstance(v, (str, os.PathLike)) and not os.path.isdir(v):
            raise ValueError(f"reward_funcs: {v!r} is not a local folder; tdrl takes reward functions "
                             "(completions, **kwargs) -> list[float] and reward models saved to a folder (no hub download)")
    return value


# ----------------------------------------------------------------------------- translation
def translate(table: TRLTable, kwargs: dict[str, Any], own: set[str], defaults: dict[str, Any] | None = None) -> dict[str, Any]:
    """Translate TRL's keywords into tdrl's.

    Args:
        table: the names the class accepts.
        kwargs: the keywords given (tdrl's, TRL's or both).
        own: tdrl's own keyword names of the class.
        defaults: their default values (what the combined settings start from).

    Returns:
        The keywords in tdrl's names (``"loss.x"`` targets folded into ``loss`` by the
        table's ``finish``).

    Raises:
        TypeError: an unknown name (with the closest names), or a refused TRL name.
        ValueError: a value refused, or one setting given in both spellings.
    """
    owner = table.owner
    out = {k: v for k, v in kwargs.items() if k in own}
    given: dict[str, Any] = {"_targets": set()}
    for name, value in kwargs.items():
        if name in own:
            continue
        row = table.rows.get(name)
        if row is None:
            close = difflib.get_close_matches(name, sorted(own | set(table.rows)), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise TypeError(f"{owner} got an unknown keyword {name!r}{hint} (tdrl's names and TRL's are in the "
                            "'Coming from TRL' table of packages/llm/README.md)")
        if row.kind == "refuse":
            raise TypeError(f"{owner}: TRL's {name!r} is not supported here: use {row.tdrl} ({row.note})")
        if row.kind == "noop":
            if row.accepts is None or not row.accepts(value):
                raise ValueError(f"{owner}: {name}={value!r} is not supported here: {row.note}")
            continue
        value = row.convert(value) if row.convert is not None else value
        if row.kind == "combine":  # combined with the other names of one setting by the table's finish
            if row.tdrl in kwargs:
                raise ValueError(f"{owner}: give {row.tdrl!r} (tdrl) or TRL's {name!r}, not both")
            given[name] = value
            continue
        if row.tdrl in out or row.tdrl in given["_targets"]:
            raise ValueError(f"{owner}: {row.tdrl!r} was given twice (TRL's {name!r} is tdrl's {row.tdrl!r}): give one")
        out[row.tdrl] = value
        given["_targets"].add(row.tdrl)
    if table.finish is not None:
        table.finish(out, given, defaults or {})
    return out


def accept_trl_names(table: TRLTable) -> Callable[[type], type]:
    """Class decorator: the class's ``__init__`` also takes the TRL names of ``table``.

    tdrl's own keyword names are the parameters of ``__init__`` (a dataclass's fields);
    positional arguments pass through unchanged.
    """

    def wrap(cls: type) -> type:
        import inspect

        init = cls.__init__
        if is_dataclass(cls):
            own = {f.name for f in fields(cls) if f.init}
            defaults = {f.name: f.default for f in fields(cls) if f.init and f.default is not MISSING}
        else:
            params = inspect.signature(init).parameters
            own = {p for p in params if p != "self"}
            defaults = {p: v.default for p, v in params.items() if v.default is not inspect.Parameter.empty}

        @functools.wraps(init)
        def __init__(self, *args, **kwargs):
            if any(k not in own for k in kwargs):
                kwargs = translate(table, kwargs, own, defaults)
            init(self, *args, **kwargs)

        cls.__init__ = __init__
        cls.trl_names = table
        return cls

    return wrap


# ----------------------------------------------------------------------------- README table
def trl_table_markdown() -> str:
    """The README's TRL table: one section per class, a row per TRL name, and the defaults
    that differ (the text between the ``trl-names`` markers of ``packages/llm/README.md``)."""
    parts = []
    for table in (GRPO_CONFIG_NAMES, GRPO_TRAINER_NAMES, SFT_CONFIG_NAMES, SFT_TRAINER_NAMES):
        parts += [f"**`{table.owner}`**", "", "| TRL | tdrl | notes |", "| --- | --- | --- |"]
        for row in table.names:
            if row.kind in ("map", "same", "combine"):
                target = f"`{row.tdrl}`" + (" (same)" if row.kind == "same" else "")
            elif row.kind == "noop":
                target = "accepted only where it has no effect"
            else:
                target = f"refused: use {row.tdrl}"
            parts.append(f"| `{row.trl}` | {target} | {row.note} |")
        parts.append("")
    parts += ["**Defaults that deliberately differ**", "", "| class | TRL | TRL's default | tdrl's default |",
              "| --- | --- | --- | --- |"]
    for table in (GRPO_CONFIG_NAMES, SFT_CONFIG_NAMES):
        for row in table.names:
            if row.defaults is not None:
                parts.append(f"| `{table.owner}` | `{row.trl}` | {row.defaults[0]} | {row.defaults[1]} |")
    return "\n".join(parts) + "\n"


_MARKERS = ("<!-- trl-names:begin -->\n", "<!-- trl-names:end -->")


def write_readme_table(path: str) -> None:
    """Replace the text between the ``trl-names`` markers of ``path`` with :func:`trl_table_markdown`
    (``python -c "from tdrl.llm.trl_names import write_readme_table as w; w('packages/llm/README.md')"``)."""
    with open(path) as fh:
        text = fh.read()
    begin, end = text.index(_MARKERS[0]) + len(_MARKERS[0]), text.index(_MARKERS[1])
    with open(path, "w") as fh:
        fh.write(text[:begin] + trl_table_markdown() + text[end:])

