"""GRPO fine-tuning of a causal LM on a synthetic arithmetic task: the project's main job.

On its defaults (no download) it trains a tokenizer locally, builds a tiny Qwen2 model from a
config, saves both and reloads them with ``from_pretrained``, warms the model up with a short
SFT, then runs GRPO with a verifier reward, and reports held-out accuracy after SFT and after
GRPO. ``model=PATH`` starts from any local Hugging Face causal LM instead.

    python apps/grpo/train.py                         # the embedded default (~2 minutes on 2 CPU cores)
    python apps/grpo/train.py --config-name tiny      # a seconds-long smoke run (CI)
    python apps/grpo/train.py loss=dapo beta=0.02 lora=true
    python apps/grpo/train.py resume=true             # continue GRPO from the last checkpoint
    python apps/grpo/train.py -cn tools_tiny          # multi-turn: products with the Python tool
    python apps/grpo/train.py -cn user_tools_tiny     # multi-turn: products with your function tool (multiply)
    python apps/grpo/train.py -cn smollm2_chat        # the real SmolLM2-135M-Instruct, chat prompts (~5 min)
    python apps/grpo/train.py data=train.jsonl reward=my_rewards:correct eval_data=test.jsonl   # your data and rewards
    python apps/grpo/train.py data=train.csv prompt_column=question reward=[my_rewards:correct,my_rewards:short] reward_weights=[1,0.2]
    torchrun --nproc_per_node 2 apps/grpo/train.py -cn tiny   # data parallel: one job, one folder
    torchrun --nproc_per_node 2 apps/grpo/train.py -cn tiny fsdp=true   # GRPO sharded (FSDP2); the SFT warm-up stays DDP
    accelerate launch --multi_gpu --num_processes 2 apps/grpo/train.py -cn tiny   # the same job (gloo on a CPU)

Outputs in ``out`` (the run harness of ``tdrl.core.train``): ``config.yaml``, ``metrics.csv``
(one row per GRPO round), ``reward_curve.png``, ``summary.json``, ``checkpoints/step_<n>.pt``
(weights after SFT and the rounds so far, optimiser, schedule, prompt order, RNG; one per rank
under data parallelism), ``sft/`` (the warm-up's own run folder), the tiny model folder and the
final model (``final/``). ``task=tool_arithmetic tool=python`` trains multi-turn rollouts
where the policy may call the sandboxed Python tool (``GRPOConfig.tools``): the SFT warm-up
shows tool use on a fraction ``sft_tool_fraction`` of its problems, and the held-out check
reports the tool-call rate beside the accuracy. ``tool=module:function`` (or ``path/file.py:function``, a
list for several) gives your functions as tools (TRL's ``tools=[fn]``), and
``task=function_tool_arithmetic`` trains the products task with one of them (``-cn user_tools_tiny``);
``reward=<folder>`` scores with a reward model (a sequence-classification model saved there). ``resume=true`` continues GRPO without redoing the SFT; a rerun
without it goes to a new numbered folder and never touches the earlier one.

Your own data and rewards (TRL's ``trl grpo --dataset_name ... --reward_funcs ...``): ``data=`` a local
``.jsonl`` / ``.json`` / ``.csv`` / ``.parquet`` file or a ``datasets`` ``save_to_disk`` folder with a prompt
column (``prompt_column=``; strings or chat-message lists) whose other columns reach the reward functions
as keyword arguments; ``reward=module:function`` (or ``path/file.py:function``, or a list of them, with
``reward_weights=``) imported by name and refused before any work when it does not import (default: the
built-in answer checker, which reads an ``answer`` column and compares numbers and LaTeX,
``\\boxed{\\frac{1}{2}}`` = ``0.5``); ``eval_data=`` a held-out file scored every ``eval_every`` rounds
with the same (weighted) rewards, greedy. ``data=`` skips the SFT warm-up (prompts only). Every round's
completions go to ``<out>/completions.jsonl`` (prompt, completion, reward, each function's reward), and
with stderr not a terminal (a log file, CI) one metrics line per round is printed on stdout.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tdrl.core.train import ConfigError, Run, crossed, hydra_app, init_from_env, plot_curves
from tdrl.llm import (
    ArithmeticTask,
    FunctionToolArithmeticTask,
    GRPOConfig,
    GRPOLossConfig,
    GRPOTrainer,
    SFTConfig,
    SFTTrainer,
    ToolArithmeticTask,
    evaluate,
    load_prompt_dataset,
    math_answer_reward,
)
from tdrl.llm.rewards import load_function, load_rewards, weighted_reward
from tdrl.llm.agents import TOOLS, ToolStats, make_tool, tool_schema, tools_prompt_text
from tdrl.llm.run_config import LMRunConfig

TASKS = {"arithmetic": ArithmeticTask, "tool_arithmetic": ToolArithmeticTask,
         "function_tool_arithmetic": FunctionToolArithmeticTask}

LOSS_PRESETS = {
    "grpo": GRPOLossConfig.grpo,
    "dapo": GRPOLossConfig.dapo,
    "dr_grpo": GRPOLossConfig.dr_grpo,
    "gspo": GRPOLossConfig.gspo,
}


@dataclass
class Config(LMRunConfig):
    """GRPO of a causal LM on the arithmetic task, after a short SFT warm-up."""

    task: str = "arithmetic"
    """Task: arithmetic (answer in one turn), tool_arithmetic (products with the Python tool) or
    function_tool_arithmetic (products with your function tool, e.g. tool=apps/grpo/example_tools.py:multiply)."""
    min_value: int = 0
    """Task: smallest operand."""
    max_value: int = 19
    """Task: operands are drawn from min_value..max_value."""
    ops: str = "+"
    """Task: the operators used (e.g. "+-")."""
    data: str = ""
    """Your data: a local .jsonl/.json/.csv/.parquet file or a datasets save_to_disk folder with a prompt
    column; its other columns are passed to the reward functions as keyword arguments. Empty: the
    built-in task. Skips the SFT warm-up."""
    prompt_column: str = "prompt"
    """With data: the column holding the prompts (strings or chat-message lists)."""
    eval_data: str = ""
    """With data: a held-out file like data, scored greedily with the rewards every eval_every rounds."""
    reward: Any = ()
    """Reward functions by name: module:function or path/file.py:function, or a local folder holding a
    reward model (AutoModelForSequenceClassification), or a list [a:f,b:g]; empty: the built-in answer
    checker (numbers and LaTeX against an 'answer' column)."""
    reward_weights: Any = ()
    """One weight per reward function (a list); empty: all 1."""
    log_completions: bool = True
    """Write every round's completions to <out>/completions.jsonl."""
    chat: bool = False
    """Task: prompts as chat messages ("What is a + b? Answer with the number only.") rendered by
    the model's chat template, instead of plain "Q: a+b=" (needs a model with a chat template)."""
    n_train: int = 2000
    """Task: training problems."""
    n_test: int = 200
    """Task: held-out problems."""
    tool: Any = ""
    """Tools the policy may call in multi-turn rollouts: python (the sandboxed code tool) and / or your
    functions as module:function or path/file.py:function (their signature and docstring are the schema
    shown; called with <tool_call> JSON); a list for several; empty: single-turn."""
    show_tool_schemas: bool = True
    """With function tools: show their schemas before each prompt (the chat template's tools=, or one line per
    tool); false for the tiny model, which learns the call from its SFT warm-up."""
    tools_in_sandbox: bool = False
    """With function tools: run their source in the code sandbox (default: a killable worker process)."""
    max_turns: int = 2
    """With tool: policy turns at most per conversation (max_new_tokens caps each)."""
    tool_timeout: float = 2.0
    """With tool: seconds per tool call."""
    tool_sandbox: str = "bwrap"
    """With tool: code sandbox mode, bwrap (isolated, or the run stops naming bubblewrap's error) or
    rlimit (NOT isolation: only for trusted code)."""
    sft_tool_fraction: float = 0.1
    """task=tool_arithmetic: fraction of SFT problems whose first turn calls the tool."""
    sft_steps: int = 150
    """SFT warm-up steps (0: none)."""
    sft_batch: int = 64
    """SFT batch size."""
    sft_lr: float = 3e-3
    """SFT learning rate."""
    steps: int = 250
    """GRPO rounds (the run's step unit)."""
    prompts_per_step: int = 64
    """Prompts per round (per rank)."""
    group_size: int = 8
    """Completions per prompt."""
    max_new_tokens: int = 4
    """Completion length cap."""
    temperature: float = 1.0
    """Sampling temperature."""
    lr: float = 2e-4
    """GRPO learning rate."""
    warmup: int = 20
    """GRPO warm-up steps (a fresh Adam without warm-up kicks every weight by ~lr and undoes SFT)."""
    epochs: int = 1
    """Passes over each rollout."""
    minibatch_size: int = 256
    """Completions per optimiser step; 0: the whole rollout."""
    grad_accum: int = 1
    """Micro-batches each minibatch is split into."""
    loss: str = "grpo"
    """Loss preset: grpo, dapo, dr_grpo or gspo."""
    beta: float = 0.0
    """KL weight to the reference model."""
    tis_cap: float = 0.0
    """Truncated importance-sampling cap; 0: off."""
    async_generation: bool = False
    """Generate round k+1 in a background thread while round k trains (one step off-policy; set
    tis_cap to correct it; not bit-reproducible, and a resumed run regenerates its first round)."""
    eval_every: int = 25
    """GRPO rounds between held-out accuracy checks; 0: only at the end."""
    checkpoint_every: int = 0
    """GRPO rounds between checkpoints; 0: only at the end."""
    out: str = "runs/grpo"
    """Run folder (a new numbered one beside it if it holds an earlier run and resume is false)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.task not in TASKS:
            raise ConfigError(f"Config.task={self.task!r} is not allowed: expected one of {sorted(TASKS)}.")
        self.tool = (self.tool,) if isinstance(self.tool, str) and self.tool else tuple(self.tool or ())
        try:
            tools = self.tools()  # a function that does not import or has no schema is refused now
        except ValueError as err:
            raise ConfigError(str(err)) from err
        if self.task == "tool_arithmetic" and "python" not in tools:
            raise ConfigError("Config.task='tool_arithmetic' needs tool=python (the task is built around the tool).")
        if self.task == "function_tool_arithmetic" and sum(callable(t) for t in tools) != 1:
            raise ConfigError("Config.task='function_tool_arithmetic' needs one function tool of two arguments "
                              "(tool=apps/grpo/example_tools.py:multiply).")
        if not 0.0 <= self.sft_tool_fraction <= 1.0:
            raise ConfigError(f"Config.sft_tool_fraction={self.sft_tool_fraction!r} is not allowed: expected a number in [0, 1].")
        if self.loss not in LOSS_PRESETS:
            raise ConfigError(f"Config.loss={self.loss!r} is not allowed: expected one of {sorted(LOSS_PRESETS)}.")
        if self.chat and self.task != "arithmetic":
            raise ConfigError(f"Config.chat=true is for task=arithmetic (got task={self.task!r}): the tool "
                              "task's prompts and demonstrations are plain text.")
        if self.chat and not self.model:
            raise ConfigError("Config.chat=true needs model= (a chat model such as smollm2-135m-instruct): "
                              "the tiny embedded model has no chat template.")
        self.reward = (self.reward,) if isinstance(self.reward, str) else tuple(self.reward or ())
        self.reward_weights = ((self.reward_weights,) if isinstance(self.reward_weights, (int, float))
                               else tuple(float(w) for w in self.reward_weights or ()))
        for name, path in (("data", self.data), ("eval_data", self.eval_data)):
            if path and not os.path.exists(path):
                raise ConfigError(f"Config.{name}={path!r}: no such file or folder (a .jsonl/.json/.csv/.parquet file or "
                                  "a datasets save_to_disk folder).")
        if self.eval_data and not self.data:
            raise ConfigError("Config.eval_data is for data= (the built-in task has its own held-out split).")
        if self.data and self.task != "arithmetic":
            raise ConfigError(f"Config.data replaces the built-in task; task={self.task!r} cannot go with it.")
        if self.reward_weights and len(self.reward_weights) != max(1, len(self.reward)):
            raise ConfigError(f"Config.reward_weights has {len(self.reward_weights)} weights for "
                              f"{max(1, len(self.reward))} reward functions: give one weight per function.")
        try:
            self.reward_functions()  # a name that does not import is refused now, before any work
        except ValueError as err:
            raise ConfigError(str(err)) from err
        self.grpo_config()  # every GRPO and SFT setting is checked now, before any work
        self.sft_config()

    def tools(self) -> list:
        """The tools: ``python`` by name, functions loaded from their ``module:function`` names."""
        for t in self.tool:
            if t not in TOOLS and ":" not in t:
                raise ValueError(f"Config.tool={t!r}: unknown tool; expected one of {sorted(TOOLS)} or a function as "
                                 "module:function / path/file.py:function")
        return [t if t in TOOLS else load_function(t, "tool") for t in self.tool]

    def make_task(self):
        """The task; with a function tool, its call and the tools text shown before each prompt."""
        if self.task != "function_tool_arithmetic":
            return TASKS[self.task](min_value=self.min_value, max_value=self.max_value, ops=self.ops, chat=self.chat)
        schema = tool_schema(next(t for t in self.tools() if callable(t)))
        return FunctionToolArithmeticTask(
            min_value=self.min_value, max_value=self.max_value, ops=self.ops, tool_name=schema["function"]["name"],
            arg_names=tuple(schema["function"]["parameters"]["properties"])[:2],
            preamble=tools_prompt_text([schema]) if self.show_tool_schemas else "")

    def reward_functions(self) -> list:
        """The reward functions: the named ones, or the built-in answer checker."""
        return load_rewards(self.reward) if self.reward else [math_answer_reward]

    def grpo_config(self) -> GRPOConfig:
        loss = LOSS_PRESETS[self.loss](beta=self.beta, tis_cap=self.tis_cap or None)
        return GRPOConfig(
            steps=self.steps, prompts_per_step=self.prompts_per_step, group_size=self.group_size,
            max_new_tokens=self.max_new_tokens, temperature=self.temperature, lr=self.lr, epochs=self.epochs,
            minibatch_size=self.minibatch_size or None, grad_accum=self.grad_accum, loss=loss,
            seed=self.seed, warmup_steps=self.warmup, progress=self.progress,
            async_generation=self.async_generation, gradient_checkpointing=self.gradient_checkpointing, fsdp=self.fsdp,
            tools=self.tools(), max_turns=self.max_turns, tool_timeout=self.tool_timeout,
            tool_sandbox=self.tool_sandbox, tools_in_sandbox=self.tools_in_sandbox,
            show_tool_schemas=self.show_tool_schemas, reward_weights=self.reward_weights or None,
        )

    def sft_config(self) -> SFTConfig:
        return SFTConfig(steps=max(self.sft_steps, 1), batch_size=self.sft_batch, lr=self.sft_lr, warmup_steps=10,
                         seed=self.seed, progress=self.progress, gradient_checkpointing=self.gradient_checkpointing)


def main_job(cfg: Config) -> dict:
    """SFT warm-up, then GRPO; returns the summary (also ``summary.json``)."""
    logging.getLogger("transformers").setLevel(logging.ERROR)
    init_from_env()  # torchrun: one job, rank 0 writes
    run = Run(cfg, "grpo", total=cfg.steps, unit="round", per_rank=True)
    task = cfg.make_task()
    reward_fns = cfg.reward_functions()
    corpus = list(task.corpus())
    if cfg.data:  # the user's data, read and checked before the model is loaded
        train_ds = load_prompt_dataset(cfg.data, prompt_column=cfg.prompt_column)
        test_ds = load_prompt_dataset(cfg.eval_data, prompt_column=cfg.prompt_column) if cfg.eval_data else None
        if not cfg.reward and "answer" not in train_ds.column_names:
            raise ValueError(f"data={cfg.data!r} has no 'answer' column for the built-in answer checker (columns: "
                             f"{train_ds.column_names}); name your reward functions with reward=module:function")
        corpus += [p for p in train_ds["prompt"] if isinstance(p, str)]  # the tiny model's tokenizer sees them
    else:
        train_ds, test_ds = task.splits(cfg.n_train, cfg.n_test, seed=cfg.seed)
    sft_steps = 0 if cfg.data else cfg.sft_steps  # data= holds prompts only: nothing to imitate
    score = math_answer_reward if not cfg.reward else weighted_reward(reward_fns, cfg.reward_weights or None)
    model, tokenizer = cfg.build_model(corpus)
    n_params = sum(p.numel() for p in model.parameters())
    sft_ds = train_ds
    if isinstance(task, ToolArithmeticTask):
        import datasets

        sft_ds = datasets.Dataset.from_list(task.demonstrations(cfg.n_train, cfg.seed, cfg.sft_tool_fraction,
                                                                tokenizer.eos_token))
    tool = make_tool(cfg.tools(), cfg.tool_timeout, cfg.tool_sandbox, sandbox=cfg.tools_in_sandbox)
    tool_rates: list[float] = []  # held-out tool-call rate at each accuracy check (with a tool)

    def accuracy() -> float:
        """Held-out greedy score: accuracy with the answer checker, else the mean weighted reward."""
        if test_ds is None:
            return float("nan")
        stats = ToolStats()
        acc = evaluate(model, tokenizer, test_ds, score, max_new_tokens=cfg.max_new_tokens, tool=tool,
                       max_turns=cfg.max_turns, tool_stats=stats, show_tool_schemas=cfg.show_tool_schemas)
        tool_rates.append(stats.call_rate)
        return acc

    sft_file = run.out / "sft" / "accuracy.json"
    if run.resuming:  # the checkpoint holds the weights after SFT and the GRPO rounds done so far
        done = json.loads(sft_file.read_text()) if sft_file.exists() else {}
        acc0, acc_sft = done.get("start", float("nan")), done.get("after_sft", float("nan"))
    else:
        acc0 = accuracy()
        if sft_steps:
            sft_cfg = dataclasses.replace(cfg, out=str(run.out / "sft"), resume=False, checkpoint_every=0)
            sft_run = Run(sft_cfg, "sft", total=cfg.sft_steps)
            SFTTrainer(model, tokenizer, sft_ds, cfg.sft_config(), run=sft_run).train()
            sft_run.finish({"steps": cfg.sft_steps})
        acc_sft = accuracy() if sft_steps else acc0
        if run.main:
            sft_file.parent.mkdir(parents=True, exist_ok=True)
            sft_file.write_text(json.dumps({"start": acc0, "after_sft": acc_sft}))
    rate_sft = tool_rates[-1] if tool is not None and tool_rates else None
    if run.main and test_ds is not None:
        print(f"held-out accuracy: start {acc0:.3f}" + (f" -> after SFT {acc_sft:.3f}" if sft_steps else "")
              + (f" (tool-call rate {rate_sft:.3f})" if rate_sft is not None else ""), flush=True)

    curve: list[tuple[int, float]] = [(0, acc_sft)]

    completions_file = run.out / "completions.jsonl"
    log_lines = not sys.stderr.isatty()  # the progress bar is not read: one line per round instead

    def on_round(trainer, metrics):
        step = trainer.step_count
        if crossed(cfg.eval_every, step - 1, step) and step < cfg.steps:
            curve.append((step, accuracy()))
        if not run.main:
            return
        if cfg.log_completions:
            write_completions(completions_file, step, trainer.last_round)
        if log_lines:
            shown = {k: metrics[k] for k in ("reward", "reward_std", "accuracy", "kl", "completion_len", "tokens_per_s")
                     if k in metrics}
            heldout = f" heldout={curve[-1][1]:.4g}" if curve[-1][0] == step else ""
            print(f"round {step}/{cfg.steps} " + " ".join(f"{k}={v:.4g}" for k, v in shown.items()) + heldout, flush=True)

    grpo = GRPOTrainer(model, tokenizer, reward_fns, train_ds, cfg.grpo_config(), callback=on_round,
                       run=run)
    grpo.train()
    acc_grpo = accuracy()
    curve.append((grpo.step_count, acc_grpo))
    grpo.save_pretrained(os.path.join(cfg.out, "final"))
    rows = run.history.rows
    summary = run.finish({
        "params": n_params,
        "accuracy_start": acc0,
        "accuracy_after_sft": acc_sft,
        "accuracy_after_grpo": acc_grpo,
        "heldout_accuracy_curve": curve,
        "train_reward_first": rows[0]["reward"] if rows else None,
        "train_reward_last10": sum(r["reward"] for r in rows[-10:]) / max(1, len(rows[-10:])),
        **({"tool_call_rate_after_sft": rate_sft, "tool_call_rate_after_grpo": tool_rates[-1],
            "train_tool_call_rate_first": rows[0].get("tool_call_rate") if rows else None,
            "train_tool_call_rate_last10": sum(r["tool_call_rate"] for r in rows[-10:]) / max(1, len(rows[-10:])),
            "tool_errors": {k[len("tool_errors/"):]: sum(r[k] for r in rows) for k in rows[0] if k.startswith("tool_errors/")}
            if rows else {}}
           if tool is not None else {}),
    })
    if not run.main:
        return summary
    plot_rewards(rows, run.out / "reward_curve.png", curve)
    print(
        f"held-out {'accuracy' if not cfg.reward else 'reward'} {'after SFT' if sft_steps else 'at start'} {acc_sft:.3f} "
        f"-> after GRPO {acc_grpo:.3f} "
        f"({acc_grpo - acc_sft:+.3f})"
        + (f", held-out tool-call rate {rate_sft:.3f} -> {tool_rates[-1]:.3f}" if tool is not None else "")
        + f"; {n_params / 1e6:.2f}M params; {summary['time_s']:.0f}s; outputs in {cfg.out}",
        flush=True,
    )
    return summary


def write_completions(path: Path, step: int, last_round: dict) -> None:
    """Append one round's completions to ``path`` (JSON lines: round, prompt, completion, reward,
    and each reward function's score)."""
    with open(path, "a") as fh:
        for prompt, text, total, each in zip(last_round["prompt"], last_round["completion"], last_round["reward"],
                                             last_round["rewards"]):
            fh.write(json.dumps({"round": step, "prompt": prompt, "completion": text, "reward": total,
                                 "rewards": each}, default=str) + "\n")


def plot_rewards(rows: list[dict], path: Path, curve: list[tuple[int, float]]) -> None:
    """Train reward per GRPO round (and a moving average) and the held-out accuracy curve."""
    k = max(1, len(rows) // 10)
    smooth = [dict(r, reward_avg=sum(x["reward"] for x in rows[max(0, i - k + 1): i + 1]) / len(rows[max(0, i - k + 1): i + 1]))
              for i, r in enumerate(rows)]
    points = smooth + [{"step": float(s), "heldout_accuracy": a} for s, a in curve]
    plot_curves(sorted(points, key=lambda r: r["step"]), path, "step", ["reward", "reward_avg", "heldout_accuracy"],
                title=f"GRPO: held-out accuracy {curve[0][1]:.2f} -> {curve[-1][1]:.2f}", ylabel="reward / accuracy")


main = hydra_app(Config, main_job, name="grpo", recipes=Path(__file__).parent / "recipes")

if __name__ == "__main__":
    main()
