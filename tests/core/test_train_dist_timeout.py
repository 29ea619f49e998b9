"""A stopped rank ends a ``torchrun``-style job with a named error instead of hanging: the
process group joined by ``init_from_env`` carries a timeout (gloo's own default is 30 minutes)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

_RANK = textwrap.dedent("""
    import os, signal, sys, time
    import torch
    import torch.distributed as dist
    from tdrl.core.train import init_from_env
    assert init_from_env()
    dist.barrier()
    if dist.get_rank() == 1:
        print("stopping", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)  # a rank stopped by the operator or a debugger
    time.sleep(0.5)
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(1))
    except Exception as exc:  # what the surviving rank sees
        print(f"raised after {time.monotonic() - t0:.1f} s: {type(exc).__name__}: {exc}", flush=True)
        sys.exit(3)
    print("all_reduce returned", flush=True)
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_stopped_rank_ends_the_job_at_the_timeout():
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "WORLD_SIZE": "2",
           "TDRL_DIST_TIMEOUT_S": "4"}
    procs = [subprocess.Popen([sys.executable, "-c", _RANK], env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    try:
        t0 = time.monotonic()
        out0, _ = procs[0].communicate(timeout=90)  # without the timeout: 30 minutes
        waited = time.monotonic() - t0
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.kill()
                p.wait()
    assert procs[0].returncode == 3, out0[-2000:]
    assert "raised after" in out0 and "all_reduce returned" not in out0
    seconds = float(out0.split("raised after ")[1].split(" s")[0])
    assert 3.0 <= seconds <= 15.0, out0[-2000:]  # the configured 4 s, not gloo's 30 minutes
    assert waited < 60


def test_a_bad_timeout_is_refused_before_joining(monkeypatch):
    from tdrl.core.train import init_from_env

    monkeypatch.setenv("TDRL_DIST_TIMEOUT_S", "soon")
    with pytest.raises(ValueError, match="TDRL_DIST_TIMEOUT_S"):
        init_from_env()
    monkeypatch.delenv("TDRL_DIST_TIMEOUT_S")
    with pytest.raises(ValueError, match="> 0"):
        init_from_env(timeout_s=0)
