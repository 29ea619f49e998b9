"""Sandboxed execution of generated Python code, and a test-passing reward.

Each program runs in a fresh ``python -I`` process in an empty temporary directory, in its own
session (so a timeout kills the whole process group), with resource limits set in the child
before ``exec``: address space (``RLIMIT_AS``), CPU seconds (``RLIMIT_CPU``), file size and
open files. The network is cut with a new network namespace (``unshare -n``, or ``unshare -rn``
for an unprivileged user) where the kernel allows it; otherwise ``socket`` is disabled inside
the child before the program runs. This is defence in depth for reward computation, not a
security boundary for hostile code.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["SandboxResult", "run_python_sandboxed", "extract_code", "code_execution_reward"]

_NO_SOCKET = (
    "import socket as _s\n"
    "def _blocked(*a, **k):\n"
    "    raise OSError('network access is disabled in the sandbox')\n"
    "_s.socket = _blocked; _s.create_connection = _blocked; _s.socketpair = _blocked\n"
    "del _s, _blocked\n"
)


@dataclass
class SandboxResult:
    """Outcome of one sandboxed run.

    Attributes:
        returncode: the exit status (negative: killed by that signal).
        stdout, stderr: captured output (truncated to ``max_output`` bytes).
        timed_out: the wall-clock timeout fired and the process group was killed.
    """

    returncode: int
    stdout: str
    stderr: str
    timed_out: bool

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


@functools.lru_cache(maxsize=1)
def _unshare_prefix() -> tuple[str, ...]:
    """The ``unshare`` command that gives a process no network, or ``()`` when unavailable."""
    exe = shutil.which("unshare")
    if exe is None:
        return ()
    for args in ((exe, "-n"), (exe, "-rn")):
        try:
            r = subprocess.run([*args, "true"], capture_output=True, timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if r.returncode == 0:
            return args
    return ()


def _limits(memory_mb: int, cpu_seconds: int):
    def apply():  # runs in the child between fork and exec
        import resource

        mem = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
        resource.setrlimit(resource.RLIMIT_FSIZE, (16 * 1024 * 1024, 16 * 1024 * 1024))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


def run_python_sandboxed(
    code: str,
    timeout: float = 5.0,
    memory_mb: int = 512,
    stdin: str = "",
    max_output: int = 65536,
) -> SandboxResult:
    """Run ``code`` with ``python -I`` under time, memory and network limits.

    Args:
        code: Python source.
        timeout: wall-clock seconds before the process group is killed (CPU time is limited to
            the same number of seconds, rounded up).
        memory_mb: address-space limit of the child in MiB.
        stdin: text fed to the program.
        max_output: bytes of stdout/stderr kept.

    Returns:
        A :class:`SandboxResult`.
    """
    prefix = _unshare_prefix()
    source = code if prefix else _NO_SOCKET + code
    with tempfile.TemporaryDirectory(prefix="tdrl-sandbox-") as tmp:
        path = os.path.join(tmp, "main.py")
        with open(path, "w") as f:
            f.write(source)
        env = {"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1", "HOME": tmp, "LANG": "C.UTF-8"}
        proc = subprocess.Popen(
            [*prefix, sys.executable, "-I", "-S", path] if prefix else [sys.executable, "-I", "-S", path],
            cwd=tmp,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=_limits(memory_mb, max(1, int(timeout + 0.999))),
        )
        timed_out = False
        try:
            out, err = proc.communicate(stdin.encode(), timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            out, err = proc.communicate()
    return SandboxResult(
        returncode=proc.returncode,
        stdout=out[:max_output].decode(errors="replace"),
        stderr=err[:max_output].decode(errors="replace"),
        timed_out=timed_out,
    )


_FENCE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)


def extract_code(text: str) -> str:
    """The last fenced code block of ``text`` (```python ...```), or the whole text."""
    blocks = _FENCE.findall(text)
    return blocks[-1] if blocks else text


def code_execution_reward(timeout: float = 5.0, memory_mb: int = 512):
    """A reward that runs each completion's code followed by its tests in the sandbox.

    The dataset must have a ``tests`` column: a string of Python (e.g. ``assert`` lines) run
    after the completion's code. The reward is 1.0 when the program exits with status 0
    within the limits, else 0.0.

    Args:
        timeout: per-program wall-clock seconds.
        memory_mb: per-program address-space limit.

    Returns:
        A reward callable ``(prompts, completions, tests, **columns) -> list[float]``.
    """

    def reward(prompts: Sequence, completions: Sequence[str], tests: Sequence[str], **_) -> list[float]:
        out = []
        for c, t in zip(completions, tests, strict=True):
            res = run_python_sandboxed(extract_code(c) + "\n\n" + t + "\n", timeout=timeout, memory_mb=memory_mb)
            out.append(1.0 if res.ok else 0.0)
        return out

    reward.__name__ = "code_execution_reward"
    return reward
