"""The sandbox's last guards (issue 39): ``memfd_create`` refused by a seccomp filter where no
memory cgroup bounds the tree, and isolation tests that fail, not skip, under a bubblewrap that
is installed but cannot start a sandbox."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys

import pytest

from tdrl.llm.rewards import cgroups, run_python_sandboxed, sandbox, seccomp

isolated = pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="bubblewrap is not installed: apt-get install bubblewrap"
)


def _run(code: str, **kw):
    kw.setdefault("timeout", 5.0)
    kw.setdefault("mode", "bwrap")
    return run_python_sandboxed(code, **kw)


_MEMFD = (
    "import os\nblock = b'x' * (1 << 20)\nfds, n = [], 0\n"
    "try:\n"
    "    for _ in range(40):\n"
    "        fds.append(os.memfd_create('x'))\n"
    "        for _ in range(15):\n"
    "            os.write(fds[-1], block); n += 1\n"
    "except OSError as e:\n"
    "    print('refused', e.errno)\n"
    "print('wrote', n)\n"
)


@isolated
def test_memfd_is_refused_where_no_memory_cgroup_bounds_the_tree(monkeypatch):
    """Issue 39: memfd files passed memory_mb=128 (600 MiB). Without a memory cgroup (an
    unprivileged caller) a seccomp filter refuses memfd_create; ordinary programs still run."""
    if seccomp.memfd_filter() is None:
        pytest.skip(f"no memfd filter for {platform.machine()} (x86_64 and aarch64 only)")

    class NoMemoryCgroup(cgroups.SandboxCgroup):  # what an unprivileged caller gets
        def __init__(self, max_procs, memory_bytes=None):
            super().__init__(max_procs, None)

    monkeypatch.setattr(sandbox, "SandboxCgroup", NoMemoryCgroup)
    res = _run(_MEMFD, memory_mb=128, timeout=20.0)
    assert res.ok and res.stdout.split() == ["refused", "1", "wrote", "0"], res  # EPERM at the first call
    res = _run("import os, tempfile\nprint(sum(range(5)), os.getpid() > 0)")
    assert res.ok and res.stdout.split() == ["10", "True"], res
    # i386 system calls (another ABI, other numbers) are refused wholesale
    code = ("import ctypes, mmap\n"
            "buf = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\n"
            "buf.write(bytes([0xb8, 20, 0, 0, 0, 0xcd, 0x80, 0xc3]))\n"  # eax=20 (i386 getpid); int 0x80; ret
            "f = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(buf)))\n"
            "print(f())\n")
    if platform.machine() == "x86_64":
        res = _run(code)
        assert res.ok and res.stdout.strip() == "-1", res  # -EPERM, not a pid


def test_the_memfd_filter_is_the_program_it_says():
    """The hand-written BPF: 7 instructions, arch check, x32 refusal, memfd_create -> EPERM."""
    import struct

    prog = seccomp.memfd_filter("x86_64")
    insns = [struct.unpack("=HBBI", prog[i:i + 8]) for i in range(0, len(prog), 8)]
    assert insns == [(0x20, 0, 0, 4), (0x15, 0, 4, 0xC000003E), (0x20, 0, 0, 0), (0x35, 2, 0, 0x40000000),
                     (0x15, 1, 0, 319), (0x06, 0, 0, 0x7FFF0000), (0x06, 0, 0, 0x00050001)]
    assert seccomp.memfd_filter("aarch64")[8 + 4:8 + 8] == struct.pack("=I", 0xC00000B7)
    assert seccomp.memfd_filter("riscv64") is None


def test_isolation_tests_fail_not_skip_when_bubblewrap_cannot_run(tmp_path):
    """Issue 39: in a venv where bubblewrap could not exec Python the isolation tests *skipped*
    (3 passed, 12 skipped). With a bubblewrap on PATH that cannot start a sandbox (it exits
    with a namespace error, as under a restrictive container), they run and fail."""
    fake = tmp_path / "bin" / "bwrap"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake.parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
           "OMP_NUM_THREADS": "1"}
    tests = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
         os.path.join(tests, "test_sandbox.py"), os.path.join(tests, "test_async_rewards.py"),
         "-k", "ordinary_programs or cannot_read_etc_shadow or parallel_code_reward_keeps"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    summary = out.stdout.strip().splitlines()[-1]
    assert "3 failed" in summary and "skipped" not in summary, out.stdout[-3000:]
    assert "setting up uid map: Permission denied" in out.stdout  # bubblewrap's own error is shown
