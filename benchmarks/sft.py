"""SFT: tdrl.llm's SFTTrainer vs TRL's SFTTrainer on the same model, data, batch and steps.

The model is a random Qwen2 with an LLM-sized vocabulary (V=32,000, hidden 256, 2 layers,
untied head: the LM head is most of the work, as in real fine-tuning of small models) and the
locally trained tiny tokenizer; both sides load it from the same folder with
``from_pretrained``. Data: prompt / completion pairs (``"Q: a+b="`` -> twelve worked sums, ~95
tokens), completion-only loss on both sides (TRL's default for prompt-completion data), the
same batch size, learning rate, cosine schedule, grad clipping, no warm-up, one torch thread,
each side in its own process (peak RSS per side). tdrl runs twice: its default fused loss
(``fused_linear_cross_entropy`` from the hidden states) and ``fused_logprobs=False`` (the
model's full logits). TRL 1.16 computes its loss through its own chunked LM head
(``add_fused_lm_head``), plus entropy and token accuracy for its logs.

    .venv-bench/bin/python -m benchmarks.sft                # needs trl (benchmarks/setup_peers.sh)
    .venv-bench/bin/python -m benchmarks.sft --steps 12 --repeats 3
    .venv-bench/bin/python -m benchmarks.sft --lora 8     # LoRA r=8 on every linear layer but the head

``--model NAME_OR_FOLDER`` starts every side from that model instead (a registered name such as
``smollm2-135m-instruct`` is converted once into tdrl's cache) with shorter rows (``--sums 3``:
~30 tokens a row on SmolLM2's digit-level tokenizer), and prints which share of this core's
measured fp32 GEMM rate (one thread, ``torch.mm`` of 1024 x 1024 matrices) each side's step
reaches, counting ``6 x (non-embedding parameters) x tokens + 6 x (LM-head parameters) x loss
tokens`` FLOPs a step (forward 2, backward 4 per multiply-add; attention scores, ~1% at this
length, left out). Gradient checkpointing is off on every side (TRL's default is on).

    .venv-bench/bin/python -m benchmarks.sft --model smollm2-135m-instruct --batch 8 --lr 1e-5 --steps 6 --repeats 1 --record

With ``--packing L`` both sides pack: tdrl's ``SFTConfig(packing=True, max_length=L)`` places each
batch's ``--batch`` examples into rows of ``L`` tokens (best-fit decreasing, a block-diagonal
causal mask, positions restarting per example); TRL runs ``packing=True, max_length=L`` (its
default ``bfd`` strategy, which turns on its padding-free collator: the packed sequences of a
batch flattened into one row, ``position_ids`` restarting per example, from which transformers
builds the block-diagonal mask) with ``--packed-rows`` packed sequences a step (default 1). Pick
``L`` near ``--batch`` x the mean example length so both sides see about as many tokens a step;
the ratio is then taken on real (non-padding) tokens per second, and s/step is shown beside it.

    .venv-bench/bin/python -m benchmarks.sft --model smollm2-135m-instruct --batch 8 --packing 256 --lr 1e-5 --steps 6 --repeats 1 --record

With ``--lora R`` both sides train the same peft adapters (``tdrl.llm.apply_lora``, rank R,
alpha 2R, every linear layer; the LM head stays frozen, so tdrl's fused loss takes its
two-matmul frozen-head path).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from benchmarks.records import module_command, subprocess_env


def _data(n: int, seed: int, sums: int = 12):
    """Prompt / completion pairs whose completion spells out a running sum of ``sums`` additions
    (~95 tokens with 12 on the tiny tokenizer)."""
    import random

    from datasets import Dataset

    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(0, 19), rng.randint(1, 9)
        steps, total = [], a
        for _ in range(sums):
            steps.append(f"{total}+{b}={total + b}")
            total += b
        rows.append({"prompt": f"Q: {a}+{b}=", "completion": " ".join(steps)})
    return Dataset.from_list(rows)


def prepare(folder: str, vocab: int, seed: int) -> None:
    """Tiny tokenizer + a random Qwen2 with a ``vocab``-row untied head, saved to ``folder``."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from tdrl.llm import ArithmeticTask, train_tokenizer

    torch.manual_seed(seed)
    tok = train_tokenizer(ArithmeticTask(max_value=19).corpus(), vocab_size=64)
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=256, intermediate_size=768, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=False, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                      bos_token_id=tok.bos_token_id)
    Qwen2ForCausalLM(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)


def load(a):
    from tdrl.llm import apply_lora, load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(a.model)
    if a.lora:
        model = apply_lora(model, r=a.lora, alpha=2 * a.lora)
    return model, tok


def run_tdrl(a, fused: bool) -> dict:
    from tdrl.llm import SFTConfig, SFTTrainer

    model, tok = load(a)
    cfg = SFTConfig(steps=a.steps, batch_size=a.batch, lr=a.lr, warmup_steps=0, max_grad_norm=1.0, seed=a.seed,
                    progress=False, fused_logprobs=fused, packing=a.packing > 0, max_length=a.packing or None)
    trainer = SFTTrainer(model, tok, _data(2000, a.seed, a.sums), cfg)
    times, losses, tokens = [], [], []
    for _ in range(a.steps):
        t = time.perf_counter()
        m = trainer.step()
        times.append(time.perf_counter() - t)
        losses.append(m["loss"])
        tokens.append(m["tokens_per_s"] * times[-1])  # real tokens of the step (the trainer times its own step)
    return {"times": times, "losses": losses, "tokens": tokens}


def run_trl(a) -> dict:
    from transformers import TrainerCallback
    from trl import SFTConfig, SFTTrainer

    model, tok = load(a)
    times, losses, seen = [], [], []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            times.append(time.perf_counter() - self.t)

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "loss" in logs:
                losses.append(logs["loss"])
                seen.append(logs.get("num_tokens", 0.0))  # cumulative tokens fed to the model

    with tempfile.TemporaryDirectory() as out:
        args = SFTConfig(
            output_dir=out, per_device_train_batch_size=a.packed_rows if a.packing else a.batch, learning_rate=a.lr, max_steps=a.steps,
            logging_steps=1, lr_scheduler_type="cosine", warmup_steps=0, max_grad_norm=1.0, weight_decay=0.0,
            completion_only_loss=True, packing=a.packing > 0, max_length=a.packing or 1024, use_cpu=True, bf16=False, report_to="none",
            save_strategy="no", gradient_checkpointing=False, seed=a.seed, disable_tqdm=True,
            dataloader_num_workers=0,
        )
        SFTTrainer(model=model, args=args, train_dataset=_data(2000, a.seed, a.sums), processing_class=tok,
                   callbacks=[Timer()]).train()
    return {"times": times, "losses": losses, "tokens": [c - p for c, p in zip(seen, [0.0] + seen[:-1])]}


def worker(a) -> None:
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(a.seed)
    res = run_trl(a) if a.worker == "trl" else run_tdrl(a, fused=a.worker == "tdrl")
    res["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    res["gemm_gflops"] = gemm_rate()
    with open(a.out, "w") as f:
        json.dump(res, f)


def gemm_rate(n: int = 1024, repeats: int = 5) -> float:
    """This core's fp32 GEMM rate in GFLOP/s: the best of ``repeats`` ``torch.mm`` of two ``n x n``
    matrices (one thread, as the benchmark runs)."""
    import torch

    x, y = torch.randn(n, n), torch.randn(n, n)
    torch.mm(x, y)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        torch.mm(x, y)
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best / 1e9


def step_flops(folder: str, rows, tok) -> float:
    """Mean FLOPs of a training step on ``rows`` (a batch's prompt / completion pairs): 6 x
    non-embedding parameters x tokens + 6 x LM-head parameters x loss tokens (completion + EOS)."""
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(folder)
    H, L, I, V = c.hidden_size, c.num_hidden_layers, c.intermediate_size, c.vocab_size
    kv = H // c.num_attention_heads * getattr(c, "num_key_value_heads", c.num_attention_heads)
    body = L * (2 * H * H + 2 * H * kv + 3 * H * I)  # q, o, k, v projections and the gated MLP
    n_prompt = sum(len(tok(r["prompt"], add_special_tokens=False)["input_ids"]) for r in rows)
    n_loss = sum(len(tok(r["completion"], add_special_tokens=False)["input_ids"]) + 1 for r in rows)
    return 6 * body * (n_prompt + n_loss) + 6 * H * V * n_loss


SIDES = {"tdrl": "tdrl SFTTrainer (fused_linear_cross_entropy)", "tdrl_logits": "tdrl SFTTrainer, full logits",
         "trl": "TRL SFTTrainer"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lora", type=int, default=0, help="LoRA rank on both sides (0: full fine-tuning)")
    p.add_argument("--worker", choices=list(SIDES), default=None)
    p.add_argument("--model", default=None, help="a registered name or a model folder (default: a random Qwen2)")
    p.add_argument("--sums", type=int, default=None, help="additions per completion (default 12; 3 with --model)")
    p.add_argument("--packing", type=int, default=0, metavar="L",
                   help="pack on both sides into rows of L tokens (tdrl: packing=True, max_length=L; TRL: packing=True)")
    p.add_argument("--packed-rows", type=int, default=1, help="with --packing: TRL's packed sequences a step")
    p.add_argument("--out", default=None)
    p.add_argument("--record", action="store_true", help="write the RESULTS rows (with --model)")
    a = p.parse_args()
    real = a.model is not None and not a.worker
    if a.sums is None:
        a.sums = 3 if a.model is not None else 12
    if a.worker:
        return worker(a)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "TRANSFORMERS_VERBOSITY": "error"}
    sides = {k: v for k, v in SIDES.items() if not (a.packing and k == "tdrl_logits")}
    results: dict[str, list[dict]] = {s: [] for s in sides}
    with tempfile.TemporaryDirectory() as tmp:
        if real:
            from tdrl.llm.models import resolve_model

            folder = resolve_model(a.model)
        else:
            folder = os.path.join(tmp, "model")
            prepare(folder, a.vocab, a.seed)
        for r in range(a.repeats):
            for side in sides:
                out = os.path.join(tmp, f"{side}{r}.json")
                cmd = [*module_command(sys.executable, __spec__.name), "--worker", side, "--model", folder, "--out", out,
                       "--steps", str(a.steps), "--batch", str(a.batch), "--lr", str(a.lr), "--seed", str(a.seed),
                       "--lora", str(a.lora), "--sums", str(a.sums), "--packing", str(a.packing),
                       "--packed-rows", str(a.packed_rows)]
                subprocess.run(cmd, check=True, env=subprocess_env(env), stdout=subprocess.DEVNULL)
                with open(out) as f:
                    results[side].append(json.load(f))
        if real:  # the FLOPs of a mean batch, on the model's own tokenizer
            from transformers import PreTrainedTokenizerFast

            tok = PreTrainedTokenizerFast.from_pretrained(folder)
            rows = list(_data(2000, a.seed, a.sums))[: 8 * a.batch]
            flops = step_flops(folder, rows, tok) / 8
            row_tokens = sum(len(tok(r["prompt"] + r["completion"], add_special_tokens=False)["input_ids"]) + 1
                                       for r in rows) / len(rows)
            flop_per_token = flops / (a.batch * row_tokens)
    packed = (f", packed into rows of {a.packing} tokens (TRL: {a.packed_rows} packed sequence(s) a step, "
              "padding-free)") if a.packing else ""
    what = (f"{os.path.basename(os.path.normpath(a.model))}, batch {a.batch} x ~{row_tokens:.0f} tokens "
            f"({a.sums} sums a completion){packed}") if real else (
        f"random Qwen2 V={a.vocab:,} H=256 2 layers, batch {a.batch} x (~8 prompt + ~95 completion tokens)")
    print(f"SFT, {what}, {a.steps} steps (first excluded), {a.repeats} repeats (median), 1 torch thread, "
          + (f"LoRA r={a.lora} (head frozen)" if a.lora else "full fine-tuning") + ", gradient checkpointing off")
    def tok_s(x: dict) -> float:
        return sum(x["tokens"][1:]) / sum(x["times"][1:])

    base = statistics.median(statistics.median(x["times"][1:]) for x in results["trl"])
    base_tok = statistics.median(tok_s(x) for x in results["trl"])
    base_rss = statistics.median(x["peak_rss_mb"] for x in results["trl"])
    gemm = statistics.median(x["gemm_gflops"] for xs in results.values() for x in xs)
    print(f"{'side':<48}{'s/step':>9}{'tokens/s':>10}{'vs TRL':>9}{'peak RSS MB':>13}{'loss first':>12}{'loss last':>11}"
          + (f"{'GFLOP/s':>9}{'of GEMM':>9}" if real else ""))
    table_rows = {}
    for side, name in sides.items():
        rs = results[side]
        s = statistics.median(statistics.median(x["times"][1:]) for x in rs)
        ts = statistics.median(tok_s(x) for x in rs)
        rss = statistics.median(x["peak_rss_mb"] for x in rs)
        first = statistics.mean(x["losses"][0] for x in rs)
        last = statistics.mean(x["losses"][-1] for x in rs)
        # packed: the rate on the real tokens each side fed (their counts differ a little a step)
        gflops = (flop_per_token * ts if a.packing else flops / s) / 1e9 if real else 0.0
        speed = ts / base_tok if a.packing else base / s
        extra = f"{gflops:>9.1f}{gflops / gemm:>8.0%}" if real else ""
        print(f"{name:<48}{s:>9.3f}{ts:>10.0f}{speed:>8.2f}x{rss:>13.0f}{first:>12.4f}{last:>11.4f}" + extra)
        table_rows[side] = (name, s, ts, rss, first, last, gflops, speed)
    if real:
        print(f"fp32 GEMM rate of this core (torch.mm 1024^3, 1 thread): {gemm:.1f} GFLOP/s; "
              f"a step is {flops / 1e9:.1f} GFLOP")
    if a.record and real:
        import trl
        from benchmarks.records import write_record

        table = f"SFT vs TRL {trl.__version__} SFTTrainer on the real {what}"
        note = (f"Same cached model folder and rows, completion-only loss on every side, lr {a.lr:g} cosine, grad clip 1.0, "
                f"no warm-up, gradient checkpointing off (TRL's default is on), one torch thread, each side in its own "
                f"process; {a.steps} steps, the first excluded, {a.repeats} repeat(s). 'of GEMM': the step's "
                f"{flops / 1e9:.1f} GFLOP (6 x non-embedding params x tokens + 6 x head params x loss tokens) per second "
                f"over this core's fp32 torch.mm rate ({gemm:.1f} GFLOP/s, 1024^3, one thread). The issue's target: "
                ">= 1.5x TRL's steps/s at <= its peak memory.")
        if a.packing:
            note += (f" Packing: tdrl packs each step's {a.batch} examples into rows of {a.packing} tokens; TRL packs the "
                     f"dataset (bfd) into sequences of {a.packing} and flattens its {a.packed_rows} a step padding-free; "
                     "so a step's examples differ between the sides (hence the different first losses); the ratio is "
                     "real tokens/s, and 'of GEMM' is the FLOPs of each side's real tokens a second.")
        what_rate = "tokens/s" if a.packing else "steps/s"
        for side, (name, s, ts, rss, first, last, gflops, speed) in table_rows.items():
            write_record("LLM (GRPO)", table, name.replace("TRL SFTTrainer", f"TRL {trl.__version__} SFTTrainer"), {
                "s/step": round(s, 3), **({"tokens/s": round(ts)} if a.packing else {}), "peak RSS MB": round(rss),
                "loss step 1 -> last": f"{first:.3f} -> {last:.3f}", "share of fp32 GEMM rate": f"{gflops / gemm:.0%}",
            }, ratio=f"{speed:.2f}x TRL's {what_rate} at {rss / base_rss:.2f}x its peak RSS", note=note)


if __name__ == "__main__":
    main()
