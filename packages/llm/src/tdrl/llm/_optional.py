"""Optional dependencies of tdrl.llm: tdrl.core's helper, naming this package's extras
(``pip install "packages/llm[extra]"``)."""

from __future__ import annotations

from functools import partial

from tdrl.core._optional import available
from tdrl.core._optional import missing_message as _missing_message
from tdrl.core._optional import require as _require

__all__ = ["available", "missing_message", "require"]

missing_message = partial(_missing_message, package="llm")
require = partial(_require, package="llm")
