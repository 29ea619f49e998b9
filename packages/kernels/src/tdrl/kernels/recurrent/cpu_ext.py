"""The compiled time loops of the CPU GRU / LSTM path (``cpu_ext.cpp``), built on first use.

``cpu.py`` calls :func:`extension` for float32 CPU tensors; it returns the loaded module or
None, and then ``cpu.py`` runs its Python-driven loops (the same maths, the same workspaces).

* Built just in time with ``torch.utils.cpp_extension.load`` (g++ and ninja; ``MAX_JOBS`` as
  torch reads it) into torch's extension cache (``$TORCH_EXTENSIONS_DIR``, by default
  ``~/.cache/torch_extensions``), once per machine and source version (the source's hash is in
  the module name, so checkouts of different versions keep their own builds): later processes
  only load the shared library. The first build took 40 s here (two cores, ``MAX_JOBS=2``).
* ``TDRL_RECURRENT_EXT=0`` disables it (the Python loops run); read on every call.
* A failed build or load (no compiler, no ninja, a compile error) warns once and falls back
  to the Python loops for the rest of the process.
* AVX2 code (``at::vec::Vectorized<float>``, a polynomial ``exp`` for sigmoid / tanh) where
  torch reports AVX2 or AVX-512, that header's portable default (``std::exp``) otherwise.
"""

from __future__ import annotations

import hashlib
import os
import threading
import warnings
from pathlib import Path
from types import ModuleType

import torch

__all__ = ["enabled", "extension"]

_SOURCE = Path(__file__).with_name("cpu_ext.cpp")
_lock = threading.Lock()
_state: dict[str, object] = {}  # "module": the loaded module, or "failed": the error text


def enabled() -> bool:
    """Whether ``TDRL_RECURRENT_EXT`` allows the extension (anything but ``0`` / ``false`` / ``off``)."""
    return os.environ.get("TDRL_RECURRENT_EXT", "1").strip().lower() not in ("0", "false", "off", "no")


def _flags() -> tuple[str, list[str]]:
    cap = torch.backends.cpu.get_cpu_capability()
    if cap in ("AVX2", "AVX512"):
        return "avx2", ["-O3", "-mavx2", "-mfma", "-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2"]
    return "default", ["-O3", "-DCPU_CAPABILITY=DEFAULT"]


def _build() -> ModuleType:
    from torch.utils import cpp_extension

    tag, cflags = _flags()
    # the source's hash in the name: checkouts of different versions keep their own builds in the
    # shared cache instead of rebuilding over each other
    digest = hashlib.sha256(_SOURCE.read_bytes()).hexdigest()[:10]
    return cpp_extension.load(
        name=f"tdrl_recurrent_cpu_{tag}_{digest}", sources=[str(_SOURCE)], extra_cflags=cflags,
        verbose=False,
    )  # fmt: skip


def extension() -> ModuleType | None:
    """The compiled module (built / loaded on the first call), or None: disabled or failed."""
    if not enabled():
        return None
    mod = _state.get("module")
    if mod is not None:
        return mod  # type: ignore[return-value]
    if "failed" in _state:
        return None
    with _lock:
        if "module" not in _state and "failed" not in _state:
            try:
                _state["module"] = _build()
            except Exception as e:  # noqa: BLE001 - any build / load error means: fall back
                _state["failed"] = f"{type(e).__name__}: {e}"
                warnings.warn(
                    "tdrl.kernels: building the recurrent CPU extension (recurrent/cpu_ext.cpp) "
                    f"failed, using the Python loops instead ({_state['failed'][:300]}). "
                    "Set TDRL_RECURRENT_EXT=0 to skip the build.",
                    RuntimeWarning,
                    stacklevel=3,
                )
    return _state.get("module")  # type: ignore[return-value]


def _reset_for_tests() -> None:
    _state.clear()
