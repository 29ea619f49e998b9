"""Test-wide set-up: one torch thread (the machine is shared), Triton's CPU interpreter."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    # Must happen before anything imports triton: without a GPU there is no driver.
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("MUJOCO_GL", "egl")

torch.set_num_threads(1)

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    _keep_absl_off_the_capture_stream()
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


def _keep_absl_off_the_capture_stream() -> None:
    """absl (imported at collection by JAX / Brax) keeps the ``sys.stderr`` of that moment,
    pytest's capture file, in its Python handler; the first ``hydra.main`` reconfigures
    logging, which closes every handler, and absl closes a stream that is no longer
    ``sys.stderr``: pytest's own capture file, so the session dies ("lost sys.stderr").
    Point the handler at the real stderr, which absl never closes."""
    import sys

    absl_logging = sys.modules.get("absl.logging")
    if absl_logging is not None:
        absl_logging.get_absl_handler().python_handler.stream = sys.__stderr__


# ------------------------------------------------------------------ fresh interpreters, preloaded
# Tests that need a process of their own (a module made absent, torch.distributed ranks) used to
# start `python -c CODE`, paying ~4-6 s of torch + tensordict imports each. One server process
# imports those once; every case is a fork of it (os.fork before any torch op: no threads yet),
# so it starts as a fresh `python -c CODE` would, minus those imports. A case whose absent
# modules the server has already imported runs in a truly fresh interpreter instead.
_SERVER = r'''
import json, os, sys, time
import torch, tensordict  # the slow imports every case shares
from tensordict import TensorDict  # noqa: F401
out = sys.stdout
out.write(json.dumps(sorted({m.split(".")[0] for m in sys.modules})) + "\n"); out.flush()
for line in sys.stdin:
    req = json.loads(line)
    if req["op"] == "wait":  # poll the child until it exits or its time is up
        deadline, code = time.monotonic() + req["timeout"], None
        while code is None:
            pid, status = os.waitpid(req["pid"], os.WNOHANG)
            if pid:
                code = os.waitstatus_to_exitcode(status)
            elif time.monotonic() > deadline:
                os.killpg(req["pid"], 9)
                os.waitpid(req["pid"], 0)
                code = "timeout"
            else:
                time.sleep(0.01)
        out.write(json.dumps(code) + "\n"); out.flush()
        continue
    pid = os.fork()
    if pid:
        out.write(json.dumps(pid) + "\n"); out.flush()
        continue
    os.setpgid(0, 0)  # the child: its own process group (killed whole on a timeout)
    for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(f, fd)
        os.close(f)
    sys.stdin = open(os.devnull)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    sys.argv = ["-c"]
    exec(compile(req["code"], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    sys.exit(0)
'''


class FreshPython:
    """Starts ``python -c CODE`` cases as forks of one preloaded server (see above).

    ``run(code, absent=...)`` returns a ``subprocess.CompletedProcess``; ``start`` returns a
    job whose ``wait(timeout)`` does. ``absent`` names the top-level modules the case makes
    unimportable itself: if the server imported one of them, the case runs in a new
    interpreter instead, so the absence stays real.
    """

    def __init__(self, scratch):
        import json
        import subprocess
        import sys

        self._json, self._subprocess, self._sys = json, subprocess, sys
        self._scratch, self._n = scratch, 0
        self._server = subprocess.Popen([sys.executable, "-c", _SERVER], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True)
        self.preloaded = set(self._ask(None))

    def _ask(self, request):
        if request is not None:
            self._server.stdin.write(self._json.dumps(request) + "\n")
            self._server.stdin.flush()
        line = self._server.stdout.readline()
        assert line, f"the preloaded test interpreter died (exit code {self._server.poll()})"
        return self._json.loads(line)

    def start(self, code: str, absent=(), cwd=None, env=None):
        self._n += 1
        files = (self._scratch / f"{self._n}.out", self._scratch / f"{self._n}.err")
        env = dict(os.environ if env is None else env)
        cwd = str(cwd or os.getcwd())
        if self.preloaded & {m.split(".")[0] for m in absent}:
            handles = [open(f, "w") for f in files]
            proc = self._subprocess.Popen([self._sys.executable, "-c", code], stdout=handles[0],
                                          stderr=handles[1], cwd=cwd, env=env)
            return _Job(self, code, files, proc=proc, handles=handles)
        pid = self._ask({"op": "run", "code": code, "cwd": cwd, "env": env,
                         "stdout": str(files[0]), "stderr": str(files[1])})
        return _Job(self, code, files, pid=pid)

    def run(self, code: str, absent=(), cwd=None, env=None, timeout: float = 300):
        return self.start(code, absent, cwd, env).wait(timeout)

    def close(self):
        self._server.stdin.close()
        self._server.wait(timeout=30)


class _Job:
    def __init__(self, owner, code, files, pid=None, proc=None, handles=()):
        self._owner, self._code, self._files = owner, code, files
        self._pid, self._proc, self._handles = pid, proc, handles

    def wait(self, timeout: float = 300):
        if self._proc is not None:
            try:
                code = self._proc.wait(timeout)
            except self._owner._subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
                code = "timeout"
            for h in self._handles:
                h.close()
        else:
            code = self._owner._ask({"op": "wait", "pid": self._pid, "timeout": timeout})
        out, err = (f.read_text() for f in self._files)
        if code == "timeout":
            raise self._owner._subprocess.TimeoutExpired(["python", "-c", "..."], timeout, out, err)
        return self._owner._subprocess.CompletedProcess(["python", "-c", self._code], code, out, err)


@pytest.fixture(scope="session")
def fresh_python(tmp_path_factory):
    """A :class:`FreshPython`: ``fresh_python.run(code, absent=("gymnasium",))``."""
    server = FreshPython(tmp_path_factory.mktemp("fresh_python"))
    yield server
    server.close()
