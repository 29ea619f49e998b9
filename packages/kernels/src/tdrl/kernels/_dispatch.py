"""Backend selection shared by every op: Triton kernel or pure-torch reference.

Rules, checked on every call (they are cheap):

* ``TDRL_KERNELS=torch`` (or :func:`use_backend("torch")`) always runs the reference.
* ``TDRL_KERNELS=auto`` (the default) runs Triton when ``triton`` is importable and every
  input tensor lives on a CUDA device, otherwise the reference.
* ``TDRL_KERNELS=triton`` (or :func:`use_backend("triton")`) runs Triton even on CPU tensors
  when ``TRITON_INTERPRET=1`` is set (Triton's CPU interpreter, used by the tests); without
  CUDA and without the interpreter it raises, since the kernel cannot run.
* ``TDRL_KERNELS=compile`` (or :func:`use_backend("compile")`) is ``auto`` with the
  references of the ops where it pays on the CPU run through ``torch.compile`` (see
  :func:`call_reference`): today the policy-gradient token loss (figures in
  benchmarks/RESULTS.md, "Kernels"). The GAE scan is already vectorised (compiling it
  lost) and the log-prob ops are bound by their chunked matmuls / softmax, so they keep
  their eager reference.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import warnings
from collections.abc import Callable, Iterator

import torch

from ._optional import missing_message

_BACKENDS = ("auto", "torch", "triton", "compile")
_override: str | None = None


@functools.cache
def triton_available() -> bool:
    """Whether the ``triton`` package can be imported (checked once)."""
    return importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    """Whether Triton runs in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def current_backend() -> str:
    """The requested backend: the :func:`use_backend` override, else ``$TDRL_KERNELS``."""
    mode = _override if _override is not None else os.environ.get("TDRL_KERNELS", "auto")
    mode = mode.strip().lower() or "auto"
    if mode not in _BACKENDS:
        raise ValueError(f"TDRL_KERNELS must be one of {_BACKENDS}, got {mode!r}.")
    return mode


@contextlib.contextmanager
def use_backend(backend: str) -> Iterator[None]:
    """Force a backend inside a ``with`` block (``"auto"``, ``"torch"``, ``"triton"`` or ``"compile"``).

    Example:
        >>> with use_backend("torch"):
        ...     adv, target = gae(reward, value, next_value, done, terminated, 0.99, 0.95)
    """
    global _override
    if backend not in _BACKENDS:
        raise ValueError(f"backend must be one of {_BACKENDS}, got {backend!r}.")
    previous, _override = _override, backend
    try:
        yield
    finally:
        _override = previous


def use_triton(*tensors: torch.Tensor | None) -> bool:
    """Decide whether an op called with ``tensors`` should run its Triton kernel.

    Args:
        *tensors: the op's tensor inputs (``None`` entries are ignored).

    Returns:
        ``True`` for the Triton kernel, ``False`` for the torch reference.
    """
    mode = current_backend()
    if mode == "torch":
        return False
    present = [t for t in tensors if t is not None]
    on_cuda = bool(present) and all(t.is_cuda for t in present)
    if not triton_available():
        if mode == "triton":
            raise ModuleNotFoundError(
                missing_message("triton", extra="triton", what="TDRL_KERNELS=triton"), name="triton"
            )
        return False
    if on_cuda:
        return True
    if mode == "triton":
        if interpreting():
            return True
        raise RuntimeError(
            "TDRL_KERNELS=triton on CPU tensors needs Triton's interpreter: set "
            "TRITON_INTERPRET=1 before importing triton, or move the inputs to CUDA."
        )
    return False


def torch_reference(op: Callable) -> Callable:
    """``op`` with the dispatch forced to its pure-torch path: the public ``*_reference``.

    The reference has ``op``'s signature, documentation of the arguments and result (it runs
    the same code under :func:`use_backend("torch")`), so both are written once.
    """

    @functools.wraps(op)
    def reference(*args, **kwargs):
        with use_backend("torch"):
            return op(*args, **kwargs)

    reference.__name__ = reference.__qualname__ = f"{op.__name__}_reference"
    reference.__doc__ = (
        f"Pure-torch :func:`tdrl.kernels.{op.__name__}` (same signature and result: the op "
        'run under ``use_backend("torch")``).'
    )
    return reference


_compiled: dict[Callable, Callable] = {}
_compile_failed: set[Callable] = set()


def call_reference(fn: Callable, *args):
    """Run the torch reference ``fn(*args)``, through ``torch.compile`` under ``compile``.

    The compiled function is made once per reference (``dynamic=None``: the first new shape
    recompiles with dynamic sizes). When compiling fails (no C++ compiler, an unsupported
    op), the call is repeated eagerly: a genuine input error then raises as it would without
    compile, and otherwise a ``RuntimeWarning`` names the cause and this reference runs
    eagerly from then on.
    """
    if current_backend() != "compile" or fn in _compile_failed:
        return fn(*args)
    compiled = _compiled.get(fn)
    if compiled is None:
        compiled = _compiled[fn] = torch.compile(fn)
    try:
        return compiled(*args)
    except Exception as exc:  # noqa: BLE001 - re-run eagerly: real input errors re-raise there
        out = fn(*args)
        _compile_failed.add(fn)
        warnings.warn(
            f"TDRL_KERNELS=compile: torch.compile of {fn.__name__} failed "
            f"({type(exc).__name__}: {str(exc)[:200]}); it runs eagerly from now on.",
            RuntimeWarning,
            stacklevel=3,
        )
        return out
