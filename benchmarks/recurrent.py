"""GRU / LSTM over [B, T] with is_init resets: tdrl.kernels' CPU path vs the Python loops.

Rows (one torch thread, same weights, inputs and resets, interleaved repeats, median):

* ``Python loop (nn.GRU per step)``: what ``tdrl.core``'s modules did before the op (and
  still do without ``tdrl.kernels``): ``nn.GRU`` / ``nn.LSTM`` called once per step on the
  masked state, autograd through all ``T`` calls.
* ``reference (cell ops per step)``: ``gru_reference`` / ``lstm_reference``
  (``TDRL_KERNELS=torch``).
* ``compiled cell step``: the reference's cell step through ``torch.compile``, the loop in
  Python (the alternative the issue names; compile time excluded).
* ``CPU path (cpu.py)``: ``gru_sequence`` / ``lstm_sequence`` on CPU tensors as users get
  them (``tdrl/kernels/recurrent/cpu.py``: preallocated time-major buffers, hand-written BPTT
  with the weight gradients accumulated by one GEMM per step; for float32 the time loops in
  C++, ``cpu_ext.cpp``, built on first use: the build is not timed).
* ``CPU path, Python loops (TDRL_RECURRENT_EXT=0)``: the same with the loops in Python
  (in-place torch ops per step), as without a compiler.

Training (forward + backward) is the figure that matters: forward alone is bound by the
same GEMMs the loop does (``nn.GRU``'s step is one oneDNN call), so it can gain less.

Run:  python -m benchmarks.recurrent [--batch 256 --time 128 --hidden 128 --repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from torch import nn

from tdrl.kernels import gru_sequence, lstm_sequence, use_backend
from tdrl.kernels.recurrent import cpu_ext


def _nn_loop(rnn, x, h0, keep):
    hidden = tuple(h.unsqueeze(0) for h in h0)
    outs = []
    for t in range(x.shape[1]):
        hidden = tuple(h * keep[:, t].view(1, -1, 1) for h in hidden)
        o, new = rnn(x[:, t : t + 1], hidden[0] if len(hidden) == 1 else hidden)
        hidden = (new,) if isinstance(new, torch.Tensor) else tuple(new)
        outs.append(o)
    return torch.cat(outs, 1)


def _gru_cell(gi_t, hp, w_hh, b_hh):
    H = hp.shape[-1]
    gh = torch.addmm(b_hh, hp, w_hh.t())
    r = torch.sigmoid(gi_t[:, :H] + gh[:, :H])
    z = torch.sigmoid(gi_t[:, H : 2 * H] + gh[:, H : 2 * H])
    n = torch.tanh(gi_t[:, 2 * H :] + r * gh[:, 2 * H :])
    return (1 - z) * n + z * hp


def _lstm_cell(gi_t, hp, cp, w_hh, b_hh):
    H = hp.shape[-1]
    g = gi_t + torch.addmm(b_hh, hp, w_hh.t())
    c = torch.sigmoid(g[:, H : 2 * H]) * cp + torch.sigmoid(g[:, :H]) * torch.tanh(g[:, 2 * H : 3 * H])
    return torch.sigmoid(g[:, 3 * H :]) * torch.tanh(c), c


_compiled = {}


def _compiled_loop(kind, x, states, keep, w_ih, w_hh, b_ih, b_hh):
    cell = _compiled.setdefault(kind, torch.compile(_gru_cell if kind == "gru" else _lstm_cell))
    gi = torch.addmm(b_ih, x.reshape(-1, x.shape[-1]), w_ih.t()).view(x.shape[0], x.shape[1], -1)
    outs, s = [], states
    for t in range(x.shape[1]):
        k = keep[:, t : t + 1]
        s = tuple(v * k for v in s)
        s = (cell(gi[:, t], s[0], w_hh, b_hh),) if kind == "gru" else cell(gi[:, t], *s, w_hh, b_hh)
        outs.append(s[0])
    return torch.stack(outs, 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--time", type=int, default=128)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--reset-prob", type=float, default=0.05)
    p.add_argument("--no-compile", action="store_true", help="skip the compiled-cell row")
    p.add_argument("--record", action="store_true", help="write benchmarks/results records")
    p.add_argument("--machine", default=None, help="machine description stored with --record")
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    B, T, H = args.batch, args.time, args.hidden
    ext_on = cpu_ext.extension() is not None  # built (or loaded) here, before any timing
    print(f"recurrent C++ loops (cpu_ext): {'on' if ext_on else 'OFF (Python loops)'}")
    records = []
    for kind in ("gru", "lstm"):
        rnn = (nn.GRU if kind == "gru" else nn.LSTM)(H, H, batch_first=True)
        w = [rnn.weight_ih_l0, rnn.weight_hh_l0, rnn.bias_ih_l0, rnn.bias_hh_l0]
        x = torch.randn(B, T, H, requires_grad=True)
        is_init = torch.rand(B, T) < args.reset_prob
        keep = (~is_init).float()
        states = tuple(torch.zeros(B, H) for _ in range(1 if kind == "gru" else 2))
        op = gru_sequence if kind == "gru" else lstm_sequence

        def fused():
            out = op(x, *states, is_init, *w)
            return out if kind == "gru" else out[0]

        def reference():
            with use_backend("torch"):
                return fused()

        def python_loops():  # the backward follows the forward's choice
            old = os.environ.get("TDRL_RECURRENT_EXT")
            os.environ["TDRL_RECURRENT_EXT"] = "0"
            try:
                return fused()
            finally:
                if old is None:
                    del os.environ["TDRL_RECURRENT_EXT"]
                else:
                    os.environ["TDRL_RECURRENT_EXT"] = old

        rows = {
            "Python loop (nn per step)": lambda: _nn_loop(rnn, x, states, keep),
            "reference (cell ops per step)": reference,
            "CPU path (cpu.py)": fused,
            "CPU path, Python loops (TDRL_RECURRENT_EXT=0)": python_loops,
        }
        if not args.no_compile:
            rows["compiled cell step"] = lambda: _compiled_loop(kind, x, states, keep, *w)
        # parity first: all rows compute the same outputs
        with torch.no_grad():
            base = rows["Python loop (nn per step)"]()
            for name, fn in rows.items():
                torch.testing.assert_close(fn(), base, atol=1e-4, rtol=1e-4, msg=name)
        for mode in ("forward", "forward + backward"):
            times = {name: [] for name in rows}
            for fn in rows.values():  # warm-up (and compile)
                out = fn()
                if mode != "forward":
                    out.sum().backward()
            for _ in range(args.repeats):
                for name, fn in rows.items():
                    t0 = time.perf_counter()
                    if mode == "forward":
                        with torch.no_grad():
                            fn()
                    else:
                        fn().sum().backward()
                    times[name].append(time.perf_counter() - t0)
            med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
            loop = med["Python loop (nn per step)"]
            for name, ms in med.items():
                ratio = loop / ms
                print(f"{kind.upper():4s} {mode:18s} {name:32s} {ms:9.1f} ms  {ratio:5.2f}x vs loop")
                records.append((kind, mode, name, ms, ratio))
    if args.record:
        from benchmarks.records import write_record

        for kind, mode, name, ms, ratio in records:
            table = (f"Recurrent: {kind.upper()} over [B={B}, T={T}], hidden {H}, "
                     f"{args.reset_prob:.0%} is_init resets, {mode}")  # fmt: skip
            write_record(
                "Kernels", table, name, {"median ms": round(ms, 1)},
                peer="Python loop (nn per step)", ratio=f"{ratio:.2f}x vs the loop",
                note=f"one torch thread, median of {args.repeats} interleaved repeats; "
                "compile time excluded from the compiled row"
                + ("" if ext_on else "; the C++ loops were OFF (no build): CPU path = Python loops")
                + ("; training (forward + backward) is the figure that matters: the forward "
                   "alone is bound by the same per-step GEMMs as the loop's oneDNN step"
                   if mode == "forward" else ""),
                machine=args.machine,
            )  # fmt: skip


if __name__ == "__main__":
    main()
