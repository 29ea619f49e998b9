"""The version each tdrl package reports: its installed metadata, the one home of this rule.

``tdrl.kernels`` is the lowest package (every other one installs it), so the four
``__init__`` modules read their ``__version__`` here.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

__all__ = ["installed_version"]


def installed_version(distribution: str) -> str:
    """The installed version of ``distribution`` (``"tdrl-core"``), ``"0+unknown"`` without an install.

    The version lives in the package's ``pyproject.toml``; the installed metadata carries it.
    Imported from the source tree without an install there is none, hence the placeholder.
    """
    try:
        return version(distribution)
    except PackageNotFoundError:
        return "0+unknown"
