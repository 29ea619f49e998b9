"""The measuring harness of ``benchmarks/kernels_gpu.py``: time budget, guarded sections, the
markdown report (printed and saved to ``$OUT/kernels_gpu.md``), median time and peak memory of
a callable, comparison tables and the deferred ``torch.compile`` rows.

Import it before torch: ``KERNELS_GPU_DRYRUN=1`` (tiny sizes on the CPU) turns on Triton's
interpreter, which must be set before triton is imported.
"""

from __future__ import annotations

import os
import time
import traceback
from pathlib import Path

# KERNELS_GPU_DRYRUN=1: tiny sizes on the CPU with Triton's interpreter, to test this script.
DRY = os.environ.get("KERNELS_GPU_DRYRUN") == "1"
if DRY:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402 - after TRITON_INTERPRET

DEV = "cpu" if DRY else "cuda"
T0 = time.time()
BUDGET_S = 270.0  # stop starting new work after this (the whole run must stay under 5 min)
LINES: list[str] = []


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def emit(line: str) -> None:
    """A line of the markdown report: printed now, saved at every flush_report()."""
    LINES.append(line)
    print(line, flush=True)


def flush_report() -> None:
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        Path(out, "kernels_gpu.md").write_text("\n".join(LINES) + "\n")


def time_left() -> float:
    return BUDGET_S - (time.time() - T0)


def guarded(name: str, fn) -> None:
    if time_left() < 5:
        emit(f"\n{name}: SKIPPED (time budget spent)")
        return
    log(f"--- {name}")
    try:
        fn()
    except Exception as exc:  # keep going: one section must not lose the others
        emit(f"\n{name}: ERROR {type(exc).__name__}: {str(exc)[:300]}")
        traceback.print_exc()
    finally:
        empty_cache()
        flush_report()


def empty_cache() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()



# --------------------------------------------------------------------------- measuring
def do_bench_ms(fn) -> float:
    try:
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=50, rep=300, return_mode="median"))
    except Exception:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(10):
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        return sorted(times)[len(times) // 2]


def measure(fn) -> tuple[float, float]:
    """(median ms, peak extra MB over what was allocated before the call)."""
    fn()  # warm-up (and compile)
    if DRY:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3, 0.0
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    return do_bench_ms(fn), peak


RESULTS: dict[tuple[str, str], tuple[float, float]] = {}
DEFERRED: list[tuple[str, str, object, str]] = []  # torch.compile variants, run last


def _header(title: str, baseline: str) -> None:
    emit(f"\n### {title}\n")
    emit(f"| variant | median ms | peak extra MiB | speed-up vs {baseline} | memory vs {baseline} |")
    emit("| --- | ---: | ---: | ---: | ---: |")


def _measure_row(title: str, name: str, fn, baseline: str) -> None:
    if time_left() < 10 or (name.startswith("torch.compile") and time_left() < 45):
        emit(f"| {name} | skipped (time budget) | | | |")
        return
    log(f"{title}: {name}")
    try:
        RESULTS[(title, name)] = measure(fn)
    except torch.cuda.OutOfMemoryError:
        emit(f"| {name} | OOM | | | |")
        empty_cache()
        return
    except Exception as exc:
        emit(f"| {name} | ERROR {type(exc).__name__}: {str(exc)[:120]} | | | |")
        traceback.print_exc()
        empty_cache()
        return
    ms, mb = RESULTS[(title, name)]
    base = RESULTS.get((title, baseline))
    sp = f"{base[0] / ms:.2f}x" if base else "-"
    mem = f"{mb / max(base[1], 1e-6):.3f}x" if base else "-"
    emit(f"| {name} | {ms:.3f} | {mb:.0f} | {sp} | {mem} |")
    empty_cache()


def bench_table(title: str, variants: list[tuple[str, object]], baseline: str) -> None:
    """Measures each (name, fn); ratios are relative to ``baseline``. ``torch.compile``
    variants are deferred to the end of the run (their compile time is the least certain)."""
    _header(title, baseline)
    for name, fn in variants:
        if name.startswith("torch.compile"):
            DEFERRED.append((title, name, fn, baseline))
            emit(f"| {name} | (measured at the end, see torch.compile section) | | | |")
        else:
            _measure_row(title, name, fn, baseline)


def run_deferred() -> None:
    emit("\n## torch.compile variants (same sizes; ratios vs the eager baselines above)")
    for title, name, fn, baseline in DEFERRED:
        _header(title, baseline)
        for (t, n), (ms, mb) in RESULTS.items():
            if t == title:
                emit(f"| {n} | {ms:.3f} | {mb:.0f} | (above) | |")
        _measure_row(title, name, fn, baseline)
        flush_report()


def compiled(fn):
    return fn if DRY else torch.compile(fn, dynamic=False)
