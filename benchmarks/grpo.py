"""GRPO: tdrl.llm vs TRL's GRPOTrainer on the same tiny model, data, group size, lengths, steps.

Both sides start from the same SFT-warmed tiny Qwen2 (built and saved once), train on the same
synthetic arithmetic prompts with the same verifier reward, group size, completion length,
learning rate, clip range, loss aggregation (per-sequence mean, TRL ``loss_type="grpo"``),
one torch thread, in separate processes (so peak RSS is per side). Reported: median seconds
per step (first step excluded), tokens/s (prompt + completion tokens processed per second),
peak RSS, and the reward curve (mean reward of the first and last 5 steps).

    .venv-bench/bin/python -m benchmarks.grpo              # needs trl (benchmarks/setup_peers.sh)
    .venv-bench/bin/python -m benchmarks.grpo --steps 30 --repeats 3
    python -m benchmarks.grpo --profile --steps 15         # tdrl only: where a step's time goes
    python -m benchmarks.grpo --profile --device cuda      # the same on a GPU (benchmarks/gpu_check.sh)
    python -m benchmarks.grpo --profile --model smollm2-135m-instruct --prompts 2 --max-new-tokens 16 --steps 4
    python -m benchmarks.grpo --loss-step --repeats 3      # the loss step alone at V=32,000
    .venv-bench/bin/python -m benchmarks.grpo --model smollm2-135m-instruct --prompts 2 --steps 6 --repeats 1 \
        --max-new-tokens 16 --lr 1e-6 --record            # the real model (cached by tdrl.llm.models)

``--device`` puts the SFT warm-up and both trainers on that device (TRL: ``use_cpu`` off).
``--model NAME_OR_FOLDER`` starts both sides from that model instead of the SFT-warmed tiny one
(a registered name such as ``smollm2-135m-instruct`` is converted once into tdrl's cache), with
chat prompts ("What is a + b? Answer with the number only.") through its chat template and a
TRL-style reward on both sides (completions arrive as assistant messages); gradient
checkpointing is off on both (TRL's default is on; ``--gradient-checkpointing`` turns it on for both).
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


def _data(n_train: int, seed: int, chat: bool = False):
    from tdrl.llm import ArithmeticTask

    return ArithmeticTask(max_value=19, chat=chat).splits(n_train, 64, seed=seed)


def chat_answer_reward(prompts, completions, answer, **_):
    """``math_answer_reward`` of TRL-convention completions (text, or one assistant message)."""
    from tdrl.llm import math_answer_reward
    from tdrl.llm.data import completion_text

    return math_answer_reward(prompts, [completion_text(c) for c in completions], answer)


def _reward(a):
    from tdrl.llm import math_answer_reward

    return chat_answer_reward if a.chat else math_answer_reward


def prepare(folder: str, sft_steps: int, seed: int, device: str = "cpu") -> None:
    """Build the tiny model + tokenizer, warm it up with SFT, save it to ``folder``."""
    import torch

    from tdrl.llm import ArithmeticTask, SFTConfig, SFTTrainer, make_tiny_lm

    torch.set_num_threads(1)
    train, _ = _data(2000, seed)
    model, tok = make_tiny_lm(os.path.join(folder, "init"), ArithmeticTask(max_value=19).corpus(), hidden_size=96, num_layers=2, intermediate_size=288, seed=seed)
    model.to(device)
    SFTTrainer(model, tok, train, SFTConfig(steps=sft_steps, batch_size=64, lr=3e-3, warmup_steps=10, progress=False, seed=seed)).train()
    model.save_pretrained(os.path.join(folder, "sft"))
    tok.save_pretrained(os.path.join(folder, "sft"))


def run_tdrl(a) -> dict:
    import torch

    from tdrl.llm import GRPOConfig, GRPOTrainer, load_model_and_tokenizer, math_answer_reward

    model, tok = load_model_and_tokenizer(a.model)
    model.to(a.device)
    train, _ = _data(2000, a.seed, a.chat)
    cfg = GRPOConfig(steps=a.steps, prompts_per_step=a.prompts, group_size=a.group, max_new_tokens=a.max_new_tokens,
                     lr=a.lr, warmup_steps=0, seed=a.seed, progress=False,
                     gradient_checkpointing=a.gradient_checkpointing)
    trainer = GRPOTrainer(model, tok, [_reward(a)], train, cfg)
    times, rewards, tokens = [], [], []
    for _ in range(a.steps):
        t = time.perf_counter()
        m = trainer.step()
        times.append(time.perf_counter() - t)
        rewards.append(m["reward"])
        tokens.append(m["tokens_per_s"] * m["step_time"])
    del torch
    return {"times": times, "rewards": rewards, "tokens": tokens}


def run_trl(a) -> dict:
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from tdrl.llm import load_model_and_tokenizer, math_answer_reward

    model, tok = load_model_and_tokenizer(a.model)
    model.to(a.device)
    train, _ = _data(2000, a.seed, a.chat)
    train = train.remove_columns("completion")
    times, logs = [], []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            times.append(time.perf_counter() - self.t)

        def on_log(self, args, state, control, logs_=None, **kw):
            logs.append(dict(kw.get("logs", {}) or logs_ or {}))

    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(
            output_dir=out, per_device_train_batch_size=a.prompts * a.group, num_generations=a.group,
            max_completion_length=a.max_new_tokens, learning_rate=a.lr, max_steps=a.steps, logging_steps=1,
            beta=0.0, epsilon=0.2, temperature=1.0, top_k=0, top_p=1.0, loss_type="grpo", num_iterations=1,
            gradient_accumulation_steps=1, lr_scheduler_type="cosine", warmup_steps=0, adam_beta2=0.99,
            max_grad_norm=1.0, use_cpu=a.device == "cpu", bf16=False, report_to="none", save_strategy="no",
            gradient_checkpointing=a.gradient_checkpointing,  # TRL defaults to True; off unless asked, as tdrl
            seed=a.seed, disable_tqdm=True, dataloader_num_workers=0,
        )
        trainer = GRPOTrainer(model=model, reward_funcs=[_reward(a)], args=args, train_dataset=train, processing_class=tok, callbacks=[Timer()])
        trainer.train()
    logs = [l for l in logs if "reward" in l]
    cum = [l.get("num_tokens", 0.0) for l in logs]
    tokens = [c - p for c, p in zip(cum, [0.0] + cum[:-1])]
    return {"times": times, "rewards": [l["reward"] for l in logs], "tokens": tokens}


def profile_stages(a) -> None:
    """Median milliseconds of each stage of a tdrl GRPO step (the trainer's own pieces, timed
    one by one on the benchmark's configuration; the first step is run untimed)."""
    import torch
    from tensordict import TensorDict

    from tdrl.llm import GRPOConfig, GRPOTrainer, load_model_and_tokenizer, math_answer_reward
    from tdrl.llm import keys as K
    from tdrl.llm.advantages import group_advantages
    from tdrl.llm.data import completion_texts, render_prompts, tokenize_prompts
    from tdrl.llm.rewards.compute import compute_rewards

    torch.set_num_threads(1)
    torch.manual_seed(a.seed)
    model, tok = load_model_and_tokenizer(a.model)
    model.to(a.device)
    train, _ = _data(2000, a.seed, a.chat)
    cfg = GRPOConfig(steps=a.steps + 1, prompts_per_step=a.prompts, group_size=a.group, max_new_tokens=a.max_new_tokens,
                     lr=a.lr, seed=a.seed, progress=False)
    tr = GRPOTrainer(model, tok, [_reward(a)], train, cfg)
    tr.step()
    G, times = a.group, {}
    for _ in range(a.steps):
        marks = [("start", time.perf_counter())]

        def mark(name):
            if model.device.type == "cuda":
                torch.cuda.synchronize()
            marks.append((name, time.perf_counter()))

        batch = next(tr.sampler)
        ids, mask = tokenize_prompts(tok, render_prompts(tok, batch["prompt"]), model.device)
        ids, mask = ids.repeat_interleave(G, 0), mask.repeat_interleave(G, 0)
        mark("tokenise prompts")
        gen = tr.generator.generate(ids, mask)
        mark("generation")
        texts = completion_texts(tok, gen[K.COMPLETION_IDS], gen[K.COMPLETION_MASK])
        mark("detokenise")
        prompts = [p for p in batch["prompt"] for _ in range(G)]
        cols = {k: [v for v in vals for _ in range(G)] for k, vals in batch.items() if k != "prompt"}
        rewards = compute_rewards(tr.reward_fns, prompts, texts, cols, None)[0]
        adv = group_advantages(rewards, G).to(model.device)
        mark("rewards + advantages")
        td = TensorDict({K.PROMPT_IDS: ids, K.PROMPT_MASK: mask, **gen.to_dict(), K.ADVANTAGE: adv}, batch_size=[ids.shape[0]])
        td = td.to(model.device)
        tr.optimizer.zero_grad(set_to_none=True)
        loss = tr.loss_fn(model, td)["loss_objective"]
        mark("training forward + loss")
        loss.backward()
        mark("backward")
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
        tr.optimizer.step()
        mark("grad clip + optimiser")
        for (_, t0), (name, t1) in zip(marks, marks[1:]):
            times.setdefault(name, []).append(1e3 * (t1 - t0))
        times.setdefault("total", []).append(1e3 * (marks[-1][1] - marks[0][1]))
    print(f"tdrl GRPO step on {a.device}, {a.prompts} prompts x {a.group}, <= {a.max_new_tokens} new tokens, "
          f"median of {a.steps} steps (ms); fused LM-head + GRPO loss: {tr.loss_fn.uses_fused_loss}")
    for name, v in times.items():
        print(f"{name:<26}{statistics.median(v):>9.1f}")


def loss_step(a) -> None:
    """GRPOLoss forward + backward alone on a model with an LLM-sized vocabulary (the benchmark's
    tiny model has 29 tokens, so its LM head costs nothing): the fused LM-head + GRPO loss
    (``fused_loss``, 3 LM-head matmuls) vs fused log-probs + ``grpo_objective`` (4) vs the
    full logits. Random Qwen2 (hidden 256, 2 layers, V=32,000), 4 prompts x 4, prompt 32 and
    completion 128 tokens, ragged completions, old and reference log-probs, KL 0.04.
    Each variant runs in its own process for its peak RSS."""
    import torch
    from tensordict import TensorDict
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from tdrl.llm import GRPOLoss, GRPOLossConfig, completion_logprobs
    from tdrl.llm import keys as K

    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=32000, hidden_size=256, intermediate_size=768, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=False)
    model = Qwen2ForCausalLM(cfg).to(a.device)
    g = torch.Generator().manual_seed(0)
    n, G, P, C = 16, 4, 32, 128
    prompts = torch.randint(0, 32000, (n // G, P), generator=g).repeat_interleave(G, 0)
    lengths = torch.randint(C // 4, C + 1, (n,), generator=g)
    cmask = torch.arange(C)[None] < lengths[:, None]
    td = TensorDict({K.PROMPT_IDS: prompts, K.PROMPT_MASK: torch.ones(n, P, dtype=torch.long),
                     K.COMPLETION_IDS: torch.randint(0, 32000, (n, C), generator=g), K.COMPLETION_MASK: cmask,
                     K.ADVANTAGE: torch.randn(n, generator=g)}, batch_size=[n]).to(a.device)
    loss_cfg = GRPOLossConfig(beta=0.04, reduction="sequence")
    with torch.no_grad():
        lp = completion_logprobs(model, td)
    td[K.OLD_LOG_PROB] = (lp + 0.1 * torch.randn(lp.shape, generator=g).to(lp.device)) * td[K.COMPLETION_MASK]
    td[K.REF_LOG_PROB] = (lp + 0.1 * torch.randn(lp.shape, generator=g).to(lp.device)) * td[K.COMPLETION_MASK]
    variants = {"fused_loss": dict(fused=True, fused_loss=True), "fused_logprobs": dict(fused=True, fused_loss=False),
                "logits": dict(fused=False)}
    loss_fn = GRPOLoss(loss_cfg, **variants[a.loss_step])

    def run():
        model.zero_grad(set_to_none=True)
        loss_fn(model, td)["loss_objective"].backward()
        if model.device.type == "cuda":
            torch.cuda.synchronize()

    run()
    times = []
    for _ in range(a.repeats):
        t = time.perf_counter()
        run()
        times.append(time.perf_counter() - t)
    print(json.dumps({"ms": 1e3 * statistics.median(times), "loss": loss_fn(model, td)["loss_objective"].item(),
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def loss_step_table(a) -> None:
    rows = {}
    for v in ("fused_loss", "fused_logprobs", "logits"):
        cmd = [*module_command(sys.executable, __spec__.name), "--loss-step", v, "--repeats", str(a.repeats), "--device", a.device]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=subprocess_env()).stdout
        rows[v] = json.loads(out.strip().splitlines()[-1])
    print(f"GRPOLoss forward + backward, random Qwen2 V=32,000 H=256 2 layers, 16 rows x (32 + <=128) tokens, "
          f"KL, {a.device}, 1 thread, median of {a.repeats}")
    print(f"{'variant':<44}{'ms':>9}{'ratio':>8}{'peak RSS MB':>13}{'loss':>12}")
    names = {"fused_loss": "fused LM head + GRPO loss (fused_loss=True)",
             "fused_logprobs": "fused log-probs + grpo_objective", "logits": "full logits (fused=False)"}
    for v, r in rows.items():
        print(f"{names[v]:<44}{r['ms']:>9.0f}{r['ms'] / rows['fused_loss']['ms']:>8.2f}{r['peak_rss_mb']:>13.0f}"
              f"{r['loss']:>12.6f}")


def worker(a) -> None:
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(a.seed)
    res = run_tdrl(a) if a.worker == "tdrl" else run_trl(a)
    res["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    with open(a.out, "w") as f:
        json.dump(res, f)


def checkpointing_trade(a, env: dict) -> None:
    """tdrl's GRPO step with gradient checkpointing off and on, each side in its own process."""
    from tdrl.llm.models import resolve_model

    if a.model is None:
        raise SystemExit("--checkpointing-trade needs --model (e.g. smollm2-135m-instruct)")
    folder = resolve_model(a.model)
    res = {}
    with tempfile.TemporaryDirectory() as tmp:
        for on in (False, True):
            out = os.path.join(tmp, f"ckpt{int(on)}.json")
            cmd = [*module_command(sys.executable, __spec__.name), "--worker", "tdrl", "--model", folder, "--out", out, "--steps", str(a.steps),
                   "--prompts", str(a.prompts), "--group", str(a.group), "--max-new-tokens", str(a.max_new_tokens),
                   "--lr", str(a.lr), "--seed", str(a.seed), "--device", a.device, "--chat"] + ["--gradient-checkpointing"] * on
            subprocess.run(cmd, check=True, env=subprocess_env(env), stdout=subprocess.DEVNULL)
            with open(out) as f:
                x = json.load(f)
            res[on] = {"s/step": statistics.median(x["times"][1:]), "peak RSS MB": x["peak_rss_mb"]}
    what = os.path.basename(os.path.normpath(a.model))
    print(f"tdrl GRPO on {what}, {a.prompts} prompts x {a.group} completions, <= {a.max_new_tokens} new tokens, "
          f"{a.steps} steps (first excluded), 1 torch thread")
    print(f"{'gradient checkpointing':<24}{'s/step':>9}{'peak RSS MB':>13}")
    for on, r in res.items():
        print(f"{'on' if on else 'off':<24}{r['s/step']:>9.2f}{r['peak RSS MB']:>13.0f}")
    t, m = res[True]["s/step"] / res[False]["s/step"], res[True]["peak RSS MB"] / res[False]["peak RSS MB"]
    print(f"on/off: {t:.2f}x the time, {m:.2f}x the peak RSS")
    if a.record:
        from benchmarks.records import write_record

        table = (f"Gradient checkpointing on the real {what} (tdrl GRPO step, {a.prompts} prompts x {a.group} "
                 f"completions, {a.max_new_tokens} new tokens)")
        note = ("GRPOConfig(gradient_checkpointing=True): each decoder layer recomputed in the backward pass "
                "(non-reentrant torch.utils.checkpoint); prompt-KV sharing is off with it, so each completion's ~46-token chat prompt is run again per completion: most of the extra time here. Peak RSS includes the "
                "fp32 weights, gradients and AdamW state (~2.2 GB for 134.5M parameters), which checkpointing does "
                f"not touch; one torch thread, each setting in its own process, {a.steps} steps, the first excluded.")
        write_record("LLM (GRPO)", table, "off (tdrl's default)", {k: round(v, 2) for k, v in res[False].items()},
                     note=note)
        write_record("LLM (GRPO)", table, "on (TRL's default)", {k: round(v, 2) for k, v in res[True].items()},
                     peer="off", ratio=f"{t:.2f}x the time per step at {m:.2f}x the peak RSS", note=note)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--sft-steps", type=int, default=150)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--worker", choices=["tdrl", "trl"], default=None)
    p.add_argument("--model", default=None, help="a registered name or a model folder (default: the tiny model)")
    p.add_argument("--chat", action="store_true", help=argparse.SUPPRESS)  # workers: chat prompts
    p.add_argument("--gradient-checkpointing", action="store_true", help="on both sides (default off on both)")
    p.add_argument("--record", action="store_true", help="write the RESULTS rows")
    p.add_argument("--checkpointing-trade", action="store_true",
                   help="tdrl only: gradient checkpointing off vs on (s/step, peak RSS), each in its own process")
    p.add_argument("--out", default=None)
    p.add_argument("--device", default="cpu", help="device of the models (both sides)")
    p.add_argument("--profile", action="store_true", help="tdrl only: median time of each stage of a step")
    p.add_argument("--loss-step", nargs="?", const="table", default=None,
                   choices=["table", "fused_loss", "fused_logprobs", "logits"],
                   help="tdrl only: GRPOLoss fwd+bwd at V=32,000, fused loss vs two-step vs logits")
    a = p.parse_args()
    if a.worker:
        return worker(a)
    if a.loss_step:
        return loss_step_table(a) if a.loss_step == "table" else loss_step(a)
    if a.profile and a.model is not None:  # the real model, chat prompts as in the side-by-side run
        from tdrl.llm.models import resolve_model

        a.model, a.chat = resolve_model(a.model), True
        return profile_stages(a)
    if a.profile:
        with tempfile.TemporaryDirectory() as tmp:
            prepare(tmp, a.sft_steps, a.seed, a.device)
            a.model = os.path.join(tmp, "sft")
            return profile_stages(a)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "TRANSFORMERS_VERBOSITY": "error"}
    if a.checkpointing_trade:
        return checkpointing_trade(a, env)
    real = a.model is not None
    with tempfile.TemporaryDirectory() as tmp:
        if real:
            from tdrl.llm.models import resolve_model

            folder = resolve_model(a.model)
        else:
            prepare(tmp, a.sft_steps, a.seed, a.device)
            folder = os.path.join(tmp, "sft")
        results: dict[str, list[dict]] = {"tdrl": [], "trl": []}
        for r in range(a.repeats):
            for side in ("tdrl", "trl"):
                out = os.path.join(tmp, f"{side}{r}.json")
                cmd = [*module_command(sys.executable, __spec__.name), "--worker", side, "--model", folder, "--out", out,
                       "--steps", str(a.steps), "--prompts", str(a.prompts), "--group", str(a.group),
                       "--max-new-tokens", str(a.max_new_tokens), "--lr", str(a.lr), "--seed", str(a.seed + r),
                       "--device", a.device] + ["--chat"] * real + ["--gradient-checkpointing"] * a.gradient_checkpointing
                subprocess.run(cmd, check=True, env=subprocess_env(env), stdout=subprocess.DEVNULL)
                with open(out) as f:
                    results[side].append(json.load(f))

    def summary(rs: list[dict]) -> dict:
        s_step = statistics.median(statistics.median(x["times"][1:]) for x in rs)
        tok_s = statistics.median(sum(x["tokens"][1:]) / sum(x["times"][1:]) for x in rs)
        rss = statistics.median(x["peak_rss_mb"] for x in rs)
        first = statistics.mean(statistics.mean(x["rewards"][:5]) for x in rs)
        last = statistics.mean(statistics.mean(x["rewards"][-5:]) for x in rs)
        return {"s/step": s_step, "tokens/s": tok_s, "peak RSS MB": rss, "reward first5": first, "reward last5": last}

    ours, theirs = summary(results["tdrl"]), summary(results["trl"])
    what = os.path.basename(os.path.normpath(a.model)) if real else "SFT-warmed tiny Qwen2"
    ckpt = "on" if a.gradient_checkpointing else "off"
    print(f"GRPO on {what}, {a.prompts} prompts x {a.group} completions, <= {a.max_new_tokens} new tokens, {a.steps} "
          f"steps (first excluded), {a.repeats} repeats (median), 1 torch thread, gradient checkpointing {ckpt} on both")
    print(f"{'metric':<16}{'tdrl':>12}{'TRL':>12}{'tdrl/TRL':>10}")
    for k in ours:
        ratio = ours[k] / theirs[k] if theirs[k] else float("nan")
        print(f"{k:<16}{ours[k]:>12.4f}{theirs[k]:>12.4f}{ratio:>10.2f}")
    speed, mem = theirs["s/step"] / ours["s/step"], ours["peak RSS MB"] / theirs["peak RSS MB"]
    print(f"speed-up (TRL s/step / tdrl s/step): {speed:.2f}x; peak RSS tdrl/TRL {mem:.2f}x")
    if a.record and real:
        import trl  # the peer's version, for the row's name
        from benchmarks.records import write_record

        peer = f"TRL {trl.__version__} GRPOTrainer"
        table = (f"GRPOTrainer vs {peer} on the real {what}, {a.prompts} prompts x {a.group} completions, "
                 f"{a.max_new_tokens} new tokens")
        note = ("Same cached model folder, chat prompts (operands 0..19) through its chat template, the same "
                "TRL-style reward, sampling T=1, lr, AdamW, cosine schedule, per-sequence loss mean (loss_type grpo), "
                f"no KL, one update per round, gradient checkpointing {ckpt} on both sides (TRL's default is on), "
                f"one torch thread, each side in its own process; {a.steps} steps, the first excluded, "
                f"{a.repeats} repeat(s). The issue's target: >= 3x TRL's steps/s at <= 0.6x its peak memory.")
        for side, res, name in (("tdrl", ours, "tdrl.llm GRPOTrainer"), ("trl", theirs, peer)):
            write_record("LLM (GRPO)", table, name, {
                "s/step": round(res["s/step"], 2), "tokens/s": round(res["tokens/s"]),
                "peak RSS MB": round(res["peak RSS MB"]),
            }, peer=peer if side == "tdrl" else None,
                ratio=f"{speed:.2f}x TRL's steps/s at {mem:.2f}x its peak RSS" if side == "tdrl" else None, note=note)


if __name__ == "__main__":
    main()
