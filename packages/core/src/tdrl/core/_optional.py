"""Optional dependencies of tdrl.core: tdrl.kernels' helper (the one home of the rule),
naming this package's extras (``pip install "packages/core[extra]"``)."""

from __future__ import annotations

from functools import partial

from tdrl.kernels._optional import available
from tdrl.kernels._optional import missing_message as _missing_message
from tdrl.kernels._optional import require as _require

__all__ = ["available", "missing_message", "require"]

missing_message = partial(_missing_message, package="core")
require = partial(_require, package="core")
