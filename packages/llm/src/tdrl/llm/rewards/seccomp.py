"""A seccomp filter that refuses ``memfd_create`` in the code sandbox, for machines where no
memory cgroup bounds the sandbox's tree (an unprivileged caller).

``memfd_create`` files are anonymous memory that no process maps, so ``RLIMIT_AS`` does not
count them: without a cgroup a program could hold gigabytes under ``memory_mb=128``. The filter
is a classic-BPF program written here by hand (stdlib only; bubblewrap installs it with
``--seccomp FD`` after setting ``no_new_privs``):

* the native architecture only (another ABI, e.g. 32-bit ``int 0x80`` calls, is refused
  wholesale, since its syscall numbers differ), and no x32 numbers (``nr >= 0x40000000``);
* ``memfd_create`` fails with ``EPERM``; every other call is allowed.
"""

from __future__ import annotations

import os
import platform
import struct

__all__ = ["MEMFD_FILTER_ARCHES", "memfd_filter", "memfd_filter_fd"]

# (AUDIT_ARCH_*, memfd_create's number) per machine
MEMFD_FILTER_ARCHES = {
    "x86_64": (0xC000003E, 319),
    "aarch64": (0xC00000B7, 279),
}

_LD_W_ABS, _JEQ_K, _JGE_K, _RET_K = 0x20, 0x15, 0x35, 0x06
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000
_EPERM = 1


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def memfd_filter(machine: str | None = None) -> bytes | None:
    """The compiled filter for ``machine`` (default this one), or ``None`` where unknown."""
    arch = MEMFD_FILTER_ARCHES.get(machine or platform.machine())
    if arch is None:
        return None
    audit_arch, nr = arch
    deny = _RET_ERRNO | _EPERM
    return b"".join([
        _insn(_LD_W_ABS, 0, 0, 4),             # 0: A = seccomp_data.arch
        _insn(_JEQ_K, 0, 4, audit_arch),       # 1: another ABI -> 6 (deny)
        _insn(_LD_W_ABS, 0, 0, 0),             # 2: A = seccomp_data.nr
        _insn(_JGE_K, 2, 0, 0x40000000),       # 3: x32 numbers -> 6 (deny)
        _insn(_JEQ_K, 1, 0, nr),               # 4: memfd_create -> 6 (deny)
        _insn(_RET_K, 0, 0, _RET_ALLOW),       # 5: allow
        _insn(_RET_K, 0, 0, deny),             # 6: EPERM
    ])


def memfd_filter_fd() -> int | None:
    """A readable file descriptor holding :func:`memfd_filter` (for ``bwrap --seccomp``), or
    ``None`` on a machine without a known filter. The caller closes it."""
    prog = memfd_filter()
    if prog is None:
        return None
    read, write = os.pipe()
    os.write(write, prog)  # 56 bytes: far below a pipe's buffer
    os.close(write)
    return read
