"""CPU benchmarks of tdrl.kernels against the peers, side by side, one torch thread.

Not named kernels.py: it would shadow Hugging Face's ``kernels``, which transformers imports.

Run (peers live in .venv-bench, built by benchmarks/setup_peers.sh):

    flock /tmp/tdrl-cpu.lock .venv-bench/bin/python -m benchmarks.kernels_cpu

* GAE, 256 envs x 1024 steps: ``tdrl.kernels.gae`` vs TorchRL 0.14.1's
  ``generalized_advantage_estimate`` and ``vec_generalized_advantage_estimate``, and vs a
  plain reverse loop over time.
* PG token loss, B=64, T=2048, forward + backward: ``tdrl.kernels.pg_token_loss`` (its
  torch reference on CPU) vs a naive eager per-token loss and vs ``torch.compile``.
* Token log-probs, B=8, T=512, V=32,000, forward + backward: time and peak memory vs
  ``log_softmax`` + ``gather``.
* Fused linear log-prob, N=4096, H=1024, V=32,000, forward + backward: time and peak memory
  vs ``hidden @ W.T`` -> ``log_softmax`` -> ``gather``.
* Fused linear PG loss (``--only fusedpg``), B=8, T=256, H=512, V=32,000, 80% of tokens in
  the mask, KL, sequence reduction, forward + backward: ``fused_linear_pg_loss`` (3 matmuls,
  gradients in the forward) vs ``fused_linear_logprobs`` + ``pg_token_loss`` (4 matmuls) vs
  full logits -> ``log_softmax`` -> ``gather`` -> the eager loss; time and peak memory.
* Fused linear cross-entropy (``--only ce``, the SFT loss), N=2048 tokens (80% in the mask),
  H=512, V=32,000, forward + backward: ``fused_linear_cross_entropy`` (3 matmuls, gradients in
  the forward) vs ``fused_linear_logprobs`` + masked mean (4 matmuls, the previous SFT path)
  vs full logits -> ``F.cross_entropy`` (what Hugging Face / TRL's SFT computes); time and
  peak memory.
* Fused linear log-prob with a frozen LM head (``--only frozen``; LoRA / adapters: only the
  hidden states need a gradient), N=4096, H=1024, V=32,000, forward + backward:
  ``fused_linear_logprobs`` (2 matmuls: ``d logp / d hidden`` formed in the forward) vs the
  same op forced through its recomputing backward (3 matmuls) vs the naive full-logits path
  (2 matmuls); time and peak memory.

Peak memory is the peak RSS (``VmHWM``, reset through ``/proc/self/clear_refs`` once the
inputs exist) of a fresh subprocess minus its RSS at that point, so each figure is the extra memory one forward + backward needs (gradients
included). Times are medians over repeats.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

import torch

from tdrl.kernels import (
    fused_linear_cross_entropy,
    fused_linear_logprobs,
    fused_linear_pg_loss,
    gae,
    pg_token_loss,
    token_logprobs,
)
from benchmarks.records import module_command, subprocess_env


def median_ms(fn, repeats: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS counter (VmHWM) of this process (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def rss_mb() -> float:
    return _status_mb("VmRSS")


def peak_rss_mb() -> float:
    try:
        return _status_mb("VmHWM")
    except (OSError, RuntimeError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def table(title: str, rows: list[tuple[str, float, str]], unit: str) -> None:
    print(f"\n### {title}\n")
    print(f"| implementation | {unit} | ratio vs tdrl |")
    print("| --- | ---: | ---: |")
    ours = rows[0][1]
    for name, value, note in rows:
        ratio = f"{value / ours:.2f}x" if value == value else "n/a"
        print(f"| {name}{note} | {value:.1f} | {ratio} |", flush=True)


# ----------------------------------------------------------------------------- GAE
def plain_reverse_loop(reward, value, next_value, done, terminated, gamma, lmbda):
    not_done, not_term = (~done).float(), (~terminated).float()
    adv = torch.empty_like(reward)
    last = torch.zeros_like(reward[..., 0, :])
    for t in range(reward.shape[-2] - 1, -1, -1):
        delta = reward[..., t, :] + gamma * next_value[..., t, :] * not_term[..., t, :] - value[..., t, :]
        last = delta + gamma * lmbda * not_done[..., t, :] * last
        adv[..., t, :] = last
    return adv, adv + value


def bench_gae(n_envs: int, steps: int, repeats: int) -> None:
    g = torch.Generator().manual_seed(0)
    r, v, nv = (torch.randn(n_envs, steps, 1, generator=g) for _ in range(3))
    term = torch.rand(n_envs, steps, 1, generator=g) < 0.01
    done = term | (torch.rand(n_envs, steps, 1, generator=g) < 0.01)
    args = (r, v, nv, done, term, 0.99, 0.95)
    ours_adv = gae(*args)[0]
    rows = [("tdrl.kernels.gae", median_ms(lambda: gae(*args), repeats), "")]
    loop_adv = plain_reverse_loop(*args)[0]
    assert torch.allclose(ours_adv, loop_adv, atol=1e-4), "gae differs from the plain loop"
    rows.append(("plain reverse loop", median_ms(lambda: plain_reverse_loop(*args), repeats), ""))
    try:
        from torchrl.objectives.value.functional import (
            generalized_advantage_estimate,
            vec_generalized_advantage_estimate,
        )
    except ImportError:
        print("(torchrl not importable: run with .venv-bench/bin/python for the peer figures)")
    else:
        targs = (0.99, 0.95, v, nv, r, done, term)
        for name, fn, reps in (
            ("torchrl generalized_advantage_estimate", generalized_advantage_estimate, repeats),
            ("torchrl vec_generalized_advantage_estimate", vec_generalized_advantage_estimate, max(3, repeats // 5)),
        ):
            err = (fn(*targs)[0] - ours_adv).abs().max().item()
            rows.append((name, median_ms(lambda fn=fn: fn(*targs), reps), f" (max diff {err:.1e})"))
    table(f"GAE, {n_envs} envs x {steps} steps, float32 (median ms)", rows, "ms")
    peers = [v for n, v, _ in rows if n.startswith("torchrl")]
    if peers:
        print(f"\nspeed-up vs TorchRL's fastest: {min(peers) / rows[0][1]:.2f}x; "
              f"vs plain loop: {rows[1][1] / rows[0][1]:.2f}x", flush=True)


# ----------------------------------------------------------------------------- log-probs
def naive_token_logprobs(logits, targets):
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def naive_fused(hidden, weight, targets):
    return naive_token_logprobs(hidden @ weight.t(), targets)


def make_case(case: str, size: dict):
    g = torch.Generator().manual_seed(0)
    if case == "fusedpg":
        b, t_len, h, v = size["B"], size["T"], size["H"], size["V"]
        hidden = torch.randn(b, t_len, h, generator=g).requires_grad_(True)
        weight = (torch.randn(v, h, generator=g) / h**0.5).requires_grad_(True)
        targets = torch.randint(0, v, (b, t_len), generator=g)
        with torch.no_grad():
            lp = fused_linear_logprobs(hidden, weight, targets)
        old = lp + 0.3 * torch.randn(b, t_len, generator=g)
        ref = lp + 0.2 * torch.randn(b, t_len, generator=g)
        adv = torch.randn(b, generator=g)
        mask = torch.rand(b, t_len, generator=g) < 0.8
        return (hidden, weight, targets, old, adv, mask, ref), (hidden, weight)
    if case == "ce":
        hidden = torch.randn(size["N"], size["H"], generator=g).requires_grad_(True)
        weight = (torch.randn(size["V"], size["H"], generator=g) / size["H"] ** 0.5).requires_grad_(True)
        targets = torch.randint(0, size["V"], (size["N"],), generator=g)
        targets[torch.rand(size["N"], generator=g) >= 0.8] = -100  # prompt / padding tokens
        return (hidden, weight, targets), (hidden, weight)
    if case == "frozen":
        hidden = torch.randn(size["N"], size["H"], generator=g).requires_grad_(True)
        weight = torch.randn(size["V"], size["H"], generator=g) / size["H"] ** 0.5
        targets = torch.randint(0, size["V"], (size["N"],), generator=g)
        return (hidden, weight, targets), (hidden,)
    if case == "logprobs":
        logits = torch.randn(size["B"], size["T"], size["V"], generator=g).requires_grad_(True)
        targets = torch.randint(0, size["V"], (size["B"], size["T"]), generator=g)
        return (logits, targets), (logits,)
    hidden = torch.randn(size["N"], size["H"], generator=g).requires_grad_(True)
    weight = (torch.randn(size["V"], size["H"], generator=g) / size["H"] ** 0.5).requires_grad_(True)
    targets = torch.randint(0, size["V"], (size["N"],), generator=g)
    return (hidden, weight, targets), (hidden, weight)


PG_KW = dict(eps_low=0.2, eps_high=0.28, beta=0.04, reduction="sequence")


def fused_pg(hidden, weight, targets, old, adv, mask, ref):
    return fused_linear_pg_loss(hidden, weight, targets, old, adv, mask, ref, **PG_KW)[0]


def composed_pg(hidden, weight, targets, old, adv, mask, ref):
    return pg_token_loss(fused_linear_logprobs(hidden, weight, targets), old, adv, mask, ref, **PG_KW)[0]


def naive_full_pg(hidden, weight, targets, old, adv, mask, ref):
    logp = naive_fused(hidden, weight, targets)
    return naive_pg_loss(logp, old, adv, mask, ref, PG_KW["eps_low"], PG_KW["eps_high"], PG_KW["beta"],
                         PG_KW["reduction"])[0]


def recomputing_fused(hidden, weight, targets):
    """``fused_linear_logprobs`` forced through the recomputing backward (the frozen-head
    shortcut off): what the op cost with a frozen head before the shortcut."""
    from tdrl.kernels.fused_linear.reference import FusedLinearLogprobsFunction
    from tdrl.kernels.logprobs.reference import default_chunk_rows, rows_backward, rows_forward

    chunk = default_chunk_rows(hidden.shape[0], weight.shape[0], hidden.device)
    return FusedLinearLogprobsFunction.apply(
        hidden, weight, None, targets, 1.0, False, chunk, rows_forward, rows_backward, False
    )


def composed_ce(hidden, weight, targets):
    logp = fused_linear_logprobs(hidden, weight, targets)
    keep = (targets >= 0).float()
    return -(logp * keep).sum() / keep.sum()


def naive_ce(hidden, weight, targets):
    return torch.nn.functional.cross_entropy(hidden @ weight.t(), targets, ignore_index=-100)


IMPLS = {
    ("ce", "tdrl"): fused_linear_cross_entropy,
    ("ce", "composed"): composed_ce,
    ("ce", "naive"): naive_ce,
    ("frozen", "tdrl"): fused_linear_logprobs,
    ("frozen", "recompute"): recomputing_fused,
    ("frozen", "naive"): naive_fused,
    ("fusedpg", "tdrl"): fused_pg,
    ("fusedpg", "composed"): composed_pg,
    ("fusedpg", "naive"): naive_full_pg,
    ("logprobs", "tdrl"): token_logprobs,
    ("logprobs", "naive"): naive_token_logprobs,
    ("fused", "tdrl"): fused_linear_logprobs,
    ("fused", "naive"): naive_fused,
}


def fwd_bwd(case: str, impl: str, inputs, params) -> None:
    out = IMPLS[(case, impl)](*inputs)
    grads = torch.autograd.grad(out.sum(), params)  # a scalar loss: sum() is the identity
    del out, grads


def memory_child(case: str, impl: str, size: dict) -> None:
    """Runs in a fresh process: prints the extra peak RSS (MiB) of one forward + backward."""
    torch.set_num_threads(1)
    inputs, params = make_case(case, size)
    reset_peak_rss()
    base = rss_mb()
    fwd_bwd(case, impl, inputs, params)
    print(json.dumps({"extra_mb": peak_rss_mb() - base}))


def measure_memory(case: str, impl: str, size: dict) -> float:
    cmd = [*module_command(sys.executable, __spec__.name), "--mem-child", case, impl, json.dumps(size)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=subprocess_env()).stdout
    return json.loads(out.strip().splitlines()[-1])["extra_mb"]


def bench_memory_case(case: str, size: dict, repeats: int, title: str) -> None:
    inputs, params = make_case(case, size)
    ours = IMPLS[(case, "tdrl")](*inputs)
    ref = IMPLS[(case, "naive")](*inputs)
    err = (ours - ref).abs().max().item()
    del ours, ref
    times = {impl: median_ms(lambda impl=impl: fwd_bwd(case, impl, inputs, params), repeats)
             for impl in ("tdrl", "naive")}
    mem = {impl: measure_memory(case, impl, size) for impl in ("tdrl", "naive")}
    print(f"\n### {title} (forward + backward; max |diff| {err:.1e})\n")
    print("| implementation | median ms | ratio | peak extra RSS MiB | ratio |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for impl, name in (("tdrl", f"tdrl.kernels ({case})"), ("naive", "naive log_softmax + gather")):
        print(f"| {name} | {times[impl]:.0f} | {times[impl] / times['tdrl']:.2f}x | "
              f"{mem[impl]:.0f} | {mem[impl] / max(mem['tdrl'], 1e-9):.2f}x |", flush=True)
    print(f"\nmemory: tdrl uses {mem['naive'] / max(mem['tdrl'], 1e-9):.1f}x less than naive; "
          f"time ratio naive/tdrl {times['naive'] / times['tdrl']:.2f}", flush=True)


def bench_fused_pg(size: dict, repeats: int) -> None:
    """fused_linear_pg_loss vs the composed ops vs the naive full-logits path."""
    inputs, params = make_case("fusedpg", size)
    losses = {impl: IMPLS[("fusedpg", impl)](*inputs) for impl in ("tdrl", "composed", "naive")}
    grads = {impl: torch.autograd.grad(loss, params) for impl, loss in losses.items()}
    err = max(max(abs(losses[i].item() - losses["naive"].item()),
                  *((a - b).abs().max().item() for a, b in zip(grads[i], grads["naive"])))
              for i in ("tdrl", "composed"))
    del losses, grads
    impls = (("tdrl", "tdrl.kernels.fused_linear_pg_loss (3 matmuls, grads in forward)"),
             ("composed", "fused_linear_logprobs + pg_token_loss (4 matmuls)"),
             ("naive", "full logits -> log_softmax -> gather -> eager loss"))
    time_and_memory_table(
        "fusedpg", impls, inputs, params, size, repeats,
        f"Fused linear PG loss B={size['B']}, T={size['T']}, H={size['H']}, V={size['V']}, "
        f"float32, KL, sequence reduction (forward + backward; max |diff| loss/grads vs naive {err:.1e})",
    )


def time_and_memory_table(case, impls, inputs, params, size, repeats, title) -> None:
    """Median time and peak extra RSS of each ``(impl, name)``, as ratios to the first."""
    times = {i: median_ms(lambda i=i: fwd_bwd(case, i, inputs, params), repeats) for i, _ in impls}
    mem = {i: measure_memory(case, i, size) for i, _ in impls}
    first = impls[0][0]
    print(f"\n### {title}\n")
    print("| implementation | median ms | ratio | peak extra RSS MiB | ratio |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for i, name in impls:
        print(f"| {name} | {times[i]:.0f} | {times[i] / times[first]:.2f}x | "
              f"{mem[i]:.0f} | {mem[i] / max(mem[first], 1e-9):.2f}x |", flush=True)


def bench_ce(size: dict, repeats: int) -> None:
    """fused_linear_cross_entropy vs fused log-probs + masked mean vs full logits + F.cross_entropy."""
    inputs, params = make_case("ce", size)
    impls = (("tdrl", "tdrl.kernels.fused_linear_cross_entropy (3 matmuls, grads in forward)"),
             ("composed", "fused_linear_logprobs + masked mean (4 matmuls)"),
             ("naive", "full logits -> F.cross_entropy (HF / TRL SFT)"))
    outs = {}
    for i, _ in impls:
        loss = IMPLS[("ce", i)](*inputs)
        outs[i] = (loss.detach(), torch.autograd.grad(loss, params))
    err = max(max((outs[i][0] - outs["naive"][0]).abs().item(),
                  *((a - b).abs().max().item() for a, b in zip(outs[i][1], outs["naive"][1])))
              for i in ("tdrl", "composed"))
    del outs
    time_and_memory_table(
        "ce", impls, inputs, params, size, repeats,
        f"Fused linear cross-entropy N={size['N']} (80% of tokens kept), H={size['H']}, V={size['V']}, "
        f"float32 (forward + backward; max |diff| loss/grads vs naive {err:.1e})",
    )


def bench_frozen(size: dict, repeats: int) -> None:
    """Frozen LM head: the 2-matmul fused path vs its recomputing backward vs naive."""
    inputs, params = make_case("frozen", size)
    impls = (("tdrl", "tdrl.kernels.fused_linear_logprobs, frozen head (2 matmuls)"),
             ("recompute", "same op, recomputing backward (3 matmuls)"),
             ("naive", "naive matmul -> log_softmax -> gather (2 matmuls)"))
    g = torch.randn(size["N"], generator=torch.Generator().manual_seed(1))
    outs = {}
    for i, _ in impls:
        logp = IMPLS[("frozen", i)](*inputs)
        outs[i] = (logp.detach(), torch.autograd.grad((logp * g).sum(), params)[0])
    err = max(max((outs[i][0] - outs["naive"][0]).abs().max().item(),
                  (outs[i][1] - outs["naive"][1]).abs().max().item()) for i in ("tdrl", "recompute"))
    del outs
    time_and_memory_table(
        "frozen", impls, inputs, params, size, repeats,
        f"Fused linear log-prob, frozen LM head, N={size['N']}, H={size['H']}, V={size['V']}, "
        f"float32 (forward + backward to hidden; max |diff| log-probs/grad vs naive {err:.1e})",
    )


# ----------------------------------------------------------------------------- pg loss
def naive_pg_loss(logp, old_logp, advantages, mask, ref_logp, eps_low, eps_high, beta, reduction):
    """The per-token PPO/GRPO loss as written in TRL-style trainers: eager ops, no fusion."""
    ratio = torch.exp(logp - old_logp)
    adv = advantages.unsqueeze(1)
    per_token = -torch.min(ratio * adv, torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * adv)
    kl = torch.exp(ref_logp - logp) - (ref_logp - logp) - 1
    per_token = per_token + beta * kl
    m = mask.float()
    if reduction == "sequence":
        loss = ((per_token * m).sum(-1) / m.sum(-1).clamp(min=1)).mean()
    else:
        loss = (per_token * m).sum() / m.sum().clamp(min=1)
    with torch.no_grad():
        n = m.sum().clamp(min=1)
        clipped = ((ratio < 1 - eps_low) & (adv < 0)) | ((ratio > 1 + eps_high) & (adv > 0))
        stats = {"clip_frac": (clipped * m).sum() / n, "kl": (kl * m).sum() / n,
                 "ratio_mean": (ratio * m).sum() / n}
    return loss, stats


def bench_pg_loss(b: int, t_len: int, repeats: int, with_compile: bool) -> None:
    from tdrl.kernels import pg_token_loss
    from tdrl.kernels.pg_loss.reference import pg_token_loss_eager

    g = torch.Generator().manual_seed(0)
    logp = (-3 * torch.rand(b, t_len, generator=g)).requires_grad_(True)
    old = logp.detach() + 0.3 * torch.randn(b, t_len, generator=g)
    ref = logp.detach() + 0.2 * torch.randn(b, t_len, generator=g)
    adv = torch.randn(b, generator=g)
    mask = torch.rand(b, t_len, generator=g) < 0.8
    args = (logp, old, adv, mask, ref, 0.2, 0.28, 0.04, "sequence")

    def run(fn):
        def go():
            loss, _ = fn(*args)
            torch.autograd.grad(loss, logp)
        return go

    ours, naive = pg_token_loss(*args), naive_pg_loss(*args)
    err = max(abs(ours[0].item() - naive[0].item()),
              *(abs(ours[1][k].item() - naive[1][k].item()) for k in ours[1]))
    rows = [("tdrl.kernels.pg_token_loss (torch reference on CPU)", median_ms(run(pg_token_loss), repeats), ""),
            ("naive per-token loss (eager, TRL-style)", median_ms(run(naive_pg_loss), repeats), ""),
            ("tdrl pg_token_loss_eager (same loss, autograd through eager ops)",
             median_ms(run(pg_token_loss_eager), repeats), "")]
    if with_compile:
        try:
            from tdrl.kernels import use_backend

            def compiled(*a):
                with use_backend("compile"):  # the library's own compile path
                    return pg_token_loss(*a)

            t0 = time.perf_counter()
            run(compiled)()
            compile_s = time.perf_counter() - t0
            rows.append(("pg_token_loss, TDRL_KERNELS=compile (torch.compile of the reference)",
                         median_ms(run(compiled), repeats), f" (compile {compile_s:.0f} s)"))
        except Exception as exc:  # no C++ toolchain, etc.: report and go on
            print(f"(torch.compile skipped: {type(exc).__name__}: {str(exc)[:120]})")
    table(f"pg_token_loss fwd+bwd, B={b}, T={t_len}, float32, KL, sequence reduction "
          f"(median ms; max |diff| loss/stats vs naive {err:.1e})", rows, "ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    parser.add_argument("--only", default="gae,pg,logprobs,fused,fusedpg,ce,frozen", help="comma-separated sections")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile row")
    parser.add_argument("--mem-child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mem_child:
        case, impl, size = args.mem_child
        memory_child(case, impl, json.loads(size))
        return
    torch.set_num_threads(1)
    only = set(args.only.split(","))
    print(f"torch {torch.__version__}, 1 thread; command: {' '.join(sys.argv)}", flush=True)
    if "gae" in only:
        bench_gae(*((64, 256, 5) if args.quick else (256, 1024, 15)))
    if "pg" in only:
        bench_pg_loss(*((8, 128, 5) if args.quick else (64, 2048, 15)), with_compile=not args.no_compile)
    if "logprobs" in only:
        size = dict(B=2, T=64, V=4000) if args.quick else dict(B=8, T=512, V=32000)
        bench_memory_case("logprobs", size, 3, f"Token log-probs B={size['B']}, T={size['T']}, V={size['V']}")
    if "fused" in only:
        size = dict(N=256, H=128, V=4000) if args.quick else dict(N=4096, H=1024, V=32000)
        bench_memory_case("fused", size, 2, f"Fused linear log-prob N={size['N']}, H={size['H']}, V={size['V']}")
    if "fusedpg" in only:
        size = dict(B=2, T=64, H=64, V=4000) if args.quick else dict(B=8, T=256, H=512, V=32000)
        bench_fused_pg(size, 2 if args.quick else 3)
    if "ce" in only:
        size = dict(N=256, H=64, V=4000) if args.quick else dict(N=2048, H=512, V=32000)
        bench_ce(size, 2 if args.quick else 3)
    if "frozen" in only:
        size = dict(N=256, H=128, V=4000) if args.quick else dict(N=4096, H=1024, V=32000)
        bench_frozen(size, 2 if args.quick else 3)


if __name__ == "__main__":
    main()
