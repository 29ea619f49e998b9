"""The ``tdrl`` command: ``tdrl <app> [key=value ...]`` runs ``apps/<app>/train.py`` (or its
``run.py``) with Hydra's command line; ``tdrl list`` names the apps.

The apps are linear scripts kept in the repository's ``apps/`` folder (CleanRL's reading
order), not inside the installed packages. The folder is found, in order, from
``--apps DIR``, the ``TDRL_APPS`` environment variable, ``./apps`` and the checkout an
editable install points at.
"""

from __future__ import annotations

import os
import runpy
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["main", "find_apps", "load_app"]

_SCRIPTS = ("train.py", "run.py")


def _candidates(explicit: str | None) -> list[Path]:
    found = [Path(explicit)] if explicit else []
    if os.environ.get("TDRL_APPS"):
        found.append(Path(os.environ["TDRL_APPS"]))
    found.append(Path.cwd() / "apps")
    here = Path(__file__).resolve().parents
    if len(here) > 5:
        found.append(here[5] / "apps")  # an editable install: packages/core/src/tdrl/core -> the checkout
    return found


def find_apps(explicit: str | None = None) -> dict[str, Path]:
    """``{app name: script}`` of the first apps folder found (see the module docstring)."""
    for folder in _candidates(explicit):
        if folder.is_dir():
            apps = {}
            for sub in sorted(folder.iterdir()):
                script = next((sub / s for s in _SCRIPTS if (sub / s).is_file()), None)
                if script is not None:
                    apps[sub.name] = script
            if apps:
                return apps
    tried = ", ".join(str(p) for p in _candidates(explicit))
    raise FileNotFoundError(f"No tdrl apps folder found (tried {tried}): run from a checkout of the "
                            "repository, or pass --apps DIR / set TDRL_APPS to its apps/ folder.")


def load_app(name: str, script: str | None = None, apps: str | None = None):
    """``apps/<name>/<script>`` imported as the module ``_tdrl_app_<name>`` (apps are scripts,
    not packages): what tests and benchmarks use to call an app's functions.

    Args:
        name: the app's folder name (``"sac"``).
        script: the file in it (default: its ``train.py`` or ``run.py``).
        apps: the apps folder (default: found as for the ``tdrl`` command).
    """
    import importlib.util

    found = find_apps(apps)
    if name not in found:
        raise KeyError(f"no app {name!r} in {next(iter(found.values())).parents[1]}; apps: {', '.join(found)}")
    path = found[name] if script is None else found[name].parent / script
    spec = importlib.util.spec_from_file_location(f"_tdrl_app_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tdrl`` command (exit 2 with a message when no apps folder is found)."""
    try:
        return _main(argv)
    except FileNotFoundError as err:
        if "No tdrl apps folder found" not in str(err):
            raise
        sys.stderr.write(f"tdrl: {err}\n")
        return 2


def _main(argv: Sequence[str] | None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    explicit = None
    if len(args) >= 2 and args[0] == "--apps":
        explicit, args = args[1], args[2:]
    if not args or args[0] in ("-h", "--help", "list"):
        apps = find_apps(explicit)
        sys.stdout.write("usage: tdrl <app> [key=value ...] [--config-name RECIPE] [-m key=a,b] [--help]\n"
                         f"apps ({next(iter(apps.values())).parents[1]}): {', '.join(apps)}\n")
        return 0
    apps = find_apps(explicit)
    name, rest = args[0], args[1:]
    if name not in apps:
        raise SystemExit(f"tdrl: unknown app {name!r}; the apps are: {', '.join(apps)}.")
    saved = sys.argv
    sys.argv = [str(apps[name]), *rest]
    try:
        runpy.run_path(str(apps[name]), run_name="__main__")
    finally:
        sys.argv = saved
    return 0


if __name__ == "__main__":
    sys.exit(main())
