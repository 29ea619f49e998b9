"""Control groups for the code sandbox: one fresh group per run bounding the whole process tree
(``pids`` and ``memory``), and the sweep of groups and temp folders a killed caller left behind.

A group is made only where the caller may make one (root, with the controller's hierarchy
writable: cgroup v1 ``/sys/fs/cgroup/<controller>`` or a v2 root whose ``subtree_control``
enables it). Each group's name carries the caller's PID (``tdrl-sandbox-<pid>-*``), so that a
later caller can tell a leftover (its owner is gone) from a group in use.
"""

from __future__ import annotations

import glob
import logging
import os
import shutil
import signal
import tempfile
import time

__all__ = ["SandboxCgroup", "sweep_leftovers", "PREFIX"]

log = logging.getLogger(__name__)

PREFIX = "tdrl-sandbox-"
_V2 = "/sys/fs/cgroup"
# controller -> the limit file of cgroup v1 and of v2
_LIMIT_FILES = {"pids": ("pids.max", "pids.max"), "memory": ("memory.limit_in_bytes", "memory.max")}


def _owner_prefix() -> str:
    return f"{PREFIX}{os.getpid()}-"


def _v2_enables(controller: str) -> bool:
    try:
        with open(os.path.join(_V2, "cgroup.subtree_control")) as f:
            return controller in f.read().split()
    except OSError:
        return False


def _hierarchies(controller: str) -> list[tuple[str, str]]:
    """``(root, limit file)`` where a group bounding ``controller`` could be made."""
    v1, v2 = _LIMIT_FILES[controller]
    out = []
    if os.path.exists(os.path.join(_V2, controller, "cgroup.procs")):
        out.append((os.path.join(_V2, controller), v1))
    if os.path.exists(os.path.join(_V2, "cgroup.procs")) and _v2_enables(controller):
        out.append((_V2, v2))
    return out


class SandboxCgroup:
    """Fresh groups bounding a process tree's process count and memory, where they can be made.

    Args:
        max_procs: ``pids.max`` of the tree.
        memory_bytes: the tree's memory limit (every process together, tmpfs pages and
            ``memfd`` files they write included); ``None``: no memory group.

    Attributes:
        paths: the groups made (one per controller on cgroup v1, one for both on v2).
        limits: the controllers bounded, e.g. ``{"pids", "memory"}``.
    """

    def __init__(self, max_procs: int, memory_bytes: int | None = None):
        self.paths: list[str] = []
        self.limits: set[str] = set()
        if os.geteuid() != 0:
            return
        wanted = {"pids": max_procs, **({"memory": memory_bytes} if memory_bytes else {})}
        v2_path = None
        for controller, value in wanted.items():
            for root, limit_file in _hierarchies(controller):
                path = v2_path if root == _V2 and v2_path else None
                made = path is None
                try:
                    path = path or tempfile.mkdtemp(prefix=_owner_prefix(), dir=root)
                except OSError:
                    continue
                try:
                    with open(os.path.join(path, limit_file), "w") as f:
                        f.write(str(value))
                    if controller == "memory" and limit_file == "memory.limit_in_bytes":
                        _try_write(os.path.join(path, "memory.memsw.limit_in_bytes"), str(value))  # no swap either
                    if controller == "memory" and limit_file == "memory.max":
                        _try_write(os.path.join(path, "memory.swap.max"), "0")
                except OSError:
                    if made:
                        _rmdir(path)
                    continue
                if made:
                    self.paths.append(path)
                    if root == _V2:
                        v2_path = path
                self.limits.add(controller)
                break

    def wrap(self, cmd: list[str]) -> list[str]:
        """``cmd`` started by a shell that first moves itself into the groups, then ``exec`` s."""
        if not self.paths:
            return cmd
        moves = " && ".join(f'echo $$ > "{os.path.join(p, "cgroup.procs")}"' for p in self.paths)
        return ["/bin/sh", "-c", f'{moves} && exec "$@"', "sh", *cmd]

    def kill(self) -> None:
        for path in self.paths:
            _kill_members(path)

    def remove(self) -> None:
        for path in self.paths:
            if not _remove(path):
                log.warning("could not remove the sandbox cgroup %s (swept at a later start)", path)
        self.paths = []

    @property
    def oom_killed(self) -> bool:
        """Whether the memory limit killed a process of the tree (read before :meth:`remove`)."""
        for path in self.paths:
            for name, key in (("memory.events", "oom_kill"), ("memory.oom_control", "oom_kill")):
                try:
                    with open(os.path.join(path, name)) as f:
                        fields = dict(line.split() for line in f if len(line.split()) == 2)
                except OSError:
                    continue
                if int(fields.get(key, 0)) > 0:
                    return True
        return False


def _try_write(path: str, value: str) -> None:
    try:
        with open(path, "w") as f:
            f.write(value)
    except OSError:
        pass


def _rmdir(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError:
        pass


def _kill_members(path: str) -> None:
    try:
        with open(os.path.join(path, "cgroup.procs")) as f:
            pids = [int(x) for x in f.read().split()]
    except OSError:
        return
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _remove(path: str, tries: int = 50) -> bool:
    for _ in range(tries):
        try:
            os.rmdir(path)
            return True
        except FileNotFoundError:
            return True
        except OSError:  # still busy: processes being reaped
            _kill_members(path)
            time.sleep(0.02)
    return False


def _owner_alive(name: str) -> bool:
    """Whether the PID in ``tdrl-sandbox-<pid>-...`` runs (names without one count as alive)."""
    try:
        pid = int(name[len(PREFIX):].split("-", 1)[0])
    except ValueError:
        return True
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_leftovers(tmp_dir: str | None = None) -> list[str]:
    """Remove the groups and temp folders of sandbox callers that died mid-run (their owner
    PID is gone), killing any process still in such a group.

    Args:
        tmp_dir: where the temp folders are (default :func:`tempfile.gettempdir`).

    Returns:
        The paths removed.
    """
    removed = []
    roots = {_V2, *(os.path.join(_V2, c) for c in _LIMIT_FILES)}
    for root in sorted(roots):
        for path in glob.glob(os.path.join(root, PREFIX + "*")):
            if os.path.isdir(path) and not _owner_alive(os.path.basename(path)) and _remove(path, tries=5):
                removed.append(path)
    for path in glob.glob(os.path.join(tmp_dir or tempfile.gettempdir(), PREFIX + "*")):
        if os.path.isdir(path) and not _owner_alive(os.path.basename(path)):
            shutil.rmtree(path, ignore_errors=True)
            if not os.path.exists(path):
                removed.append(path)
    if removed:
        log.info("code sandbox: removed %d folder(s) left by callers that died: %s", len(removed), removed)
    return removed
