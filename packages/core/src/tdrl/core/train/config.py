"""One config system for every app: documented dataclasses read by Hydra.

An app's settings are a dataclass (usually a subclass of :class:`RunConfig`, which holds the
run-folder settings every app shares). A field's docstring (the string literal right below
it) is its help text. :func:`hydra_app` registers the dataclass in Hydra's ``ConfigStore``
and returns the app's ``main``; on the command line that gives what TorchRL's recipes and
BenchMARL users type::

    python apps/ppo/train.py                          # the dataclass defaults
    python apps/ppo/train.py lr=3e-4 hidden=[256,256] # key=value overrides
    python apps/ppo/train.py --config-name tiny       # a YAML recipe beside the app (-cn)
    python apps/ppo/train.py -m seed=0,1,2            # a sweep: one run folder per job
    python apps/ppo/train.py --cfg job                # print the resolved config, run nothing
    python apps/ppo/train.py --help                   # every setting with its help text

Unknown keys and values of the wrong type are refused by Hydra before anything runs; the
dataclass's ``__post_init__`` checks the rest (impossible values) and a failure there ends
the program with the message and exit status 2, also before any work. A sweep gets its own
folder: ``out``, or ``out-<k>`` when ``out`` holds an earlier run or sweep (``resume=true``
keeps ``out``); each job's ``out`` is its own sub-folder there (``<sweep>/<overrides>``), and
each finished job appends one line (its overrides and result) to ``<sweep>/sweep.jsonl``
under a file lock, so jobs of a parallel launcher (joblib, submitit) do not overwrite each
other. JSON lines, not a ``.json`` file: loaders that merge every ``*.json`` under a folder
(BenchMARL's multirun loader) read the sweep folder as it is.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import logging
import math
import sys
import textwrap
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

__all__ = ["RunConfig", "ConfigError", "NOT_A_SETTING", "SWEEP_FILE", "append_sweep_line", "read_sweep",
           "check_device", "hydra_app", "load_config", "field_docs", "config_help"]

log = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A config value that cannot work (raised before any work starts)."""


@dataclass
class RunConfig:
    """The settings of the run folder that every app shares (see :class:`tdrl.core.train.Run`)."""

    out: str = "runs/run"
    """Run folder: config.yaml, metrics.csv, summary.json, plots, checkpoints/. If it holds an
    earlier run and resume is false, a new numbered folder beside it is used (out-1, out-2, ...)."""
    seed: int = 0
    """Seed of every random number generator of the run."""
    resume: bool = False
    """Continue the run in out from its latest checkpoint (a fresh start when there is none)."""
    checkpoint_every: int = 0
    """Steps (the app's unit: frames, rounds, iterations) between checkpoints; 0: only at the end."""
    eval_every: int = 0
    """Steps between evaluations during training; 0: only at the end."""
    time_limit_s: float = 0.0
    """Stop training after this many seconds (a final checkpoint and evaluation follow); 0: no limit."""
    tensorboard: bool = False
    """Also log the metrics to TensorBoard (out/tensorboard); needs tensorboard installed."""
    wandb: str = ""
    """Weights & Biases project to log to; empty: off. Needs wandb installed."""
    progress: bool = True
    """Show a progress bar with live metrics on stderr."""
    threads: int = 1
    """torch threads. More than 1 on a small shared machine is often slower."""

    def __post_init__(self) -> None:
        _check(self, "checkpoint_every", self.checkpoint_every >= 0, "an integer >= 0 (0: only at the end)")
        _check(self, "eval_every", self.eval_every >= 0, "an integer >= 0 (0: only at the end)")
        _check(self, "time_limit_s", self.time_limit_s >= 0 and not math.isnan(self.time_limit_s),
               "a number of seconds >= 0 (0: no limit)")
        _check(self, "threads", self.threads >= 1, "an integer >= 1")
        _check(self, "out", bool(str(self.out).strip()), "a folder path")


def _check(cfg: Any, name: str, ok: bool, allowed: str) -> None:
    """Raise :class:`ConfigError` naming the field, its value and what is allowed."""
    if not ok:
        raise ConfigError(f"{type(cfg).__name__}.{name}={getattr(cfg, name)!r} is not allowed: expected {allowed}.")


def check_device(cfg) -> None:
    """Refuse ``cfg.device`` before any work when torch cannot use it (a typo, or ``cuda`` on a
    machine or torch build without CUDA)."""
    try:
        device = torch.device(cfg.device)
    except (RuntimeError, TypeError) as err:
        raise ConfigError(f"{type(cfg).__name__}.device={cfg.device!r} is not a torch device ({err}); "
                          "expected e.g. 'cpu', 'cuda' or 'cuda:1'.") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        why = "this torch is a CPU build" if torch.version.cuda is None else "no CUDA device is visible"
        raise ConfigError(f"{type(cfg).__name__}.device={cfg.device!r}, but {why}; use device=cpu.")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ConfigError(f"{type(cfg).__name__}.device={cfg.device!r}, but only {torch.cuda.device_count()} "
                          "CUDA device(s) are visible.")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"{type(cfg).__name__}.device={cfg.device!r}, but MPS is not available; use device=cpu.")


# ------------------------------------------------------------------ docs and help
def _section_docs(doc: str) -> dict[str, str]:
    """Field help from a Google-style ``Args:`` / ``Attributes:`` section of a class docstring
    (``name: text`` or ``a, b: text`` shared by several names; indented lines continue)."""
    docs: dict[str, str] = {}
    lines = textwrap.dedent("\n".join(doc.splitlines()[1:])).splitlines()
    inside, names, indent = False, [], None
    for line in lines:
        stripped = line.strip()
        if stripped in ("Args:", "Attributes:", "Fields:"):
            inside, names, indent = True, [], None
            continue
        if not inside:
            continue
        if not stripped:
            continue
        here = len(line) - len(line.lstrip())
        if indent is None:
            indent = here
        if here < indent:
            inside = False
            continue
        head, sep, text = stripped.partition(":")
        if here == indent and sep and all(n.strip().isidentifier() for n in head.split(",")):
            names = [n.strip() for n in head.split(",")]
            for n in names:
                docs[n] = text.strip()
        elif names:
            for n in names:
                docs[n] = f"{docs[n]} {stripped}".strip()
    return docs


def field_docs(cls: type) -> dict[str, str]:
    """Help text of each field of the dataclass ``cls``: the string literal right below the
    field in the class body, else its line in the class docstring's ``Args:`` /
    ``Attributes:`` section (bases first, subclasses override)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass) or klass is object:
            continue
        docs.update({k: " ".join(v.split()) for k, v in _section_docs(klass.__doc__ or "").items()})
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, nxt in zip(body, body[1:] + [None]):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(nxt, ast.Expr)
                    and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str)):
                docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return "???"


def config_help(cls: type, name: str, recipes: str | Path | None = None) -> str:
    """The ``--help`` text: usage, the class summary, the recipes and every field."""
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    lines = [f"usage: {name} [key=value ...] [--config-name RECIPE] [-m key=a,b ...] [--cfg job]", ""]
    summary = (cls.__doc__ or "").strip().split("\n\n")[0]
    if summary:
        lines += [" ".join(summary.split()), ""]
    if recipes is not None and Path(recipes).is_dir():
        names = sorted(p.stem for p in Path(recipes).glob("*.yaml"))
        if names:
            lines += [f"recipes (--config-name NAME, from {recipes}): {', '.join(names)}", ""]
    lines.append("settings (key=value; lists as [a,b]; a sweep as -m key=a,b):")
    for f in dataclasses.fields(cls):
        if NOT_A_SETTING in f.metadata:  # an inherited field the app does not read
            continue
        kind = getattr(hints[f.name], "__name__", None) or str(hints[f.name]).replace("typing.", "")
        lines.append(f"  {f.name}: {kind} = {_default(f)!r}")
        if f.name in docs:
            lines += textwrap.wrap(docs[f.name], 92, initial_indent="      ", subsequent_indent="      ")
    lines += ["", "Hydra's own options: --hydra-help."]
    return "\n".join(lines)


# ------------------------------------------------------------------ building a config
NOT_A_SETTING = "tdrl_not_a_setting"
"""Field metadata key: ``field(default=..., metadata={NOT_A_SETTING: "use out=DIR"})`` marks a field
that an app's config inherits but does not read. ``--help`` leaves it out, and a value other than
its default is refused with the metadata's text (so no key is listed and then ignored)."""


def _build(cls: type, values: dict[str, Any]) -> Any:
    """``cls(**values)`` with lists turned into tuples where the field is a tuple and nested
    dataclasses built recursively; ``__post_init__`` failures become :class:`ConfigError`.

    Refused, naming the key: a key ``cls`` has no field for (Hydra's ``+key=value`` adds one
    to the config without a complaint), and a value for a field marked :data:`NOT_A_SETTING`.
    """
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        valid = ", ".join(n for n, f in fields.items() if NOT_A_SETTING not in f.metadata)
        raise ConfigError(f"{cls.__name__} has no setting {', '.join(map(repr, unknown))} "
                          f"(from a +key=value?); valid settings: {valid}.")
    kwargs = {}
    for f in fields.values():
        if f.name not in values:
            continue
        if NOT_A_SETTING in f.metadata and values[f.name] != _default(f):
            raise ConfigError(f"{f.name} is not a setting of {cls.__name__} (it would be ignored): "
                              f"{f.metadata[NOT_A_SETTING]}.")
        value, hint = values[f.name], hints[f.name]
        origin = typing.get_origin(hint)
        if dataclasses.is_dataclass(hint) and isinstance(value, dict):
            value = _build(hint, value)
        elif (origin is tuple or hint is tuple) and isinstance(value, list):
            value = tuple(value)
        kwargs[f.name] = value
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (ValueError, TypeError) as err:
        raise ConfigError(f"invalid {cls.__name__}: {err}") from err


def _require_hydra() -> None:
    import importlib.util

    if importlib.util.find_spec("hydra") is None:
        raise ModuleNotFoundError(
            "The apps' command line uses Hydra, which is not installed: pip install \"packages/core[apps]\" "
            "(or pip install hydra-core)."
        )


_JOB_LOGGING = {  # the run's log records on stderr, no log file (the run folder belongs to Run)
    "version": 1,
    "formatters": {"simple": {"format": "%(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "simple", "stream": "ext://sys.stderr"}},
    "root": {"level": "WARNING", "handlers": ["console"]},
    "loggers": {"tdrl": {"level": "INFO"}},
    "disable_existing_loggers": False,
}


def _register(cls: type, name: str) -> None:
    """Store the schema ``<name>_schema`` and the app's base config ``<name>`` (the schema plus
    the run-folder conventions for Hydra) in Hydra's ConfigStore."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    store.store(group="hydra/job_logging", name="tdrl", node=_JOB_LOGGING)
    store.store(name=f"{name}_schema", node=cls)
    store.store(name=name, node={
        "defaults": [f"{name}_schema", {"override hydra/job_logging": "tdrl"}, "_self_"],
        "hydra": {
            "run": {"dir": "."},  # Hydra writes nothing there (no .hydra/, no log file): tdrl's Run owns out
            "sweep": {"dir": "${out}", "subdir": "${hydra.job.override_dirname}"},
            "output_subdir": None,  # the run folder's config.yaml is written by tdrl's Run
            "job": {"chdir": False, "config": {"override_dirname": {"exclude_keys": ["out", "progress"]}}},
        },
    })


def load_config(cls: type, overrides: Sequence[str] = (), recipe: str | None = None,
                recipes: str | Path | None = None, name: str = "app") -> Any:
    """The config an app would run with, without running it (Hydra's compose API).

    Args:
        cls: the config dataclass. overrides: ``key=value`` strings.
        recipe: a YAML recipe's name in ``recipes`` (``--config-name``); ``None``: the defaults.
        recipes: the folder of the app's YAML recipes. name: the app's config name.

    Returns:
        A validated instance of ``cls``.

    Raises:
        ConfigError: an impossible value. Hydra's errors for unknown keys or wrong types.
    """
    _require_hydra()
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    _register(cls, name)
    folder = Path(recipes).resolve() if recipes is not None else Path.cwd()
    with initialize_config_dir(config_dir=str(folder), version_base=None, job_name=name):
        cfg = compose(config_name=recipe or name, overrides=list(overrides))
    return _build(cls, OmegaConf.to_container(cfg, resolve=True))


def hydra_app(cls: type, task: Callable[[Any], Any], name: str, recipes: str | Path | None = None,
              translate: Callable[[list[str]], list[str]] | None = None) -> Callable[[Sequence[str] | None], Any]:
    """The ``main`` of an app: Hydra's command line over the dataclass ``cls``.

    Args:
        cls: the app's config dataclass (fields documented by docstrings).
        task: ``task(cfg) -> result``, the run itself (gets a validated ``cls`` instance).
        name: the app's name (its config name in the ConfigStore and in ``--help``).
        recipes: the folder of the app's YAML recipes (``--config-name NAME`` picks one;
            a recipe starts with ``defaults: [<name>, _self_]``).
        translate: rewrites the command line first (a peer's spelling of a key, in the app's one
            mapping module); a ``ValueError`` it raises ends the program with its message, exit 2.

    Returns:
        ``main(argv=None)``: parses ``argv`` (default ``sys.argv[1:]``), runs ``task`` once, or
        once per job of a ``-m`` sweep, and returns its result (a list of results for a sweep;
        ``None`` for ``--help`` / ``--cfg``). ``main.load(overrides, recipe)`` returns the
        validated config without running anything (for tests and notebooks).
    """

    def main(argv: Sequence[str] | None = None) -> Any:
        argv = list(sys.argv[1:] if argv is None else argv)
        if translate is not None:
            try:
                argv = list(translate(argv))
            except ValueError as err:
                sys.stderr.write(f"error: {err}\n")
                raise SystemExit(2) from None
        multirun = "-m" in argv or "--multirun" in argv
        if multirun:  # Hydra wants its flags before the overrides; accept them anywhere
            argv = ["-m", *[a for a in argv if a not in ("-m", "--multirun")]]
            fixed = sorted({"out", "progress", *_fixed_keys(argv)})  # job folders name only the swept keys
            argv.append(f"hydra.job.config.override_dirname.exclude_keys=[{','.join(fixed)}]")
        if "-h" in argv or "--help" in argv:
            sys.stdout.write(config_help(cls, name, recipes) + "\n")
            return None
        _require_hydra()
        if multirun:  # every job's config is checked before the first job runs or writes anything
            first = _check_sweep(argv, cls, name, recipes)
            if first is not None:  # the sweep's own folder, never inside an earlier run or sweep
                folder = Path(first.out) if first.resume else _fresh_folder(first.out)
                argv.append(f"hydra.sweep.dir='{folder}'")
        import hydra
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode
        from omegaconf import OmegaConf

        _register(cls, name)
        results: list[tuple[list[str], Any]] = []

        def run_job(dcfg: Any) -> Any:
            try:
                cfg = _build(cls, OmegaConf.to_container(dcfg, resolve=True))
            except ConfigError as err:
                sys.stderr.write(f"error: {err}\n")
                raise SystemExit(2) from None
            hc = HydraConfig.get()
            sweep = hc.mode == RunMode.MULTIRUN
            if sweep:  # every job writes into its own sub-folder of the sweep folder
                cfg.out = str(hc.runtime.output_dir)
            result = task(cfg)
            results.append((list(hc.overrides.task), result))
            if sweep:
                append_sweep_line(Path(hc.sweep.dir), list(hc.overrides.task), result)
            return result

        entry = hydra.main(config_path=str(Path(recipes).resolve()) if recipes is not None else None,
                           config_name=name, version_base=None)(run_job)
        saved = sys.argv
        sys.argv = [saved[0] if saved else name, *argv]
        try:
            entry()
        finally:
            sys.argv = saved
        if not results:
            return None
        return [r for _, r in results] if multirun else results[0][1]

    def load(overrides: Sequence[str] = (), recipe: str | None = None) -> Any:
        """The validated config ``main`` would run with (see :func:`load_config`)."""
        return load_config(cls, translate(list(overrides)) if translate else overrides, recipe, recipes, name)

    main.load = load
    main.config_class = cls
    main.__doc__ = config_help(cls, name, recipes)
    return main


_MAX_CHECKED_JOBS = 512


def _recipe_of(argv: Sequence[str]) -> str | None:
    for i, arg in enumerate(argv):
        if arg in ("-cn", "--config-name") and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--config-name="):
            return arg.split("=", 1)[1]
    return None


def _fresh_folder(out: str) -> Path:
    """``out`` when it holds no earlier run or sweep, else the first free ``out-<k>``."""
    from tdrl.core.train.run import run_folder

    return run_folder(out, resume=False)[0]


def _check_sweep(argv: Sequence[str], cls: type, name: str, recipes: str | Path | None) -> Any:
    """Build the config of every job of a ``-m`` sweep (Hydra's own parser expands the values)
    and refuse the sweep, naming the job and the reason, if any of them is impossible: a bad
    value in the second job must not cost the first job's training. Past
    ``_MAX_CHECKED_JOBS`` jobs each swept value is checked once, with the others' first values.

    Returns:
        The first job's config (``None`` when Hydra's parser is left to report the sweep).
    """
    import itertools

    from hydra.core.override_parser.overrides_parser import OverridesParser

    skip = {i + 1 for i, a in enumerate(argv) if a in ("-cn", "--config-name", "-cp", "--config-path")}
    lines = [a for i, a in enumerate(argv)
             if i not in skip and "=" in a and not a.startswith("-") and not a.lstrip("+~").startswith("hydra")]
    try:
        parsed = OverridesParser.create().parse_overrides(lines)
        choices = [[f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()] if o.is_sweep_override()
                   else [o.input_line] for o in parsed]
    except Exception:  # noqa: BLE001 - an unparsable or continuous sweep: Hydra itself reports it
        return None
    n_jobs = math.prod(len(c) for c in choices)
    if n_jobs <= _MAX_CHECKED_JOBS:
        jobs = [list(j) for j in itertools.product(*choices)]
    else:
        jobs = [[c[0] for c in choices[:k]] + [v] + [c[0] for c in choices[k + 1:]]
                for k, c in enumerate(choices) for v in c]
    recipe = _recipe_of(argv)
    first = None
    for job in jobs:
        try:
            cfg = load_config(cls, job, recipe, recipes, name)
        except ConfigError as err:
            sys.stderr.write(f"error: sweep job {' '.join(job)}: {err}\n"
                             f"(no job of the {n_jobs} was run: every job's settings are checked first)\n")
            raise SystemExit(2) from None
        first = cfg if first is None else first
    return first


_SWEEP_FUNCTIONS = ("range(", "choice(", "glob(", "interval(", "tag(", "sort(", "shuffle(")


def _is_sweep(value: str) -> bool:
    """Whether an override's value sweeps (``a,b``, ``range(...)``, ``choice(...)``...)."""
    if value.startswith(_SWEEP_FUNCTIONS):
        return True
    depth, quote = 0, ""
    for ch in value:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[({":
            depth += 1
        elif ch in "])}":
            depth -= 1
        elif ch == "," and depth == 0:
            return True
    return False


def _fixed_keys(argv: Sequence[str]) -> list[str]:
    """The keys of the ``key=value`` overrides in ``argv`` that do not sweep."""
    keys = []
    for arg in argv:
        if arg.startswith("-") or "=" not in arg or arg.startswith("hydra"):
            continue
        key, value = arg.split("=", 1)
        if not _is_sweep(value):
            keys.append(key.lstrip("+~"))
    return keys


SWEEP_FILE = "sweep.jsonl"
"""The sweep folder's list of finished jobs: one JSON line ``{"overrides", "result"}`` per job."""


def append_sweep_line(folder: Path, overrides: list[str], result: Any) -> None:
    """Append one finished job's line to ``<folder>/sweep.jsonl`` under an exclusive file lock
    (``fcntl.flock`` where the platform has it): jobs running at once in several processes
    (a parallel Hydra launcher) each add their line and none is lost."""
    def plain(value: Any) -> Any:
        try:
            json.dumps(value)
            return value
        except TypeError:
            return repr(value)

    folder.mkdir(parents=True, exist_ok=True)
    line = json.dumps({"overrides": overrides, "result": plain(result)}) + "\n"
    with open(folder / SWEEP_FILE, "a") as f:
        try:
            import fcntl
        except ImportError:  # Windows: one short append
            f.write(line)
            return
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            f.write(line)
            f.flush()
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def read_sweep(folder: str | Path) -> list[dict]:
    """The finished jobs of the sweep in ``folder``: ``[{"overrides", "result"}, ...]`` in the order
    they finished."""
    path = Path(folder) / SWEEP_FILE
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.is_file() else []
