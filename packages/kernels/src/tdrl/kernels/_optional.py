"""Optional dependencies of the tdrl packages: checked once, and a missing one names the extra to install.

The one home of this rule: ``tdrl.kernels`` is the lowest package, so ``tdrl.core``,
``tdrl.marl`` and ``tdrl.llm`` bind their own package name to it with ``package=``.

``require("name", extra="x", what="Thing")`` imports and returns the module, or raises
``ModuleNotFoundError`` with the pip line that installs it from a clone of the repository
(the tdrl packages are not on a package index, so the line names the package folder).
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

__all__ = ["available", "missing_message", "require"]

_PACKAGE = "kernels"


def available(module: str) -> bool:
    """Whether ``module`` can be imported (without importing it; a dotted name imports its parents)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a missing parent package, or a module without a spec
        return False


def missing_message(module: str, *, extra: str, what: str, pip_name: str | None = None,
                    package: str = _PACKAGE) -> str:
    """The error text for a missing optional dependency.

    Args:
        module: the import name that is missing (``"gymnasium"``).
        extra: the extra of this package that installs it (``"gym"``).
        what: the feature that needs it (``"GymEnv"``).
        pip_name: the distribution to name as the alternative (default: ``module``).
        package: the tdrl package whose extra it is (``"kernels"``, ``"core"``, ``"marl"``,
            ``"llm"``).

    Returns:
        e.g. ``GymEnv needs 'gymnasium', which is not installed: pip install "packages/core[gym]"
        (from the repository root; or pip install gymnasium)``.
    """
    return (
        f"{what} needs {module!r}, which is not installed: "
        f'pip install "packages/{package}[{extra}]" (from the repository root; '
        f"or pip install {pip_name or module})"
    )


def require(module: str, *, extra: str, what: str, pip_name: str | None = None,
            package: str = _PACKAGE) -> ModuleType:
    """Import an optional dependency, or fail with the pip line that installs it.

    Args:
        module: the module to import (``"gymnasium"``, ``"matplotlib.pyplot"``).
        extra: the extra of this package that installs it.
        what: the feature that needs it, for the message.
        pip_name: the distribution to name as the alternative (default: the top-level module).
        package: the tdrl package whose extra it is.

    Returns:
        The imported module.

    Raises:
        ModuleNotFoundError: the module (or its top-level package) is not installed.
    """
    top = module.split(".")[0]
    if not available(top):
        raise ModuleNotFoundError(
            missing_message(top, extra=extra, what=what, pip_name=pip_name, package=package), name=top
        )
    return importlib.import_module(module)
