"""MARL benchmark: algorithms x tasks x seeds on VMAS -> results.md, evaluations.csv, PNG curves.

Every field of :class:`tdrl.marl.runner.BenchConfig` is a command-line option; tuples are
comma-separated. Examples:

    python apps/marl_bench/run.py --tiny                      # CI budget, tens of seconds
    python apps/marl_bench/run.py --algorithms mappo,qmix --tasks navigation --seeds 0,1,2 \\
        --n_iters 50 --compare_sequential true --out_dir runs/nav
    python apps/marl_bench/run.py --tasks navigation --device cuda   # VMAS + training on a GPU
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import typing

from tdrl.marl.runner import BenchConfig, run_benchmark


def _parse_value(text: str, default, annotation: str):
    if "tuple" in annotation:
        kind = int if ("int" in annotation) else str
        return tuple(kind(x) for x in text.split(",") if x)
    if isinstance(default, bool):
        if text.lower() not in ("1", "0", "true", "false", "yes", "no"):
            raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")
        return text.lower() in ("1", "true", "yes")
    if "None" in annotation and text.lower() == "none":
        return None
    if "float" in annotation:
        return float(text)
    if "int" in annotation:
        return int(text)
    return text


def parse_args(argv: list[str] | None = None) -> BenchConfig:
    """A :class:`BenchConfig` from the defaults overridden by ``--field value`` options."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    hints = typing.get_type_hints(BenchConfig)
    for f in dataclasses.fields(BenchConfig):
        ann = str(hints[f.name])
        if f.name == "tiny":
            parser.add_argument("--tiny", action="store_true", help="CI-sized budget (tens of seconds)")
            continue
        parser.add_argument(f"--{f.name}", type=str, default=None, help=f"{ann} (default {f.default!r})")
    ns = parser.parse_args(argv)
    kwargs = {}
    for f in dataclasses.fields(BenchConfig):
        value = getattr(ns, f.name)
        if f.name == "tiny":
            kwargs["tiny"] = bool(value)
        elif value is not None:
            try:
                kwargs[f.name] = _parse_value(value, f.default, str(hints[f.name]))
            except (ValueError, argparse.ArgumentTypeError) as err:
                parser.error(f"--{f.name}: {err}")
    try:
        return BenchConfig(**kwargs)
    except ValueError as err:
        parser.error(str(err))


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    cfg = parse_args(argv)
    result = run_benchmark(cfg)
    print((__import__("pathlib").Path(cfg.out_dir) / "results.md").read_text())
    print(f"Wrote {cfg.out_dir}/results.md, evaluations.csv and curves_*.png "
          f"({len(result['evaluations'])} evaluations).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
