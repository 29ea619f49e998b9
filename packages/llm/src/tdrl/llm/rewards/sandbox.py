"""Run untrusted Python in a Linux-namespace sandbox (bubblewrap), with an rlimit-only fallback.

Isolated mode (``mode="bwrap"``), used whenever `bubblewrap <https://github.com/containers/bubblewrap>`_
works on the machine (``apt-get install bubblewrap``; it needs user namespaces):

* own user, PID, mount, network, IPC, UTS (and cgroup where allowed) namespaces; the program
  is uid/gid 65534 inside, with no capabilities, and dies with its caller (``--die-with-parent``);
* a minimal read-only root: ``/usr`` (and the ``/bin``, ``/lib*`` links), the interpreter's own
  prefix, a fresh ``/proc`` of the new PID namespace (the host's processes, their environments
  included, are not visible), a minimal read-only ``/dev``; no ``/etc``, ``/home``, ``/root``
  or repository, and no host ``/tmp`` (its Unix sockets are unreachable);
* the working directory is a private, size-limited tmpfs ``/tmp`` (``disk_mb`` in all; each
  file also limited by ``RLIMIT_FSIZE``); the environment is cleared;
* ``RLIMIT_AS`` (``memory_mb``), ``RLIMIT_CPU``, ``RLIMIT_NOFILE`` (``max_files``),
  ``RLIMIT_NPROC`` (``max_procs``) set inside the namespaces with util-linux ``prlimit``; when
  the caller is root, ``RLIMIT_NPROC`` is not enforced for the mapped uid 0, so a cgroup
  ``pids.max`` is used instead where the pids controller is writable;
* output is read incrementally: at ``max_output`` bytes on a stream the program is killed, so the
  caller never holds more than ``2 * max_output`` bytes; at the deadline the whole sandbox is
  killed (the namespace's init dies, which kills every process in it, ``setsid`` or not) and the
  caller returns within ``timeout`` plus a short grace, never waiting on a pipe without a limit.

Fallback mode (``mode="rlimit"``) is the same process limits and output handling without
namespaces (network cut with ``unshare -n`` where allowed). It is *not isolation* — the program
can read what the caller can read and a ``setsid`` child can outlive the call — and it warns.
Neither mode filters system calls (no seccomp).
"""

from __future__ import annotations

import functools
import logging
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass

__all__ = ["SandboxResult", "sandbox_mode", "run_python_sandboxed"]

log = logging.getLogger(__name__)

_GRACE_S = 0.5  # after a kill (or the program's exit), how long to drain the pipes before closing them
_CHUNK = 65536
_UID = 65534
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_NO_SOCKET = (
    "import socket as _s\n"
    "def _blocked(*a, **k):\n"
    "    raise OSError('network access is disabled in the sandbox')\n"
    "_s.socket = _blocked; _s.create_connection = _blocked; _s.socketpair = _blocked\n"
    "del _s, _blocked\n"
)
_MODES = ("auto", "bwrap", "rlimit")
_fallback_warned = False  # the rlimit-only warning is given once per process


@dataclass
class SandboxResult:
    """Outcome of one sandboxed run.

    Attributes:
        returncode: the exit status (negative: killed by that signal).
        stdout, stderr: captured output (at most ``max_output`` bytes each, decoded).
        timed_out: the wall-clock deadline fired and the sandbox was killed.
        mode: ``"bwrap"`` (namespace isolation) or ``"rlimit"`` (resource limits only).
        output_truncated: a stream reached ``max_output`` bytes and the program was killed.
    """

    returncode: int
    stdout: str
    stderr: str
    timed_out: bool
    mode: str = "rlimit"
    output_truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and not self.output_truncated


# ----------------------------------------------------------------------------- commands
def _python_roots() -> list[str]:
    """Folders the interpreter needs (its prefixes and the executable's folder) outside ``/usr``."""
    paths = {sys.prefix, sys.base_prefix, os.path.dirname(os.path.abspath(sys.executable))}
    paths |= {os.path.realpath(p) for p in paths}
    roots: list[str] = []
    for p in sorted(paths, key=len):  # parents first, so that a folder inside one is not bound twice
        if os.path.isdir(p) and not any(p == r or p.startswith(r.rstrip("/") + "/") for r in ("/usr", *roots)):
            roots.append(p)
    return roots


def _prlimit(memory_mb: int, cpu_seconds: int, file_bytes: int, max_files: int, max_procs: int) -> list[str]:
    mem = memory_mb * 1024 * 1024
    return [
        shutil.which("prlimit") or "/usr/bin/prlimit",
        f"--as={mem}:{mem}", f"--cpu={cpu_seconds}:{cpu_seconds + 1}", f"--fsize={file_bytes}:{file_bytes}",
        f"--nofile={max_files}:{max_files}", f"--nproc={max_procs}:{max_procs}", "--core=0:0", "--",
    ]


def _bwrap_command(code_fd: int, disk_bytes: int, limits: list[str]) -> list[str]:
    cmd = [
        shutil.which("bwrap") or "bwrap",
        "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
        "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
    ]
    for d in _SYSTEM_DIRS:
        if os.path.islink(d):
            cmd += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            cmd += ["--ro-bind", d, d]
    for d in _python_roots():
        cmd += ["--ro-bind", d, d]
    cmd += [
        "--proc", "/proc", "--dev", "/dev",
        "--size", str(disk_bytes), "--tmpfs", "/tmp", "--file", str(code_fd), "/tmp/main.py",
        "--remount-ro", "/", "--remount-ro", "/dev",
        "--uid", str(_UID), "--gid", str(_UID), "--chdir", "/tmp", "--clearenv",
        "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp", "--setenv", "LANG", "C.UTF-8",
        "--setenv", "PYTHONDONTWRITEBYTECODE", "1",
    ]
    return [*cmd, *limits, sys.executable, "-I", "-S", "/tmp/main.py"]


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


@functools.lru_cache(maxsize=1)
def _bwrap_problem() -> str | None:
    """``None`` when the isolated mode runs a trivial program here, else why it cannot."""
    if not sys.platform.startswith("linux"):
        return f"namespaces need Linux (this is {sys.platform})"
    for tool in ("bwrap", "prlimit"):
        if shutil.which(tool) is None:
            return f"{tool!r} is not installed (apt-get install bubblewrap util-linux)"
    res = _run("print('ok')", "bwrap", timeout=20.0, memory_mb=512, max_output=4096,
               disk_mb=1, max_files=64, max_procs=16)
    if res.returncode != 0 or res.stdout.strip() != "ok":
        return f"bwrap failed (status {res.returncode}): {res.stderr.strip()[-300:]}"
    return None


def sandbox_mode() -> str:
    """The mode ``run_python_sandboxed(mode="auto")`` uses here: ``"bwrap"`` or ``"rlimit"``."""
    return "bwrap" if _bwrap_problem() is None else "rlimit"


# ----------------------------------------------------------------------------- cgroup (root only)
class _PidsCgroup:
    """A fresh pids-controller cgroup with ``pids.max``, or nothing where none can be made."""

    def __init__(self, max_procs: int):
        self.path: str | None = None
        if os.geteuid() != 0:
            return
        for root in ("/sys/fs/cgroup/pids", "/sys/fs/cgroup"):
            if not os.path.exists(os.path.join(root, "cgroup.procs")):
                continue
            if root == "/sys/fs/cgroup" and not _v2_has_pids(root):
                continue
            try:
                path = tempfile.mkdtemp(prefix="tdrl-sandbox-", dir=root)
            except OSError:
                continue
            try:
                with open(os.path.join(path, "pids.max"), "w") as f:
                    f.write(str(max_procs))
            except OSError:
                os.rmdir(path)
                continue
            self.path = path
            return

    def wrap(self, cmd: list[str]) -> list[str]:
        """``cmd`` started by a shell that first moves itself into the cgroup, then ``exec`` s."""
        if self.path is None:
            return cmd
        procs = os.path.join(self.path, "cgroup.procs")
        return ["/bin/sh", "-c", f'echo $$ > "{procs}" && exec "$@"', "sh", *cmd]

    def kill(self) -> None:
        if self.path is None:
            return
        try:
            with open(os.path.join(self.path, "cgroup.procs")) as f:
                pids = [int(x) for x in f.read().split()]
        except OSError:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def remove(self) -> None:
        if self.path is None:
            return
        for _ in range(50):
            try:
                os.rmdir(self.path)
                break
            except FileNotFoundError:
                break
            except OSError:  # still busy: processes being reaped
                self.kill()
                time.sleep(0.02)
        else:
            log.warning("could not remove the sandbox cgroup %s", self.path)
        self.path = None


def _v2_has_pids(root: str) -> bool:
    try:
        with open(os.path.join(root, "cgroup.subtree_control")) as f:
            return "pids" in f.read().split()
    except OSError:
        return False


# ----------------------------------------------------------------------------- running
def _kill(proc: subprocess.Popen, cgroup: _PidsCgroup | None) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if cgroup is not None:
        cgroup.kill()


def _communicate(proc: subprocess.Popen, data: bytes, timeout: float, max_output: int, cgroup):
    """Feed ``data``, read both pipes in chunks, kill at the deadline or past ``max_output``.

    Returns ``(stdout, stderr, timed_out, truncated)``. The call lasts at most ``timeout`` plus
    one grace period whatever the program does (a child holding the pipes open included): the
    pipes are closed at the end even if something still holds their other end.
    """
    fd_out, fd_err = proc.stdout.fileno(), proc.stderr.fileno()
    fd_in = proc.stdin.fileno()
    bufs = {fd_out: bytearray(), fd_err: bytearray()}
    sel = selectors.DefaultSelector()
    for fd in (fd_out, fd_err):
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    view = memoryview(data)
    if view:
        os.set_blocking(fd_in, False)
        sel.register(fd_in, selectors.EVENT_WRITE)
    else:
        proc.stdin.close()
    deadline = time.monotonic() + timeout
    timed_out = truncated = killed = exited = False
    try:
        while any(fd in sel.get_map() for fd in (fd_out, fd_err)):
            now = time.monotonic()
            if now >= deadline:
                if killed or exited:
                    break  # grace over: stop waiting on pipes something else holds open
                timed_out = killed = True
                _kill(proc, cgroup)
                deadline = now + _GRACE_S
            if not exited and proc.poll() is not None:
                exited = True  # the program is gone; its leftovers get a grace period
                deadline = min(deadline, now + _GRACE_S)
            for key, _ in sel.select(timeout=max(0.0, min(deadline - now, 0.05))):
                if key.fd == fd_in:
                    try:
                        view = view[os.write(fd_in, view[:_CHUNK]):]
                    except BlockingIOError:
                        continue
                    except OSError:  # the program closed its stdin
                        view = view[:0]
                    if not view:
                        sel.unregister(fd_in)
                        proc.stdin.close()
                    continue
                try:
                    chunk = os.read(key.fd, _CHUNK)
                except BlockingIOError:
                    continue
                if not chunk:
                    sel.unregister(key.fd)
                    continue
                buf = bufs[key.fd]
                room = max_output - len(buf)
                buf += chunk[:room]
                if len(chunk) > room and not killed:
                    truncated = killed = True
                    _kill(proc, cgroup)
                    deadline = time.monotonic() + _GRACE_S
    finally:
        sel.close()
        for f in (proc.stdin, proc.stdout, proc.stderr):
            try:
                f.close()
            except OSError:
                pass
    if not killed:
        _kill(proc, cgroup)  # leftovers of the program's process group
    return bytes(bufs[fd_out]), bytes(bufs[fd_err]), timed_out, truncated


def _run(code: str, mode: str, timeout: float, memory_mb: int, max_output: int, disk_mb: int,
         max_files: int, max_procs: int, stdin: str = "") -> SandboxResult:
    cpu = max(1, int(timeout + 0.999))
    disk = disk_mb * 1024 * 1024
    limits = _prlimit(memory_mb, cpu, min(disk, 16 * 1024 * 1024), max_files, max_procs)
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
    cgroup = None
    with tempfile.TemporaryDirectory(prefix="tdrl-sandbox-") as tmp:
        pass_fds: tuple[int, ...] = ()
        if mode == "bwrap":
            fd = os.memfd_create("tdrl-sandbox-main.py")
            os.write(fd, code.encode())
            os.lseek(fd, 0, os.SEEK_SET)
            pass_fds = (fd,)
            cmd = _bwrap_command(fd, disk, limits)
            cgroup = _PidsCgroup(max_procs)
            cmd = cgroup.wrap(cmd)
        else:
            path = os.path.join(tmp, "main.py")
            with open(path, "w") as f:
                f.write(code if _unshare_prefix() else _NO_SOCKET + code)
            env["HOME"] = tmp
            cmd = [*_unshare_prefix(), *(limits if shutil.which("prlimit") else []), sys.executable, "-I", "-S", path]
        try:
            proc = subprocess.Popen(
                cmd, cwd=tmp, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                start_new_session=True, pass_fds=pass_fds,
                preexec_fn=None if shutil.which("prlimit") or mode == "bwrap" else _preexec_limits(memory_mb, cpu),
            )
        finally:
            for fd in pass_fds:
                os.close(fd)
        try:
            out, err, timed_out, truncated = _communicate(proc, stdin.encode(), timeout, max_output, cgroup)
            try:
                rc = proc.wait(timeout=_GRACE_S)
            except subprocess.TimeoutExpired:
                log.warning("sandboxed process %d did not exit after SIGKILL; leaving it", proc.pid)
                rc = -signal.SIGKILL
        finally:
            if cgroup is not None:
                cgroup.remove()
    return SandboxResult(rc, out.decode(errors="replace"), err.decode(errors="replace"), timed_out, mode, truncated)


def _preexec_limits(memory_mb: int, cpu_seconds: int):
    """rlimits set between fork and exec, only where util-linux ``prlimit`` is missing."""

    def apply():
        import resource

        mem = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
        resource.setrlimit(resource.RLIMIT_FSIZE, (16 * 1024 * 1024, 16 * 1024 * 1024))
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


def run_python_sandboxed(
    code: str,
    timeout: float = 5.0,
    memory_mb: int = 512,
    stdin: str = "",
    max_output: int = 65536,
    *,
    disk_mb: int = 32,
    max_files: int = 64,
    max_procs: int = 32,
    mode: str = "auto",
) -> SandboxResult:
    """Run ``code`` with ``python -I -S`` in the sandbox described in this module's docstring.

    Args:
        code: Python source (no site-packages: the standard library only).
        timeout: wall-clock seconds before the whole sandbox is killed; the call returns within
            about ``timeout + 1`` s whatever the program does. CPU time is limited to the same
            number of seconds, rounded up.
        memory_mb: address-space limit (``RLIMIT_AS``) in MiB.
        stdin: text fed to the program's standard input.
        max_output: bytes kept of each of stdout and stderr; more than that kills the program
            (``output_truncated``) so the caller's memory does not grow with the output.
        disk_mb: total size of the private ``/tmp`` (isolated mode; each file is also limited to
            ``min(disk_mb, 16)`` MiB in both modes).
        max_files: open-file limit (``RLIMIT_NOFILE``).
        max_procs: process limit (``RLIMIT_NPROC``, or a cgroup ``pids.max`` when root).
        mode: ``"auto"`` (isolated where bubblewrap works, else the fallback with a warning),
            ``"bwrap"`` (isolated, or ``RuntimeError``) or ``"rlimit"`` (the fallback).

    Returns:
        A :class:`SandboxResult` whose ``mode`` says which mode ran.

    Raises:
        ValueError: a limit is not positive or ``mode`` is unknown.
        RuntimeError: ``mode="bwrap"`` where bubblewrap cannot run.
    """
    if mode not in _MODES:
        raise ValueError(f"run_python_sandboxed: mode={mode!r}; expected one of {_MODES}")
    for name, value in (("timeout", timeout), ("memory_mb", memory_mb), ("max_output", max_output),
                        ("disk_mb", disk_mb), ("max_files", max_files), ("max_procs", max_procs)):
        if not value > 0:
            raise ValueError(f"run_python_sandboxed: {name}={value!r}; expected a positive number")
    if mode != "rlimit":
        problem = _bwrap_problem()
        if problem is None:
            mode = "bwrap"
        elif mode == "bwrap":
            raise RuntimeError(f"run_python_sandboxed(mode='bwrap'): the isolated sandbox cannot run here: {problem}")
        else:
            mode = "rlimit"
    global _fallback_warned
    if mode == "rlimit" and not _fallback_warned:
        _fallback_warned = True
        problem = _bwrap_problem()
        log.warning("code sandbox: rlimit-only mode (not isolation)%s", f": {problem}" if problem else "")
        warnings.warn(
            "run_python_sandboxed is running in rlimit-only mode, which is NOT isolation: the program "
            "can read the caller's files and environment and a detached child can outlive the call"
            + (f" (isolated mode unavailable: {problem})" if problem else " (chosen with mode='rlimit')"),
            RuntimeWarning,
            stacklevel=2,
        )
    return _run(code, mode, timeout, memory_mb, max_output, disk_mb, max_files, max_procs, stdin)
