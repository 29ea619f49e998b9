"""Writing files so that a full disk is an ``OSError`` that names the file, never a SIGBUS.

Replay leaves are written through ``mmap`` of the file; if the file is sparse (``truncate``
only sets its length), the kernel allocates its blocks at the first write into the mapping,
and a full disk then kills the process with SIGBUS: no exception, no name. :func:`allocate`
reserves the blocks up front with ``posix_fallocate``, so ENOSPC is raised here, before any
data is written. :func:`write_bytes` does the same for a file whose bytes are known (a
checkpoint, a dump's state), and :func:`open_new` creates a file without following a
symlink planted at its path.

Checksums live here too, one home for checkpoints and replay dumps: :func:`sha256_bytes` /
:func:`sha256_file` compute them and :func:`verify_sha256` refuses a file whose bytes differ
from the digest recorded for it with a :class:`ChecksumError` naming the file.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil

__all__ = ["allocate", "open_new", "write_bytes", "sha256_bytes", "sha256_file", "verify_sha256",
           "ChecksumError", "DiskFullError"]


class DiskFullError(OSError):
    """No space for a file tdrl was about to write (``errno`` is ENOSPC or EDQUOT)."""


def _free_bytes(path: str) -> int | None:
    try:
        return shutil.disk_usage(os.path.dirname(os.path.abspath(path)) or ".").free
    except OSError:
        return None


def _named(err: OSError, path: str, nbytes: int) -> OSError:
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        free = _free_bytes(path)
        where = f"; {free:,} bytes are free there" if free is not None else ""
        return DiskFullError(err.errno, f"no space left on the device for {path}: it needs {nbytes:,} bytes{where}. "
                                        "Free space or point the run at another disk.", path)
    return err


def open_new(path: str) -> int:
    """Create (or truncate) ``path`` for writing and return its descriptor; a symlink at
    ``path`` is refused (``O_NOFOLLOW``), so a crafted folder cannot redirect the write."""
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o644)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, f"{path} is a symlink; tdrl does not write through links "
                                       "(remove it, or the folder was not written by tdrl)", path) from None
        raise


def allocate(fd: int, nbytes: int, path: str) -> None:
    """Reserve ``nbytes`` of real disk blocks for the open file ``fd`` (named ``path`` in
    errors). Raises :class:`DiskFullError` naming the file and the bytes when they do not fit."""
    if nbytes <= 0:
        return
    try:
        os.posix_fallocate(fd, 0, nbytes)
    except OSError as err:
        if err.errno in (errno.EOPNOTSUPP, errno.EINVAL, getattr(errno, "ENOTSUP", errno.EOPNOTSUPP)):
            # a file system without fallocate: write zeros, which allocates just the same
            _write_zeros(fd, nbytes, path)
            return
        raise _named(err, path, nbytes) from None


def _write_zeros(fd: int, nbytes: int, path: str) -> None:
    chunk = b"\0" * (1 << 20)
    os.lseek(fd, 0, os.SEEK_SET)
    left = nbytes
    try:
        while left:
            left -= os.write(fd, chunk[: min(left, len(chunk))])
    except OSError as err:
        raise _named(err, path, nbytes) from None
    os.lseek(fd, 0, os.SEEK_SET)


def write_bytes(path: str, data: bytes, *, fsync: bool = True) -> None:
    """Write ``data`` to a new file ``path`` (no symlink followed), its blocks reserved first:
    a full disk raises :class:`DiskFullError` naming ``path`` and the bytes needed."""
    fd = open_new(path)
    try:
        allocate(fd, len(data), path)
        view, done = memoryview(data), 0
        try:
            while done < len(data):
                done += os.write(fd, view[done:])
        except OSError as err:
            raise _named(err, path, len(data)) from None
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


class ChecksumError(ValueError):
    """A file's bytes differ from the SHA-256 recorded for them (bit rot, a partial copy,
    an edit)."""


def sha256_bytes(data) -> str:
    """The hex SHA-256 of ``data`` (bytes or a buffer)."""
    return hashlib.sha256(data).hexdigest()


def verify_sha256(path: str, want: str, recorded_in: str, advice: str) -> None:
    """Raise :class:`ChecksumError` naming ``path`` if its SHA-256 is not ``want``.

    Args:
        path: the file to check.
        want: the hex digest recorded when it was written.
        recorded_in: where ``want`` was read from (named in the error).
        advice: what the user can do (named in the error).
    """
    got = sha256_file(path)
    if got != want:
        raise ChecksumError(
            f"{path} does not match its checksum in {recorded_in} (sha256 {got[:12]}... != "
            f"{str(want)[:12]}...): the file is corrupt (disk error, partial copy or an edit). "
            f"{advice}")


def sha256_file(path: str) -> str:
    """The hex SHA-256 of the file at ``path``."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
