"""The code sandbox: every escape of issue 22 is blocked, ordinary programs still run.

Each probe is a small program run through :func:`run_python_sandboxed`; the test asserts from the
host side (files that must not appear, sockets that must not be reached, the caller's wall time
and memory). Loopback only; each call is bounded by its own timeout.
"""

from __future__ import annotations

import ast
import os
import secrets
import socket
import subprocess
import sys
import time

import psutil
import pytest

from tdrl.llm.rewards import run_python_sandboxed, sandbox
from tdrl.llm.rewards.sandbox import sandbox_mode

isolated = pytest.mark.skipif(
    sandbox_mode() != "bwrap",
    reason=f"isolated sandbox unavailable ({sandbox._bwrap_problem()}); install bubblewrap (apt-get install bubblewrap)",
)

MARGIN_S = 1.5  # the caller returns within timeout + this, whatever the program does


def _run(code: str, **kw):
    kw.setdefault("timeout", 5.0)
    kw.setdefault("mode", "bwrap")
    return run_python_sandboxed(code, **kw)


# ----------------------------------------------------------------------------- still works
@isolated
def test_ordinary_programs_run_and_report_the_mode():
    res = _run("import sys, math\nprint(sum(range(10)), math.factorial(5))\nprint(sys.stdin.read().upper())",
               stdin="hello")
    assert res.ok and res.mode == "bwrap", res
    assert res.stdout.split() == ["45", "120", "HELLO"]
    res = _run("import sys\nsys.stderr.write('err')\nraise SystemExit(3)")
    assert res.returncode == 3 and not res.ok and res.stderr == "err"
    res = _run("open('/tmp/scratch', 'w').write('x' * 1000)\nprint(len(open('/tmp/scratch').read()))")
    assert res.ok and res.stdout.strip() == "1000"  # the private /tmp is writable and is the cwd
    assert _run("import os; print(os.getcwd())").stdout.strip() == "/tmp"


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="mode='nope'"):
        run_python_sandboxed("pass", mode="nope")
    with pytest.raises(ValueError, match="timeout=0"):
        run_python_sandboxed("pass", timeout=0)


def test_fallback_mode_warns_once_that_it_is_not_isolation(monkeypatch):
    monkeypatch.setattr(sandbox, "_fallback_warned", False)
    with pytest.warns(RuntimeWarning, match="NOT isolation"):
        res = run_python_sandboxed("print(6 * 7)", mode="rlimit")
    assert res.ok and res.stdout.strip() == "42" and res.mode == "rlimit"
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second warning would raise
        assert run_python_sandboxed("print(1)", mode="rlimit").ok


@pytest.mark.parametrize("mode", ["bwrap", "rlimit"])
def test_fallback_also_bounds_the_caller_on_a_detached_child(mode, monkeypatch):
    if mode == "bwrap" and sandbox_mode() != "bwrap":
        pytest.skip("isolated sandbox unavailable")
    monkeypatch.setattr(sandbox, "_fallback_warned", True)
    code = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(20)\nelse:\n    time.sleep(20)\n"
    t = time.monotonic()
    res = run_python_sandboxed(code, timeout=1.0, mode=mode)
    assert time.monotonic() - t < 1.0 + MARGIN_S and res.timed_out and res.mode == mode


# ----------------------------------------------------------------------------- escapes
@isolated
def test_forked_setsid_child_is_killed_at_the_deadline():
    marker = f"{20 + secrets.randbelow(10**6) / 10**7:.7f}"  # a unique argv to find it on the host
    code = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        f"    os.execv('/bin/sleep', ['sleep', '{marker}'])\n"
        "time.sleep(20)\n"
    )
    t = time.monotonic()
    res = _run(code, timeout=1.0)
    wall = time.monotonic() - t
    assert res.timed_out and wall < 1.0 + MARGIN_S, (wall, res)
    time.sleep(0.3)
    left = [p.pid for p in psutil.process_iter(["cmdline"]) if (p.info["cmdline"] or [])[-1:] == [marker]]
    assert not left, f"the detached child survived the sandbox: {left}"
    # the program exits at once and its detached child keeps the pipes: the call returns anyway
    t = time.monotonic()
    res = _run("import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(20)\nprint('parent done')", timeout=10.0)
    assert time.monotonic() - t < MARGIN_S and res.stdout.strip() == "parent done", res


@isolated
def test_cannot_read_etc_shadow():
    res = _run("try:\n    print(open('/etc/shadow').read())\nexcept OSError as e:\n    print('blocked', type(e).__name__)")
    assert res.stdout.startswith("blocked"), res
    assert "root:" not in res.stdout


# Run by a fresh interpreter whose environment holds the secret: /proc/<pid>/environ shows a
# process's environment as it was at exec, so a secret set in os.environ later would not show.
_ENV_PROBE = r'''
import importlib.util, sys
spec = importlib.util.spec_from_file_location("sbx", sys.argv[1])
m = importlib.util.module_from_spec(spec); sys.modules["sbx"] = m; spec.loader.exec_module(m)
code = """
import os
seen = [repr(dict(os.environ))]
for pid in [str(os.getppid())] + [p for p in os.listdir("/proc") if p.isdigit()]:
    try:
        seen.append(open(f"/proc/{pid}/environ", "rb").read().decode(errors="replace"))
    except OSError as e:
        seen.append(repr(e))
print(chr(10).join(seen)); print("pids", sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
"""
print(m.run_python_sandboxed(code, mode="bwrap").stdout)
'''


@isolated
def test_parent_environment_is_not_visible(monkeypatch):
    secret = secrets.token_hex(16)
    monkeypatch.setenv("TDRL_SECRET_PROBE", secret)  # in this process and in the caller started below
    out = subprocess.run([sys.executable, "-c", _ENV_PROBE, sandbox.__file__], capture_output=True, text=True,
                         timeout=30, env=dict(os.environ))
    assert out.returncode == 0 and "pids" in out.stdout, out.stderr
    assert secret not in out.stdout and "TDRL_SECRET_PROBE" not in out.stdout
    assert max(ast.literal_eval(out.stdout.rsplit("pids", 1)[1].strip())) < 10  # its own PID namespace


@isolated
def test_cannot_write_outside_its_tmp(tmp_path):
    token = secrets.token_hex(8)
    targets = [str(tmp_path / f"escape-{token}"), os.path.join(os.getcwd(), f"escape-{token}"),
               f"/escape-{token}", os.path.expanduser(f"~/escape-{token}"), f"/dev/shm/escape-{token}"]
    code = (
        f"for p in {targets!r}:\n"
        "    try:\n"
        "        open(p, 'w').write('x'); print('WROTE', p)\n"
        "    except OSError as e:\n"
        "        print('blocked', p, type(e).__name__)\n"
        f"open('/tmp/escape-{token}', 'w').write('only inside')\n"  # the private /tmp, not the host's
    )
    res = _run(code)
    assert res.ok and "WROTE" not in res.stdout and res.stdout.count("blocked") == len(targets), res
    for p in [*targets, f"/tmp/escape-{token}"]:
        assert not os.path.exists(p), f"the sandbox wrote {p} on the host"


@isolated
def test_cannot_connect_to_a_host_unix_socket(tmp_path):
    path = str(tmp_path / "s.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    server.settimeout(0.2)
    try:
        code = (
            "import socket\ns = socket.socket(socket.AF_UNIX)\n"
            f"try:\n    s.connect({path!r}); print('CONNECTED')\n"
            "except OSError as e:\n    print('blocked', type(e).__name__)\n"
        )
        res = _run(code)
        assert res.stdout.startswith("blocked"), res
        with pytest.raises(TimeoutError):
            server.accept()
    finally:
        server.close()


@isolated
def test_cannot_connect_to_loopback_tcp():
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    port = server.getsockname()[1]
    try:
        code = (
            "import socket\n"
            f"try:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2); print('CONNECTED')\n"
            "except OSError as e:\n    print('blocked', type(e).__name__)\n"
        )
        res = _run(code)
        assert res.stdout.startswith("blocked"), res
        with pytest.raises(TimeoutError):
            server.accept()
    finally:
        server.close()


@isolated
def test_fork_bomb_is_bounded():
    # bounded at 400 forks so that a broken limit cannot take the host down with it
    code = (
        "import os, time\nn = 0\n"
        "try:\n"
        "    while n < 400:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(3); os._exit(0)\n"
        "        n += 1\n"
        "    print('forks', n)\n"
        "except OSError as e:\n"
        "    print('forks', n, type(e).__name__)\n"
    )
    t = time.monotonic()
    res = _run(code, max_procs=16, timeout=5.0)
    assert time.monotonic() - t < 5.0 + MARGIN_S
    n = int(res.stdout.split()[1])
    assert n < 16 and "BlockingIOError" in res.stdout, res
    assert subprocess.run(["true"], timeout=5).returncode == 0  # the host can still start processes


@isolated
def test_open_files_are_limited():
    code = (
        "fs = []\n"
        "try:\n"
        "    while len(fs) < 5000:\n"
        "        fs.append(open('/tmp/main.py'))\n"
        "except OSError as e:\n"
        "    print(len(fs), e.errno)\n"
    )
    res = _run(code, max_files=64)
    n, errno = res.stdout.split()
    assert int(n) < 64 and int(errno) == 24, res  # EMFILE


@isolated
def test_disk_is_capped_in_total_not_per_file():
    # each file (1.5 MiB) is under the per-file cap (4 MiB); together they pass the 4 MiB disk
    code = (
        "written = 0\n"
        "try:\n"
        "    for i in range(6):\n"
        "        with open(f'/tmp/f{i}', 'wb') as f:\n"
        "            f.write(b'x' * (3 << 19))\n"
        "        written += 3 << 19\n"
        "except OSError as e:\n"
        "    print('full', e.errno)\n"
        "print('written', written)\n"
    )
    res = _run(code, disk_mb=4)
    assert "full 28" in res.stdout, res  # ENOSPC
    assert int(res.stdout.split("written")[1]) <= 4 << 20


@isolated
def test_huge_output_is_truncated_without_growing_the_caller():
    me = psutil.Process()
    before = me.memory_info().rss
    code = "import sys\nblock = 'x' * (1 << 20)\nfor _ in range(300):\n    sys.stdout.write(block)\n"
    t = time.monotonic()
    res = _run(code, max_output=65536, timeout=20.0)
    wall = time.monotonic() - t
    grown = me.memory_info().rss - before
    assert res.output_truncated and not res.ok and len(res.stdout) == 65536, (res.returncode, len(res.stdout))
    assert grown < 50 * 2**20, f"caller RSS grew by {grown / 2**20:.0f} MiB"
    assert wall < 5.0
