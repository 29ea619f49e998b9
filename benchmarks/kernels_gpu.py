"""One-shot GPU check and benchmark of tdrl.kernels' Triton kernels (run on a CUDA machine).

    PYTHONPATH=packages/kernels/src python -m benchmarks.kernels_gpu   # from the root; OUT=dir to save

Needs only torch and triton (no tensordict, nothing installed: ``PYTHONPATH`` names the
kernels package's source). Two parts, each section guarded so one failure does not lose the rest:

1. correctness: every Triton kernel vs its torch reference on CUDA, forward and backward,
   small odd shapes, float32 and bfloat16; prints PASS/FAIL with the max errors;
2. speed and memory at LLM sizes: Triton vs the eager reference vs ``torch.compile``
   (plus the naive ``log_softmax`` + ``gather`` path for log-probs), median time from
   ``triton.testing.do_bench`` and peak extra memory from ``torch.cuda.max_memory_allocated``.

Prints a markdown table and writes it to ``$OUT/kernels_gpu.md`` when ``OUT`` is set.
Designed to finish in under 5 minutes on one H100/H200-class GPU.
"""

from __future__ import annotations

import functools
import os
import sys
import time

from benchmarks.gpu_harness import (  # noqa: E402 - the harness sets TRITON_INTERPRET before torch loads
    DEV,
    DRY,
    T0,
    bench_table,
    compiled,
    emit,
    flush_report,
    guarded,
    run_deferred,
)

import torch  # noqa: E402


# --------------------------------------------------------------------------- correctness
def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item() if a.numel() else 0.0


def check(name: str, pairs: list[tuple[str, torch.Tensor, torch.Tensor]], tol: float) -> None:
    errs = {k: max_err(a, b) for k, a, b in pairs}
    ok = all(e <= tol * max(1.0, max_abs) for (k, a, b), e in zip(pairs, errs.values(), strict=True)
             for max_abs in [b.float().abs().max().item() if b.numel() else 0.0])
    detail = ", ".join(f"{k} {e:.1e}" for k, e in errs.items())
    emit(f"| {name} | {'PASS' if ok else 'FAIL'} | {detail} |")


def pick(cases: tuple) -> tuple:
    """All cases on the GPU; only the largest in the CPU dry run (the interpreter is slow)."""
    return cases[-1:] if DRY else cases


def run_both(fn, inputs_fn):
    """fn under the torch reference and under Triton on fresh copies of the same inputs."""
    from tdrl.kernels import use_backend

    results = []
    for backend in ("torch", "triton"):
        with use_backend(backend):
            results.append(fn(*inputs_fn()))
    return results


def correctness() -> None:
    from tdrl.kernels import (
        discounted_cumsum,
        fused_linear_logprobs,
        gae,
        pg_token_loss,
        token_logprobs,
    )

    dev = DEV
    big_v = 5000 if DRY else 152064
    emit("\n## Correctness: Triton vs torch reference on CUDA\n")
    emit("| case | result | max abs error (output / gradients) |")
    emit("| --- | --- | --- |")
    tol = {torch.float32: 1e-4, torch.bfloat16: 2e-2}

    for dtype in pick((torch.float32, torch.bfloat16)):
        for shape in pick(((1, 1, 1), (37, 1, 1), (5, 300, 1), (3, 2, 129, 2))):
            g = torch.Generator(device="cpu").manual_seed(0)
            base = [torch.randn(shape, generator=g) for _ in range(4)]
            term = torch.rand(shape, generator=g) < 0.05
            done = term | (torch.rand(shape, generator=g) < 0.05)

            def inputs(base=base, term=term, done=done, dtype=dtype):
                r, v, nv, w = (x.to(dev, dtype) for x in base)
                return r.requires_grad_(True), v.requires_grad_(True), nv, done.to(dev), term.to(dev), w

            def run(r, v, nv, d, t, w):
                adv, target = gae(r, v, nv, d, t, 0.99, 0.95)
                cs = discounted_cumsum(r, 0.97, d)
                grads = torch.autograd.grad(((adv + target + cs) * w).float().sum(), (r, v))
                return adv, cs, *grads

            ref, tri = run_both(run, inputs)
            names = ("adv", "cumsum", "d_reward", "d_value")
            check(f"gae+cumsum {tuple(shape)} {dtype}", list(zip(names, tri, ref, strict=True)), tol[dtype])

    for dtype in pick((torch.float32, torch.bfloat16)):
        for b, t, v in pick(((1, 1, 37), (2, 3, 4099), (2, 5, big_v))):
            g = torch.Generator(device="cpu").manual_seed(1)
            logits0 = 3 * torch.randn(b, t, v, generator=g)
            tgt0 = torch.randint(0, v, (b, t), generator=g)
            tgt0[0, 0] = -100
            w0 = torch.randn(2, b, t, generator=g)

            def inputs(logits0=logits0, tgt0=tgt0, w0=w0, dtype=dtype):
                return logits0.to(dev, dtype).requires_grad_(True), tgt0.to(dev), w0.to(dev)

            def run(logits, tgt, w):
                logp, ent = token_logprobs(logits, tgt, temperature=0.8, return_entropy=True)
                (grad,) = torch.autograd.grad((logp * w[0] + ent * w[1]).sum(), logits)
                return logp, ent, grad

            ref, tri = run_both(run, inputs)
            check(f"token_logprobs B={b} T={t} V={v} {dtype}", list(zip(("logp", "entropy", "d_logits"), tri, ref, strict=True)), tol[dtype])

    for dtype in pick((torch.float32, torch.bfloat16)):
        for n, h, v, chunk in pick(((1, 64, 37, None), (37, 64, 4099, 8), (300, 256, big_v, 128))):
            g = torch.Generator(device="cpu").manual_seed(2)
            h0 = torch.randn(n, h, generator=g)
            w0 = torch.randn(v, h, generator=g) / h**0.5
            b0 = 0.1 * torch.randn(v, generator=g)
            t0 = torch.randint(0, v, (n,), generator=g)
            u0 = torch.randn(2, n, generator=g)

            def inputs(h0=h0, w0=w0, b0=b0, t0=t0, u0=u0, dtype=dtype):
                return (h0.to(dev, dtype).requires_grad_(True), w0.to(dev, dtype).requires_grad_(True),
                        b0.to(dev, dtype).requires_grad_(True), t0.to(dev), u0.to(dev))

            def run(hid, wt, bias, tgt, u, chunk=chunk):
                logp, ent = fused_linear_logprobs(hid, wt, tgt, bias=bias, temperature=1.1,
                                                  chunk_size=chunk, return_entropy=True)
                grads = torch.autograd.grad((logp * u[0] + ent * u[1]).sum(), (hid, wt, bias))
                return logp, ent, *grads

            ref, tri = run_both(run, inputs)
            names = ("logp", "entropy", "d_hidden", "d_weight", "d_bias")
            check(f"fused_linear N={n} H={h} V={v} {dtype}", list(zip(names, tri, ref, strict=True)), 5 * tol[dtype])

    for dtype in pick((torch.float32, torch.bfloat16)):
        for b, t, p_mask, per_tok in pick(((1, 1, 1.0, False), (5, 37, 0.7, True), (3, 1100, 0.7, False), (3, 6, 0.0, False))):
            for reduction in ("token", "sequence", "constant"):
                g = torch.Generator(device="cpu").manual_seed(3)
                lp0 = -3 * torch.rand(b, t, generator=g)
                old0 = lp0 + 0.3 * torch.randn(b, t, generator=g)
                ref0 = lp0 + 0.2 * torch.randn(b, t, generator=g)
                adv0 = torch.randn((b, t) if per_tok else (b,), generator=g)
                m0 = torch.rand(b, t, generator=g) < p_mask

                def inputs(lp0=lp0, old0=old0, ref0=ref0, adv0=adv0, m0=m0, dtype=dtype):
                    return (lp0.to(dev, dtype).requires_grad_(True), old0.to(dev), adv0.to(dev),
                            m0.to(dev), ref0.to(dev))

                def run(lp, old, adv, m, rf, reduction=reduction):
                    loss, st = pg_token_loss(lp, old, adv, m, rf, 0.2, 0.28, 0.05, reduction)
                    (grad,) = torch.autograd.grad(loss, lp)
                    return loss, grad, st["clip_frac"], st["kl"], st["ratio_mean"]

                ref, tri = run_both(run, inputs)
                names = ("loss", "d_logp", "clip_frac", "kl", "ratio_mean")
                check(f"pg_token_loss B={b} T={t} mask={p_mask} {reduction} {dtype}",
                      list(zip(names, tri, ref, strict=True)), 1e-4 if dtype == torch.float32 else 1e-2)


def correctness_fused_pg() -> None:
    """fused_linear_pg_loss: Triton rows vs torch rows, and vs the composed ops, on CUDA."""
    from tdrl.kernels import fused_linear_logprobs, fused_linear_pg_loss, pg_token_loss

    dev = DEV
    big_v = 5000 if DRY else 152064
    tol = {torch.float32: 1e-4, torch.bfloat16: 2e-2}
    for dtype in pick((torch.float32, torch.bfloat16)):
        for b, t, h, v, chunk, p_mask in pick(((1, 1, 64, 37, None, 1.0), (3, 5, 64, 4099, 4, 0.0),
                                              (4, 75, 256, big_v, 128, 0.7))):
            for reduction in ("token", "sequence", "constant"):
                g = torch.Generator(device="cpu").manual_seed(4)
                h0 = torch.randn(b, t, h, generator=g)
                w0 = torch.randn(v, h, generator=g) / h**0.5
                b0 = 0.1 * torch.randn(v, generator=g)
                t0 = torch.randint(0, v, (b, t), generator=g)
                with torch.no_grad():
                    lp0 = torch.log_softmax(h0 @ w0.t() + b0, -1).gather(-1, t0.unsqueeze(-1)).squeeze(-1)
                old0 = lp0 + 0.3 * torch.randn(b, t, generator=g)
                ref0 = lp0 + 0.2 * torch.randn(b, t, generator=g)
                adv0 = torch.randn(b, generator=g)
                m0 = torch.rand(b, t, generator=g) < p_mask

                def inputs(h0=h0, w0=w0, b0=b0, t0=t0, old0=old0, ref0=ref0, adv0=adv0, m0=m0, dtype=dtype):
                    return (h0.to(dev, dtype).requires_grad_(True), w0.to(dev, dtype).requires_grad_(True),
                            b0.to(dev, dtype).requires_grad_(True), t0.to(dev), old0.to(dev),
                            adv0.to(dev), m0.to(dev), ref0.to(dev))

                def run(hid, wt, bias, tgt, old, adv, m, rf, reduction=reduction, chunk=chunk):
                    loss, st = fused_linear_pg_loss(hid, wt, tgt, old, adv, m, rf, bias=bias, temperature=1.1,
                                                    eps_high=0.28, beta=0.05, reduction=reduction,
                                                    chunk_size=chunk)
                    grads = torch.autograd.grad(loss, (hid, wt, bias))
                    return loss, st["clip_frac"], st["kl"], st["ratio_mean"], *grads

                def run_composed(hid, wt, bias, tgt, old, adv, m, rf, reduction=reduction, chunk=chunk):
                    logp = fused_linear_logprobs(hid, wt, tgt, bias=bias, temperature=1.1, chunk_size=chunk)
                    loss, st = pg_token_loss(logp, old, adv, m, rf, 0.2, 0.28, 0.05, reduction)
                    grads = torch.autograd.grad(loss, (hid, wt, bias))
                    return loss, st["clip_frac"], st["kl"], st["ratio_mean"], *grads

                ref, tri = run_both(run, inputs)
                names = ("loss", "clip_frac", "kl", "ratio_mean", "d_hidden", "d_weight", "d_bias")
                label = f"B={b} T={t} H={h} V={v} mask={p_mask} {reduction} {dtype}"
                check(f"fused_linear_pg_loss triton vs torch {label}",
                      list(zip(names, tri, ref, strict=True)), 5 * tol[dtype])
                comp = run_composed(*inputs())
                check(f"fused_linear_pg_loss vs composed ops {label}",
                      list(zip(names, tri, comp, strict=True)), 5 * tol[dtype])


# --------------------------------------------------------------------------- benchmarks
def bench_pg_loss() -> None:
    from tdrl.kernels import pg_token_loss, pg_token_loss_reference, use_backend
    from tdrl.kernels.pg_loss.reference import pg_token_loss_eager

    b, t = (4, 64) if DRY else (256, 2048)
    g = torch.Generator(device=DEV).manual_seed(0)
    lp = (-3 * torch.rand(b, t, device=DEV, generator=g)).requires_grad_(True)
    old = lp.detach() + 0.3 * torch.randn(b, t, device=DEV, generator=g)
    ref = lp.detach() + 0.2 * torch.randn(b, t, device=DEV, generator=g)
    adv = torch.randn(b, device=DEV, generator=g)
    mask = torch.rand(b, t, device=DEV, generator=g) < 0.8
    comp = compiled(pg_token_loss_eager)

    def triton_loss(*args):
        with use_backend("triton"):
            return pg_token_loss(*args)

    def run(f):
        def go():
            loss, _ = f(lp, old, adv, mask, ref, 0.2, 0.28, 0.04, "sequence")
            torch.autograd.grad(loss, lp)
        return go

    bench_table(f"pg_token_loss fwd+bwd, B={b}, T={t}, float32, KL, sequence reduction", [
        ("eager reference", run(pg_token_loss_eager)),
        ("one-pass torch reference (analytic gradient)", run(pg_token_loss_reference)),
        ("triton", run(triton_loss)),
        ("torch.compile(eager reference)", run(comp)),
    ], "eager reference")


def bench_token_logprobs() -> None:
    from tdrl.kernels import token_logprobs, token_logprobs_reference, use_backend

    b, t, v = (1, 4, 5000) if DRY else (8, 512, 152064)
    g = torch.Generator(device=DEV).manual_seed(0)
    logits = torch.randn(b, t, v, device=DEV, dtype=torch.bfloat16, generator=g).requires_grad_(True)
    tgt = torch.randint(0, v, (b, t), device=DEV, generator=g)

    def naive(x, y):
        return torch.log_softmax(x.float(), -1).gather(-1, y.unsqueeze(-1)).squeeze(-1)

    comp = compiled(naive)

    def run(f, backend="auto"):
        def go():
            with use_backend(backend):
                out = f(logits, tgt)
            torch.autograd.grad(out.sum(), logits)
        return go

    bench_table(f"token_logprobs fwd+bwd, B={b}, T={t}, V={v}, bfloat16", [
        ("naive log_softmax+gather", run(naive)),
        ("reference (chunked torch)", run(token_logprobs_reference, "torch")),
        ("triton", run(token_logprobs, "triton")),
        ("torch.compile(naive)", run(comp)),
    ], "naive log_softmax+gather")


def lm_head_inputs(train_head: bool = True):
    """``(N, H, V, hidden, weight, targets)`` of the LM-head benchmarks, bf16, seed 0."""
    n, h, v = (8, 32, 5000) if DRY else (16384, 3584, 152064)
    g = torch.Generator(device=DEV).manual_seed(0)
    hidden = torch.randn(n, h, device=DEV, dtype=torch.bfloat16, generator=g).requires_grad_(True)
    weight = (torch.randn(v, h, device=DEV, generator=g) / h**0.5).to(torch.bfloat16).requires_grad_(train_head)
    return n, h, v, hidden, weight, torch.randint(0, v, (n,), device=DEV, generator=g)


def bench_fused_linear() -> None:
    from tdrl.kernels import fused_linear_logprobs, use_backend

    n, h, v, hidden, weight, tgt = lm_head_inputs()

    def naive(x, w, y):
        return torch.log_softmax((x @ w.t()).float(), -1).gather(-1, y.unsqueeze(-1)).squeeze(-1)

    comp = compiled(naive)

    def run(f, backend="auto"):
        def go():
            with use_backend(backend):
                out = f(hidden, weight, tgt)
            torch.autograd.grad(out.sum(), (hidden, weight))
        return go

    bench_table(f"fused_linear_logprobs fwd+bwd, N={n}, H={h}, V={v}, bfloat16", [
        ("naive matmul+log_softmax+gather", run(naive)),
        ("reference (chunked torch)", run(fused_linear_logprobs, "torch")),
        ("triton", run(fused_linear_logprobs, "triton")),
        # Chunk-size sweep (default: 2048 rows at V=152,064): does a bigger matmul help?
        *[(f"triton chunk_size={c}", run(functools.partial(fused_linear_logprobs, chunk_size=c), "triton"))
          for c in ((256,) if DRY else (1024, 4096, 8192))],
        ("torch.compile(naive)", run(comp)),
    ], "naive matmul+log_softmax+gather")


def bench_fused_linear_frozen() -> None:
    """LoRA-style frozen LM head: gradients to the hidden states only (2 matmuls each way)."""
    from tdrl.kernels import fused_linear_logprobs, use_backend

    n, h, v, hidden, weight, tgt = lm_head_inputs(train_head=False)

    def naive(x, w, y):
        return torch.log_softmax((x @ w.t()).float(), -1).gather(-1, y.unsqueeze(-1)).squeeze(-1)

    def run(f, backend="auto"):
        def go():
            with use_backend(backend):
                out = f(hidden, weight, tgt)
            torch.autograd.grad(out.sum(), (hidden,))
        return go

    bench_table(f"fused_linear_logprobs fwd+bwd, frozen head, N={n}, H={h}, V={v}, bfloat16", [
        ("naive matmul+log_softmax+gather", run(naive)),
        ("triton (frozen head: 2 matmuls)", run(fused_linear_logprobs, "triton")),
    ], "naive matmul+log_softmax+gather")


def bench_fused_cross_entropy() -> None:
    """The SFT loss from hidden states: naive full logits + F.cross_entropy vs the fused ops."""
    from tdrl.kernels import fused_linear_cross_entropy, fused_linear_logprobs, use_backend

    n, h, v, hidden, weight, tgt = lm_head_inputs()
    tgt[torch.rand(n, device=DEV, generator=torch.Generator(device=DEV).manual_seed(1)) >= 0.9] = -100

    def naive(x, w, y):
        return torch.nn.functional.cross_entropy((x @ w.t()).float(), y, ignore_index=-100)

    def composed(x, w, y):
        keep = (y >= 0).float()
        return -(fused_linear_logprobs(x, w, y) * keep).sum() / keep.sum()

    comp = compiled(naive)

    def run(f, backend="auto"):
        def go():
            with use_backend(backend):
                loss = f(hidden, weight, tgt)
            torch.autograd.grad(loss, (hidden, weight))
        return go

    bench_table(f"fused_linear_cross_entropy fwd+bwd, N={n} (90% kept), H={h}, V={v}, bfloat16", [
        ("naive matmul+cross_entropy", run(naive)),
        ("reference (chunked torch, 3 matmuls)", run(fused_linear_cross_entropy, "torch")),
        ("triton (3 matmuls)", run(fused_linear_cross_entropy, "triton")),
        ("triton fused_linear_logprobs + masked mean (4 matmuls)", run(composed, "triton")),
        ("torch.compile(naive)", run(comp)),
    ], "naive matmul+cross_entropy")


def bench_fused_pg_loss() -> None:
    """GRPO-style loss from hidden states: naive full logits vs the two fused variants."""
    from tdrl.kernels import fused_linear_logprobs, fused_linear_pg_loss, pg_token_loss, use_backend

    b, t, h, v = (2, 4, 32, 5000) if DRY else (16, 1024, 3584, 152064)
    g = torch.Generator(device=DEV).manual_seed(0)
    hidden = torch.randn(b, t, h, device=DEV, dtype=torch.bfloat16, generator=g).requires_grad_(True)
    weight = (torch.randn(v, h, device=DEV, generator=g) / h**0.5).to(torch.bfloat16).requires_grad_(True)
    tgt = torch.randint(0, v, (b, t), device=DEV, generator=g)
    with torch.no_grad():
        lp0 = fused_linear_logprobs(hidden, weight, tgt)
    old = lp0 + 0.3 * torch.randn(b, t, device=DEV, generator=g)
    ref = lp0 + 0.2 * torch.randn(b, t, device=DEV, generator=g)
    adv = torch.randn(b, device=DEV, generator=g)
    mask = torch.rand(b, t, device=DEV, generator=g) < 0.9
    kw = dict(eps_low=0.2, eps_high=0.28, beta=0.04, reduction="token")

    def naive(x, w, y):
        return torch.log_softmax((x @ w.t()).float(), -1).gather(-1, y.unsqueeze(-1)).squeeze(-1)

    comp = compiled(naive)

    def run_logp(f, backend="auto"):
        def go():
            with use_backend(backend):
                loss, _ = pg_token_loss(f(hidden, weight, tgt), old, adv, mask, ref, **kw)
            torch.autograd.grad(loss, (hidden, weight))
        return go

    def run_fused(backend, chunk_size=None):
        def go():
            with use_backend(backend):
                loss, _ = fused_linear_pg_loss(hidden, weight, tgt, old, adv, mask, ref,
                                               chunk_size=chunk_size, **kw)
            torch.autograd.grad(loss, (hidden, weight))
        return go

    bench_table(f"PG loss from hidden states fwd+bwd, B={b}, T={t}, H={h}, V={v}, bfloat16, KL", [
        ("naive matmul+log_softmax+gather -> pg_token_loss", run_logp(naive)),
        ("fused_linear_logprobs (triton) -> pg_token_loss", run_logp(fused_linear_logprobs, "triton")),
        ("fused_linear_pg_loss (triton, grads in forward)", run_fused("triton")),
        ("fused_linear_pg_loss (triton, chunk_size=4096)", run_fused("triton", 256 if DRY else 4096)),
        ("fused_linear_pg_loss (torch rows)", run_fused("torch")),
        ("torch.compile(naive) -> pg_token_loss", run_logp(comp)),
    ], "naive matmul+log_softmax+gather -> pg_token_loss")


def bench_gae() -> None:
    from tdrl.kernels import gae_reference
    from tdrl.kernels.scan.reference import gae_impl
    from tdrl.kernels.scan.triton import reverse_scan_rows_triton

    envs, steps = (8, 300) if DRY else (4096, 1024)
    g = torch.Generator(device=DEV).manual_seed(0)
    r, v, nv = (torch.randn(envs, steps, 1, device=DEV, generator=g) for _ in range(3))
    term = torch.rand(envs, steps, 1, device=DEV, generator=g) < 0.01
    done = term | (torch.rand(envs, steps, 1, device=DEV, generator=g) < 0.01)

    def triton_gae(*a):
        return gae_impl(*a, scan_fn=reverse_scan_rows_triton)

    comp = compiled(gae_reference)

    def run(f):
        return lambda: f(r, v, nv, done, term, 0.99, 0.95)

    bench_table(f"gae forward, {envs} envs x {steps} steps, float32", [
        ("reference (chunked torch)", run(gae_reference)),
        ("triton", run(triton_gae)),
        ("torch.compile(reference)", run(comp)),
    ], "reference (chunked torch)")


def main() -> int:
    if not (DRY or torch.cuda.is_available()):
        print("No CUDA device: this script checks and benchmarks the Triton kernels on a GPU.")
        return 1
    import triton

    os.environ.setdefault("TDRL_KERNELS", "auto")
    emit("# tdrl.kernels on GPU\n")
    device_name = "CPU dry run (TRITON_INTERPRET=1)" if DRY else torch.cuda.get_device_name()
    emit(f"device: {device_name}, torch {torch.__version__}, triton {triton.__version__}; "
         f"command: python -m benchmarks.kernels_gpu")
    guarded("correctness", correctness)
    guarded("correctness fused_linear_pg_loss", correctness_fused_pg)
    emit("\n## Benchmarks (median of triton.testing.do_bench; peak = max_memory_allocated above inputs)")
    guarded("pg_token_loss", bench_pg_loss)
    guarded("token_logprobs", bench_token_logprobs)
    guarded("fused_linear_pg_loss", bench_fused_pg_loss)
    guarded("fused_linear_logprobs", bench_fused_linear)
    guarded("fused_linear_logprobs frozen head", bench_fused_linear_frozen)
    guarded("fused_linear_cross_entropy", bench_fused_cross_entropy)
    guarded("gae", bench_gae)
    guarded("torch.compile variants", run_deferred)
    emit(f"\ntotal wall time {time.time() - T0:.0f} s")
    flush_report()
    return 0


if __name__ == "__main__":
    sys.exit(main())
