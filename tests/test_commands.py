"""Every command printed in ``benchmarks/RESULTS.md``, the READMEs and ``docs/`` parses with
today's command lines (nothing is run).

A command is a ``python <script> ...`` (or ``tdrl <app> ...``) found in a fenced shell block
or an inline code span. Its script must exist. An app's arguments (Hydra: ``key=value``,
``--config-name`` / ``-cn``, ``-m``, ``--help``) are composed against the app's config
dataclass with ``main.load`` (unknown keys, wrong types and impossible values fail; a sweep
``a,b`` is checked at its first value; a device this machine lacks, or a user's data file
that is not here, is not held against the
spelling); a ``--flag`` given to an app is a pre-Hydra spelling and fails with the
``flag=value`` hint. A benchmark's arguments are parsed by its own ``argparse`` parser: the
script runs as ``__main__`` up to its ``parse_args`` call, which hands the parser over instead
of parsing, so nothing of the benchmark runs. ``python -m pytest <paths>``: the paths must
exist; ``tdrl list`` is the command's own listing.
``python script.py (a remark)`` is a reference to the script, not a command: only the script
is checked.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import runpy
import shlex
import sys
import warnings
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted(ROOT.glob("packages/*/README.md")), *sorted(ROOT.glob("apps/*/README.md")),
        *sorted(ROOT.glob("docs/*.md")), ROOT / "benchmarks" / "RESULTS.md"]

_FENCE = re.compile(r"^```(\w*)\s*$")
_SPAN = re.compile(r"`([^`]+)`")
_PYTHON = re.compile(r"(?:^|[\s(])python3?\s+(.*)$")
_TDRL = re.compile(r"^\s*tdrl\s+(\w+)(.*)$")
_SHELL = {"", "bash", "sh", "shell", "console"}


@dataclass
class Command:
    """One ``python ...`` command: where it was found, the script and its arguments."""

    where: str
    script: str
    args: list[str] = field(default_factory=list)
    remark: bool = False  # "python script.py (a remark)": only the script is checked


def _segments(text: str) -> list[str]:
    """Shell command segments of one line (split at ``;``, ``&&``, ``||``, ``|``)."""
    return [s for s in re.split(r"\s*(?:;|&&|\|\||\|)\s*", text) if s.strip()]


def _parse(segment: str, where: str) -> Command | None:
    m = _TDRL.match(segment)
    if m:  # the installed command: tdrl <app> args
        return Command(where, f"tdrl:{m.group(1)}", shlex.split(m.group(2)))
    m = _PYTHON.search(segment)
    if m is None:
        return None
    rest = m.group(1).strip()
    while rest.endswith(")") and rest.count(")") > rest.count("("):  # a command inside a remark's ( )
        rest = rest[:-1].rstrip()
    note = re.match(r"^(\S+\.py)\s+\((.*)\)\s*$", rest)
    if note:
        return Command(where, note.group(1), remark=True)
    note = re.match(r"^-m\s+benchmarks\.(\w+)\s+\((.*)\)\s*$", rest)
    if note:
        return Command(where, f"benchmarks/{note.group(1)}.py", remark=True)
    tokens = shlex.split(rest)
    if tokens[:1] == ["-m"]:
        if len(tokens) > 1 and tokens[1].startswith("benchmarks."):  # a benchmark: its script
            if not re.fullmatch(r"benchmarks\.\w+", tokens[1]):
                return None  # a placeholder (python -m benchmarks.<name>)
            return Command(where, "benchmarks/" + tokens[1].split(".", 1)[1] + ".py", tokens[2:])
        return Command(where, f"-m {tokens[1]}", tokens[2:]) if len(tokens) > 1 else None
    if not tokens or not tokens[0].endswith(".py"):
        return None
    return Command(where, tokens[0], tokens[1:])


def commands_in(text: str, name: str) -> list[Command]:
    """The commands of a Markdown text: shell lines of fenced blocks (``\\`` continuations
    joined, ``#`` comments dropped) and inline code spans (which may wrap a line)."""
    found: list[Command] = []
    lines = text.splitlines()
    prose: list[tuple[int, str]] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i].strip())
        if not m:
            prose.append((i + 1, lines[i]))
            i += 1
            continue
        lang, i = m.group(1), i + 1
        start = i
        block = []
        while i < len(lines) and not lines[i].strip().startswith("```"):
            block.append(lines[i])
            i += 1
        i += 1
        if lang not in _SHELL:
            continue
        joined, first = "", start
        for n, line in enumerate(block, start + 1):
            if not joined:
                first = n
            joined += line.rstrip()
            if joined.endswith("\\"):
                joined = joined[:-1] + " "
                continue
            code = re.sub(r"(^|\s)#.*$", "", joined)
            found += [c for s in _segments(code) if (c := _parse(s, f"{name}:{first}"))]
            joined = ""
    # inline spans may wrap a line: search the prose with its line breaks as spaces
    flat = " ".join(line for _, line in prose)
    offsets, pos = [], 0
    for n, line in prose:
        offsets.append((pos, n))
        pos += len(line) + 1
    for m in _SPAN.finditer(flat):
        line = max(n for p, n in offsets if p <= m.start())
        found += [c for s in _segments(m.group(1)) if (c := _parse(s, f"{name}:{line}"))]
    return found


def all_commands() -> list[Command]:
    out = []
    for path in DOCS:
        out += commands_in(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    return out


# ------------------------------------------------------------------ apps (Hydra)


def _first_of_sweep(value: str) -> str:
    """``a,b,c`` -> ``a`` (commas inside brackets or quotes do not sweep)."""
    depth, quote = 0, ""
    for k, ch in enumerate(value):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[({":
            depth += 1
        elif ch in "])}":
            depth -= 1
        elif ch == "," and depth == 0:
            return value[:k]
    return value


def check_app(app_script: Path, args: list[str]) -> str | None:
    """Why ``args`` do not parse for the Hydra app ``app_script``, or ``None``."""
    recipe, overrides, it = None, [], iter(args)
    for arg in it:
        if arg in ("-h", "--help"):
            return None
        if arg in ("-m", "--multirun"):
            continue
        if arg in ("-cn", "--config-name") or arg.startswith(("--config-name=", "-cn=")):
            recipe = arg.split("=", 1)[1] if "=" in arg else next(it, None)
            continue
        if arg.startswith("-"):
            key = arg.lstrip("-").split("=", 1)[0]
            return (f"{arg!r} is not a Hydra argument (a pre-Hydra spelling?): write {key}=VALUE "
                    "(settings are key=value; --help lists them)")
        if "=" not in arg:
            return f"{arg!r} is not a key=value override"
        key, value = arg.split("=", 1)
        overrides.append(f"{key}={_first_of_sweep(value)}")
    main = _app_main(app_script)
    try:
        main.load(overrides, recipe)
    except Exception as err:  # Hydra's unknown key / type errors, tdrl's ConfigError
        if re.search(r"CUDA is not available|no CUDA|device='cuda[^']*', but", str(err)):
            return None  # the spelling composed; the value needs a GPU this machine lacks
        if re.search(r"\.(data|eval_data)='[^']*': no such file or folder", str(err)):
            return None  # the spelling composed; the value names the user's own file
        return f"{type(err).__name__}: {err}"
    return None


@cache
def _app_main(script: Path):
    from tdrl.core.cli import load_app

    module = load_app(script.parent.name, script.name, str(script.parents[1]))
    main = getattr(module, "main", None)
    if main is None or not hasattr(main, "load"):
        raise AssertionError(f"{script}: no hydra_app main with .load")
    return main


# ------------------------------------------------------------------ benchmarks (argparse)


class _Captured(Exception):
    """Raised by the patched ``parse_args``: the script built its parser, nothing ran yet."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__()
        self.parser = parser


@cache
def _script_parser(script: Path) -> argparse.ArgumentParser | str | None:
    """The ``argparse`` parser ``script`` builds, got by running it as ``__main__`` up to its
    ``parse_args`` call (which raises instead of parsing: nothing after it runs). ``None``: the
    script finished without parsing; a string: it could not be run that far (an optional
    dependency missing), and why."""
    def capture(self, *args, **kwargs):
        raise _Captured(self)

    saved = (argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args,
             sys.argv, list(sys.path), dict(os.environ))
    argparse.ArgumentParser.parse_args = capture
    argparse.ArgumentParser.parse_known_args = capture
    sys.argv = [str(script)]
    sys.path.insert(0, str(ROOT))  # ``python -m benchmarks.x`` runs from the repository root
    try:
        with warnings.catch_warnings():  # a benchmark's filterwarnings("ignore") stays inside
            runpy.run_module(f"benchmarks.{script.stem}", run_name="__main__", alter_sys=True)
    except _Captured as got:
        return got.parser
    except (ImportError, SystemExit, Exception) as err:  # noqa: B014 - any reason it cannot start
        return f"{type(err).__name__}: {err}"
    finally:
        (argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args,
         sys.argv, sys.path[:]) = saved[:4]
        os.environ.clear()  # and its os.environ.setdefault(...) too
        os.environ.update(saved[4])
    return None


def check_argparse(script: Path, args: list[str]) -> str | None:
    """Why ``args`` do not parse with ``script``'s own argparse parser, or ``None``."""
    if not args:
        return None  # the script exists; nothing to parse (and no need to start it)
    parser = _script_parser(script)
    if isinstance(parser, str):
        pytest.skip(f"{script.name} cannot be started here to get its parser ({parser})")
    if parser is None:
        return f"{script.name} parses no arguments, given {args}" if args else None
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(args)
    except SystemExit as exit_:
        if exit_.code not in (0, None):  # 0: --help
            return err.getvalue().strip().splitlines()[-1]
    return None


# ------------------------------------------------------------------ the check


def check(command: Command) -> str | None:
    """Why ``command`` does not parse today, or ``None``."""
    if command.script.startswith("tdrl:"):
        from tdrl.core.cli import find_apps

        apps = find_apps(str(ROOT / "apps"))
        name = command.script.split(":", 1)[1]
        if name == "list" and not command.args:
            return None
        if name not in apps:
            return f"tdrl {name}: no such app ({', '.join(apps)})"
        return check_app(apps[name], command.args)
    if command.script.startswith("-m "):
        module = command.script[3:]
        if module != "pytest":
            return None
        takes_value = {"-m", "-k", "-p", "--durations", "--timeout"}  # options whose next word is not a path
        paths = [a for i, a in enumerate(command.args)
                 if not a.startswith("-") and not (i and command.args[i - 1] in takes_value)]
        missing = [a for a in paths if not (ROOT / a.split("::")[0]).exists()]
        return f"pytest paths not found: {missing}" if missing else None
    script = ROOT / command.script
    if not script.is_file():
        return (f"{command.script} does not exist (commands run from the repository root: "
                "write the script's path from there)")
    if command.remark:
        return None
    rel = script.relative_to(ROOT).parts
    if rel[0] == "apps":
        return check_app(script, command.args)
    return check_argparse(script, command.args)


COMMANDS = all_commands()


def test_the_documents_hold_commands():
    where = {c.where.split(":")[0] for c in COMMANDS}
    assert "benchmarks/RESULTS.md" in where and "README.md" in where
    assert len(COMMANDS) > 50


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.where)
def test_every_printed_command_parses(command):
    why = check(command)
    assert why is None, f"{command.where}: {command.script} {' '.join(command.args)}\n  {why}"


# ------------------------------------------------------------------ the checker itself


def test_the_checker_refuses_the_stale_spellings():
    ppo = ROOT / "apps" / "ppo" / "train.py"
    why = check(Command("x", "apps/ppo/train.py", ["--env_id", "HalfCheetah-v5"]))
    assert why is not None and "env_id=VALUE" in why
    assert check(Command("x", "apps/ppo/train.py", ["env_id=Hopper-v5", "seed=0,1", "-m"])) is None
    assert "lr_typo" in check_app(ppo, ["lr_typo=1"])
    assert check_app(ppo, ["minibatch_size=7"]) is not None  # does not divide the batch: ConfigError
    assert "does not exist" in check(Command("x", "recurrent.py", ["--repeats", "3"]))
    assert check(Command("x", "benchmarks/recurrent.py", ["--repeats", "3", "--record", "--machine", "m"])) is None
    assert "--repeat-count" in check(Command("x", "benchmarks/recurrent.py", ["--repeat-count", "3"]))
    assert "unrecognized" in check(Command("x", "benchmarks/recurrent.py", ["3"]))
    assert "invalid int" in check(Command("x", "benchmarks/recurrent.py", ["--repeats", "x"]))
    # a flag added in a loop: only the script's own parser knows it
    assert check(Command("x", "benchmarks/marl_table.py", ["--eval-episodes", "200", "--record"])) is None


def test_commands_are_found_in_blocks_spans_and_continuations():
    text = ("Run `python apps/ppo/train.py -cn\ntiny seed=1` or:\n\n```bash\n"
            "nohup python -m benchmarks.gae --repeats 3 \\\n    --record   # a comment\n"
            "tdrl ppo env_id=CartPole-v1\n```\n```python\npython_only = 1\n```\n"
            "`x.py (a remark; it runs python -m benchmarks.mcts --repeats 3)`\n")
    found = commands_in(text, "doc")
    assert [(c.script, c.args) for c in found] == [
        ("benchmarks/gae.py", ["--repeats", "3", "--record"]),
        ("tdrl:ppo", ["env_id=CartPole-v1"]),
        ("apps/ppo/train.py", ["-cn", "tiny", "seed=1"]),
        ("benchmarks/mcts.py", ["--repeats", "3"]),
    ]


def test_a_benchmark_run_from_its_folder_records_its_path_from_the_root(monkeypatch):
    """How four RESULTS rows came to print ``python recurrent.py``: the record took sys.argv as
    typed. ``python -m`` puts the module's full path in sys.argv[0]; a script's path as typed
    (the old spelling) is written as the module too."""
    from benchmarks.records import this_command

    monkeypatch.chdir(ROOT / "benchmarks")
    monkeypatch.setattr(sys, "argv", ["recurrent.py", "--repeats", "3", "--machine", "a box"])
    monkeypatch.setattr(sys, "executable", "/usr/bin/python3")
    assert this_command() == "python -m benchmarks.recurrent --repeats 3 --machine 'a box'"
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "argv", [str(ROOT / "benchmarks" / "gae.py"), "--repeats", "3"])
    assert this_command() == "python -m benchmarks.gae --repeats 3"
