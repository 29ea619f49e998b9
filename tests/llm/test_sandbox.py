"""The code sandbox: every escape of issue 22 is blocked, ordinary programs still run, and it
fails closed (issue 39): no silent unconfined fallback, bubblewrap's own error, a venv under /tmp.

Each probe is a small program run through :func:`run_python_sandboxed`; the test asserts from the
host side (files that must not appear, sockets that must not be reached, the caller's wall time
and memory). Loopback only; each call is bounded by its own timeout.
"""

from __future__ import annotations

import ast
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import warnings

import psutil
import pytest

from tdrl.llm.rewards import cgroups, run_python_sandboxed, sandbox, seccomp

# Skipped only where bubblewrap is absent: installed but unable to run, these tests fail (with
# bubblewrap's error) instead of passing over an unconfined fallback.
isolated = pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="bubblewrap is not installed: apt-get install bubblewrap"
)

# Loads the two stdlib-only sandbox modules by path, so that a bare interpreter (a fresh venv) can run them.
_LOADER = r'''
import importlib.util, sys
def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    m = importlib.util.module_from_spec(spec); sys.modules[name] = m; spec.loader.exec_module(m); return m
_load("tdrl.llm.rewards.cgroups", sys.argv[2])
_load("tdrl.llm.rewards.seccomp", sys.argv[3])
m = _load("sbx", sys.argv[1])
'''
_PATHS = [sandbox.__file__, cgroups.__file__, seccomp.__file__]

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


def test_unconfined_mode_runs_only_by_name_and_warns_every_time(monkeypatch):
    monkeypatch.setattr(sandbox, "_fallback_warned", False)
    for _ in range(2):
        with pytest.warns(RuntimeWarning, match="NOT isolation"):
            res = run_python_sandboxed("print(6 * 7)", mode="rlimit")
        assert res.ok and res.stdout.strip() == "42" and res.mode == "rlimit"


@pytest.mark.parametrize("mode", [None, "auto", "bwrap"])
def test_isolated_modes_fail_closed_when_bubblewrap_cannot_run(mode, monkeypatch, tmp_path):
    """Issue 39: mode="auto" ran the program unconfined (rlimit mode) after one warning."""
    problem = "bubblewrap is installed but could not run a program (status 1): bwrap: setting up uid map: denied"
    monkeypatch.setattr(sandbox, "_bwrap_problem", lambda: problem)
    marker = tmp_path / "ran"
    kw = {} if mode is None else {"mode": mode}
    with pytest.raises(sandbox.SandboxUnavailable, match="setting up uid map: denied") as err:
        run_python_sandboxed(f"open({str(marker)!r}, 'w').write('unconfined')", **kw)
    assert not marker.exists(), "the program ran although the isolated sandbox was unavailable"
    assert "mode='rlimit'" in str(err.value)  # says how to opt out, by name
    assert sandbox.sandbox_mode() == "unavailable"


@isolated
def test_the_error_names_bubblewraps_own_failure(monkeypatch):
    """Issue 39: the hint said "install bubblewrap" while bubblewrap was installed and failed to exec Python."""
    sandbox._bwrap_problem.cache_clear()
    monkeypatch.setattr(sandbox, "_SYSTEM_DIRS", ())  # no /usr inside: prlimit and Python cannot be executed
    try:
        problem = sandbox.sandbox_problem()
    finally:
        monkeypatch.undo()
        sandbox._bwrap_problem.cache_clear()
    assert problem is not None and "bubblewrap is installed but could not run" in problem, problem
    assert "execvp" in problem or "No such file" in problem, problem  # bwrap's own stderr
    assert "apt-get install bubblewrap" not in problem
    assert sandbox.sandbox_problem() is None  # the real setup works again


_VENV_PROBE = _LOADER + r'''
res = m.run_python_sandboxed("import sys; print(sys.executable)")
print(res.mode, res.returncode, res.stdout.strip(), res.stderr.strip()[-300:])
'''


@isolated
def test_runs_from_a_venv_under_tmp():
    """Issue 39 (PITFALLS): the private tmpfs /tmp, mounted after the prefixes were bound, hid a venv
    under /tmp and bubblewrap could not exec Python."""
    root = tempfile.mkdtemp(prefix="tdrl-venv-test-", dir="/tmp")
    try:
        venv = os.path.join(root, "venv")
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True, timeout=120)
        python = os.path.join(venv, "bin", "python")
        out = subprocess.run([python, "-c", _VENV_PROBE, *_PATHS], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split()[:3] == ["bwrap", "0", python], out.stdout  # run by the venv's interpreter
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("mode", ["bwrap", "rlimit"])
def test_unencodable_code_returns_a_result(mode, monkeypatch):
    """Issue 39: a lone surrogate raised UnicodeEncodeError in the caller."""
    if mode == "bwrap" and shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed: apt-get install bubblewrap")
    monkeypatch.setattr(sandbox, "_fallback_warned", True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        res = run_python_sandboxed("print('\ud800')", mode=mode, stdin="\udcff")
    assert res.returncode == 1 and "SyntaxError" in res.stderr and not res.ok, res


@pytest.mark.parametrize("mode", ["bwrap", "rlimit"])
def test_fallback_also_bounds_the_caller_on_a_detached_child(mode, monkeypatch):
    if mode == "bwrap" and shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed: apt-get install bubblewrap")
    code = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(20)\nelse:\n    time.sleep(20)\n"
    t = time.monotonic()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
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
_ENV_PROBE = _LOADER + r'''
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
    out = subprocess.run([sys.executable, "-c", _ENV_PROBE, *_PATHS], capture_output=True, text=True,
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


# ----------------------------------------------------------------------------- issue 39: what was left open
@isolated
def test_no_nested_user_or_network_namespaces():
    """Issue 39: a program could create user (then network) namespaces inside the sandbox."""
    if "--disable-userns" not in sandbox._bwrap_options():
        pytest.skip("this bubblewrap has no --disable-userns (0.8+ has it)")
    code = (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "for flags in (0x10000000, 0x10000000 | 0x40000000):\n"  # CLONE_NEWUSER, | CLONE_NEWNET
        "    print(libc.unshare(flags), ctypes.get_errno())\n"
    )
    res = _run(code)
    assert res.ok, res
    assert [line.split()[0] for line in res.stdout.splitlines()] == ["-1", "-1"], res.stdout


def _tree_memory_cgroup() -> bool:
    cg = cgroups.SandboxCgroup(4, 64 << 20)
    try:
        return "memory" in cg.limits
    finally:
        cg.remove()


@isolated
def test_memory_bounds_the_whole_tree_where_a_cgroup_can_be_made():
    """Issue 39: 4 children x 400 MiB held 1.6 GiB under memory_mb=512; memfd files passed 128 MiB."""
    if not _tree_memory_cgroup():
        pytest.skip("no writable memory cgroup here (not root, or no memory controller): only the "
                    "per-process bound applies, as the sandbox module documents")
    children = (
        "import os\npids = []\n"
        "for _ in range(4):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        b = bytearray(400 << 20)\n"
        "        for j in range(0, len(b), 4096): b[j] = 1\n"
        "        os._exit(0)\n"
        "    pids.append(pid)\n"
        "print('held', sum(os.waitpid(p, 0)[1] == 0 for p in pids))\n"
    )
    res = _run(children, memory_mb=512, timeout=20.0)
    assert res.memory_exceeded and int(res.stdout.split()[1]) * 400 <= 512 + 32, res
    # memfd pages are mapped by nobody, so RLIMIT_AS misses them; 40 files of 15 MiB stay under RLIMIT_FSIZE
    memfd = (
        "import os\nblock = b'x' * (1 << 20)\nfds, n = [], 0\n"
        "for _ in range(40):\n"
        "    fds.append(os.memfd_create('x'))\n"
        "    for _ in range(15):\n"
        "        os.write(fds[-1], block); n += 1\n"
        "print('wrote', n)\n"
    )
    res = _run(memfd, memory_mb=128, timeout=20.0)
    assert "wrote 600" not in res.stdout and res.memory_exceeded, res


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_sweep_removes_what_dead_callers_left_and_keeps_the_living(tmp_path):
    dead, alive = _dead_pid(), os.getppid()
    leftover = tmp_path / f"{cgroups.PREFIX}{dead}-abc"
    in_use = tmp_path / f"{cgroups.PREFIX}{alive}-def"
    for d in (leftover, in_use):
        d.mkdir()
        (d / "main.py").write_text("x")
    removed = cgroups.sweep_leftovers(str(tmp_path))
    assert str(leftover) in removed and not leftover.exists() and in_use.exists()


_KILLED_CALLER = _LOADER + r'''
import os
print(os.getpid(), flush=True)
m.run_python_sandboxed("import time; time.sleep(30)", timeout=30)
'''


_NEXT_START = _LOADER + r'''
res = m.run_python_sandboxed("pass")
print(res.mode, res.returncode)
'''


@isolated
def test_a_caller_killed_mid_run_leaves_nothing_after_the_next_start():
    """Issue 39: a caller killed mid-call leaked its cgroup folder and temp folder."""
    caller = subprocess.Popen([sys.executable, "-c", _KILLED_CALLER, *_PATHS], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(caller.stdout.readline())
        prefix = f"{cgroups.PREFIX}{pid}-"
        pattern = [os.path.join(tempfile.gettempdir(), prefix + "*")]
        pattern += [os.path.join(r, prefix + "*") for r in ("/sys/fs/cgroup", "/sys/fs/cgroup/pids", "/sys/fs/cgroup/memory")]
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any(psutil.Process(pid).children(recursive=True)):
            time.sleep(0.05)
        time.sleep(0.3)
    finally:
        caller.kill()
        caller.wait()
    import glob

    left = [p for pat in pattern for p in glob.glob(pat)]
    assert left, "the killed caller left no temp folder: the test does not reproduce a mid-run kill"
    # the next start: a fresh process's first sandboxed call sweeps what the dead caller left
    out = subprocess.run([sys.executable, "-c", _NEXT_START, *_PATHS], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.split() == ["bwrap", "0"], out.stderr
    assert not [p for pat in pattern for p in glob.glob(pat)]

