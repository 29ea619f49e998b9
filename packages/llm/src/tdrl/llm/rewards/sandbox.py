"""Run untrusted Python in a Linux-namespace sandbox (bubblewrap). Fails closed: where the
isolated sandbox cannot start, a call raises :class:`SandboxUnavailable` naming the cause;
programs run without isolation only when a caller asks for ``mode="rlimit"`` by name.

Isolated mode (``mode="bwrap"``, the default; ``"auto"`` means the same), which needs
`bubblewrap <https://github.com/containers/bubblewrap>`_ (``apt-get install bubblewrap``) and
user namespaces:

* own user, PID, mount, network, IPC, UTS (and cgroup where allowed) namespaces; the program
  is uid/gid 65534 inside, with no capabilities, cannot create further user namespaces (nor,
  through them, network namespaces) where bubblewrap has ``--disable-userns`` (0.8+), and dies
  with its caller (``--die-with-parent``);
* a minimal read-only root: ``/usr`` (and the ``/bin``, ``/lib*`` links), the interpreter's own
  prefix, a fresh ``/proc`` of the new PID namespace (the host's processes, their environments
  included, are not visible), a minimal read-only ``/dev``; no ``/etc``, ``/home``, ``/root``
  or repository, and no host ``/tmp`` (its Unix sockets are unreachable);
* the working directory is a private, size-limited tmpfs ``/tmp`` (``disk_mb`` in all; each
  file also limited by ``RLIMIT_FSIZE``), mounted *before* the interpreter's prefix is bound, so
  a venv or checkout under the host's ``/tmp`` stays visible (read-only); the environment is
  cleared;
* ``RLIMIT_AS`` (``memory_mb`` per process), ``RLIMIT_CPU``, ``RLIMIT_NOFILE`` (``max_files``),
  ``RLIMIT_NPROC`` (``max_procs``) set inside the namespaces with util-linux ``prlimit``; when
  the caller is root and the cgroup hierarchy is writable, one fresh cgroup bounds the *whole
  tree*: ``pids.max = max_procs`` (``RLIMIT_NPROC`` is not enforced for the mapped uid 0) and a
  memory limit of ``memory_mb + disk_mb`` (every process, its private ``/tmp`` and ``memfd``
  files together). Without a writable memory cgroup (an unprivileged caller) only the
  per-process bounds hold: ``k`` processes (``k <= max_procs``) may hold ``k * memory_mb``, and
  ``memfd_create`` (memory ``RLIMIT_AS`` does not count) is refused with ``EPERM`` by a seccomp
  filter (:mod:`tdrl.llm.rewards.seccomp`; x86_64 and aarch64, bubblewrap with ``--seccomp``);
* output is read incrementally: at ``max_output`` bytes on a stream the program is killed, so the
  caller never holds more than ``2 * max_output`` bytes; at the deadline the whole sandbox is
  killed (the namespace's init dies, which kills every process in it, ``setsid`` or not) and the
  caller returns within ``timeout`` plus a short grace, never waiting on a pipe without a limit.

Unconfined mode (``mode="rlimit"``, only when named) is the same process limits and output
handling without namespaces (network cut with ``unshare -n`` where allowed). It is *not
isolation* -- the program can read what the caller can read, its environment included, and a
``setsid`` child can outlive the call -- and it warns loudly. Apart from that ``memfd_create``
filter, neither mode filters system calls.

Cgroups and temp folders of a caller killed mid-run are swept at the next caller's first run
(:func:`tdrl.llm.rewards.cgroups.sweep_leftovers`).
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

from tdrl.llm.rewards.cgroups import PREFIX, SandboxCgroup, sweep_leftovers
from tdrl.llm.rewards.seccomp import memfd_filter_fd

__all__ = ["SANDBOX_MODES", "SandboxResult", "SandboxUnavailable", "check_sandbox_mode", "run_python_sandboxed",
           "sandbox_mode", "sandbox_problem"]

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
SANDBOX_MODES = ("bwrap", "auto", "rlimit")
"""``"bwrap"``: isolated or an error (default); ``"auto"``: the same (kept for configs that name it);
``"rlimit"``: unconfined, resource limits only (asked for by name, warns)."""
_fallback_warned = False  # the unconfined-mode warning is logged once per process (warnings.warn each call)
_swept = False  # leftovers of dead callers are swept once per process


class SandboxUnavailable(RuntimeError):
    """The isolated sandbox cannot start here; the message names bubblewrap's own error and
    what to do. Code is never run unconfined instead unless ``mode="rlimit"`` is asked for."""


@dataclass
class SandboxResult:
    """Outcome of one sandboxed run.

    Attributes:
        returncode: the exit status (negative: killed by that signal).
        stdout, stderr: captured output (at most ``max_output`` bytes each, decoded).
        timed_out: the wall-clock deadline fired and the sandbox was killed.
        mode: ``"bwrap"`` (namespace isolation) or ``"rlimit"`` (resource limits only).
        output_truncated: a stream reached ``max_output`` bytes and the program was killed.
        memory_exceeded: the tree's cgroup memory limit killed a process (where a cgroup was made).
    """

    returncode: int
    stdout: str
    stderr: str
    timed_out: bool
    mode: str = "rlimit"
    output_truncated: bool = False
    memory_exceeded: bool = False

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


@functools.lru_cache(maxsize=1)
def _bwrap_options() -> frozenset[str]:
    """The options the installed bubblewrap lists in ``bwrap --help``."""
    try:
        r = subprocess.run([shutil.which("bwrap") or "bwrap", "--help"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return frozenset()
    return frozenset(w for w in (r.stdout + r.stderr).split() if w.startswith("--"))


def _bwrap_command(code_fd: int, disk_bytes: int, limits: list[str], seccomp_fd: int | None = None) -> list[str]:
    cmd = [
        shutil.which("bwrap") or "bwrap",
        "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
        "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
    ]
    if seccomp_fd is not None:  # memfd_create refused: no memory cgroup bounds the tree
        cmd += ["--seccomp", str(seccomp_fd)]
    if "--disable-userns" in _bwrap_options():  # no nested user (hence network) namespaces
        cmd += ["--disable-userns"]
    # The private /tmp first: a prefix bound later under /tmp (a venv there) stays visible on top of it.
    cmd += ["--size", str(disk_bytes), "--tmpfs", "/tmp"]
    for d in _SYSTEM_DIRS:
        if os.path.islink(d):
            cmd += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            cmd += ["--ro-bind", d, d]
    for d in _python_roots():
        cmd += ["--ro-bind", d, d]
    cmd += [
        "--proc", "/proc", "--dev", "/dev", "--file", str(code_fd), "/tmp/main.py",
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


_USERNS_HINT = (
    "user namespaces are refused here: allow them (sysctl kernel.unprivileged_userns_clone=1, or "
    "kernel.apparmor_restrict_unprivileged_userns=0 on Ubuntu 24.04+; in Docker, run with "
    "--security-opt seccomp=unconfined --security-opt apparmor=unconfined, or --privileged)"
)


@functools.lru_cache(maxsize=1)
def _bwrap_problem() -> str | None:
    """``None`` when the isolated mode runs a trivial program here, else why not and what to do."""
    if not sys.platform.startswith("linux"):
        return f"namespaces need Linux (this is {sys.platform})"
    if shutil.which("bwrap") is None:
        return "bubblewrap is not installed: apt-get install bubblewrap (or dnf / apk install bubblewrap)"
    if shutil.which("prlimit") is None:
        return "util-linux's prlimit is not installed: apt-get install util-linux"
    exposed = [r for r in _python_roots() if r in ("/", "/tmp")]
    if exposed:
        return (f"the interpreter's prefix {exposed[0]!r} would expose the host's {exposed[0]} in the sandbox; "
                f"run from a venv or an interpreter installed in a folder of its own")
    res = _run("print('ok')", "bwrap", timeout=20.0, memory_mb=512, max_output=4096,
               disk_mb=1, max_files=64, max_procs=16)
    if res.returncode == 0 and res.stdout.strip() == "ok":
        return None
    err = res.stderr.strip()[-500:] or "(no error output)"
    hint = ""
    if any(s in err for s in ("namespace", "uid map", "uid_map", "setting up uid", "Operation not permitted")):
        hint = f"; {_USERNS_HINT}"
    elif "execute" in err or "execvp" in err or "No such file" in err:
        hint = (f"; the interpreter {sys.executable} (prefixes {_python_roots()}) could not be started inside "
                f"the sandbox's read-only root")
    return f"bubblewrap is installed but could not run a program (status {res.returncode}): {err}{hint}"


def sandbox_problem() -> str | None:
    """``None`` where the isolated sandbox runs here, else bubblewrap's own error and what to do
    (checked once per process by running a trivial program)."""
    return _bwrap_problem()


def sandbox_mode() -> str:
    """``"bwrap"`` where the isolated sandbox runs here, else ``"unavailable"`` (then every call
    that does not ask for ``mode="rlimit"`` raises :class:`SandboxUnavailable`; see
    :func:`sandbox_problem`)."""
    return "bwrap" if _bwrap_problem() is None else "unavailable"


def check_sandbox_mode(mode: str, where: str) -> str:
    """``mode`` if it is one of :data:`SANDBOX_MODES`, else a ``ValueError`` naming ``where``."""
    if mode not in SANDBOX_MODES:
        raise ValueError(f"{where}: mode={mode!r}; expected one of {SANDBOX_MODES} ('bwrap': isolated or an "
                         f"error, the default; 'rlimit': NOT isolation, only resource limits)")
    return mode


# ----------------------------------------------------------------------------- running
def _kill(proc: subprocess.Popen, cgroup: SandboxCgroup | None) -> None:
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


def _encode(text: str) -> bytes:
    """UTF-8, with lone surrogates passed through as bytes: the program then fails to decode
    them (a ``SyntaxError`` in its result) instead of the caller raising ``UnicodeEncodeError``."""
    return text.encode("utf-8", "surrogatepass")


def _run(code: str, mode: str, timeout: float, memory_mb: int, max_output: int, disk_mb: int,
         max_files: int, max_procs: int, stdin: str = "") -> SandboxResult:
    global _swept
    if not _swept:
        _swept = True
        sweep_leftovers()
    cpu = max(1, int(timeout + 0.999))
    disk = disk_mb * 1024 * 1024
    limits = _prlimit(memory_mb, cpu, min(disk, 16 * 1024 * 1024), max_files, max_procs)
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
    source = _encode(code if mode == "bwrap" or _unshare_prefix() else _NO_SOCKET + code)
    with tempfile.TemporaryDirectory(prefix=f"{PREFIX}{os.getpid()}-") as tmp:
        # the whole tree's processes and memory (the private /tmp included), where a cgroup can be made
        cgroup = SandboxCgroup(max_procs, (memory_mb + disk_mb) * 1024 * 1024)
        pass_fds: tuple[int, ...] = ()
        try:
            if mode == "bwrap":
                fd = os.memfd_create("tdrl-sandbox-main.py")
                with open(fd, "wb", closefd=False) as f:
                    f.write(source)
                os.lseek(fd, 0, os.SEEK_SET)
                # no memory cgroup: memfd files (memory RLIMIT_AS does not count) are refused instead
                filter_fd = (memfd_filter_fd() if "memory" not in cgroup.limits and "--seccomp" in _bwrap_options()
                             else None)
                pass_fds = (fd,) if filter_fd is None else (fd, filter_fd)
                cmd = _bwrap_command(fd, disk, limits, filter_fd)
            else:
                path = os.path.join(tmp, "main.py")
                with open(path, "wb") as f:
                    f.write(source)
                env["HOME"] = tmp
                cmd = [*_unshare_prefix(), *(limits if shutil.which("prlimit") else []), sys.executable, "-I", "-S",
                       path]
            proc = subprocess.Popen(
                cgroup.wrap(cmd), cwd=tmp, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, start_new_session=True, pass_fds=pass_fds,
                preexec_fn=None if shutil.which("prlimit") or mode == "bwrap" else _preexec_limits(memory_mb, cpu),
            )
            for fd in pass_fds:
                os.close(fd)
            pass_fds = ()
            out, err, timed_out, truncated = _communicate(proc, _encode(stdin), timeout, max_output, cgroup)
            try:
                rc = proc.wait(timeout=_GRACE_S)
            except subprocess.TimeoutExpired:
                log.warning("sandboxed process %d did not exit after SIGKILL; leaving it", proc.pid)
                rc = -signal.SIGKILL
            oom = cgroup.oom_killed
        finally:
            for fd in pass_fds:  # Popen failed: the descriptors are still ours
                os.close(fd)
            cgroup.kill()
            cgroup.remove()
    return SandboxResult(rc, out.decode(errors="replace"), err.decode(errors="replace"), timed_out, mode, truncated,
                         oom)


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
    mode: str = "bwrap",
) -> SandboxResult:
    """Run ``code`` with ``python -I -S`` in the sandbox described in this module's docstring.

    Args:
        code: Python source (no site-packages: the standard library only). Characters UTF-8
            cannot encode (lone surrogates) reach the program as bytes; it reports the error.
        timeout: wall-clock seconds before the whole sandbox is killed; the call returns within
            about ``timeout + 1`` s whatever the program does. CPU time is limited to the same
            number of seconds, rounded up.
        memory_mb: address-space limit (``RLIMIT_AS``) of each process in MiB; the whole tree
            is bounded by ``memory_mb + disk_mb`` where a cgroup can be made (root).
        stdin: text fed to the program's standard input.
        max_output: bytes kept of each of stdout and stderr; more than that kills the program
            (``output_truncated``) so the caller's memory does not grow with the output.
        disk_mb: total size of the private ``/tmp`` (isolated mode; each file is also limited to
            ``min(disk_mb, 16)`` MiB in both modes).
        max_files: open-file limit (``RLIMIT_NOFILE``).
        max_procs: process limit (``RLIMIT_NPROC``, and a cgroup ``pids.max`` when root).
        mode: ``"bwrap"`` (default; ``"auto"`` is the same): isolated, or
            :class:`SandboxUnavailable`. ``"rlimit"``: resource limits only, NOT isolation
            (the program reads what the caller can read); it warns on every call.

    Returns:
        A :class:`SandboxResult` whose ``mode`` says which mode ran.

    Raises:
        ValueError: a limit is not positive or ``mode`` is unknown.
        SandboxUnavailable: an isolated mode where bubblewrap cannot run; the message carries
            bubblewrap's own error and what to do.
    """
    check_sandbox_mode(mode, "run_python_sandboxed")
    for name, value in (("timeout", timeout), ("memory_mb", memory_mb), ("max_output", max_output),
                        ("disk_mb", disk_mb), ("max_files", max_files), ("max_procs", max_procs)):
        if not value > 0:
            raise ValueError(f"run_python_sandboxed: {name}={value!r}; expected a positive number")
    if mode != "rlimit":
        problem = _bwrap_problem()
        if problem is not None:
            raise SandboxUnavailable(
                f"run_python_sandboxed(mode={mode!r}): the isolated sandbox cannot run here, so the program was "
                f"not run: {problem}. (mode='rlimit' runs it without isolation: it can then read the caller's "
                f"files and environment; ask for it only for code you trust.)")
        mode = "bwrap"
    else:
        _warn_unconfined()
    return _run(code, mode, timeout, memory_mb, max_output, disk_mb, max_files, max_procs, stdin)


def _warn_unconfined() -> None:
    global _fallback_warned
    message = ("run_python_sandboxed(mode='rlimit') runs the program WITHOUT isolation (NOT isolation: "
               "resource limits only): it can read the caller's files, home and environment, write "
               "wherever the caller can, and a detached child can outlive the call. Use mode='bwrap' "
               "for model-written code.")
    if not _fallback_warned:
        _fallback_warned = True
        log.warning("code sandbox: %s", message)
    warnings.warn(message, RuntimeWarning, stacklevel=3)
