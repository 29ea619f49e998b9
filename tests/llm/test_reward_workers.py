"""Rewards that cannot hang the trainer (issue 39): a timed reward runs in a forked worker
process that is killed at its deadline, so the timeout holds for code that keeps the GIL, and no
thread or process is left behind; only rewards marked ``thread_safe_reward`` run in threads."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from tdrl.llm import code_execution_reward, compute_rewards
from tdrl.llm.rewards import thread_safe_reward, workers
from tdrl.llm.rewards.compute import RewardFunctionError, RewardTimeout, call_with_timeout

pytestmark = pytest.mark.skipif(not workers.can_fork(), reason="worker processes need fork (POSIX)")


def _alive() -> tuple[set, set]:
    """This process's child pids and thread idents now (earlier tests may have left their own)."""
    return {p.pid for p in psutil.Process().children(recursive=True)}, {t.ident for t in threading.enumerate()}


def _no_leftovers(before: tuple[set, set]) -> None:
    """No child process or thread started since ``before`` (an :func:`_alive` snapshot) remains."""
    def new() -> tuple[set, set]:
        children, threads = _alive()
        return children - before[0], threads - before[1]

    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline and any(new()):
        time.sleep(0.05)
    children, threads = new()
    assert not children, "a reward worker (or its child) outlived the call"
    assert not threads, "a reward thread outlived the call"


def catastrophic_regex(prompts, completions, **_):
    # (a+)+$ on "a"*40+"b" backtracks 2**40 times inside one C call that keeps the GIL
    return [1.0 if re.match(r"(a+)+$", "a" * 40 + "b" + c) else 0.0 for c in completions]


def test_catastrophic_regex_is_killed_at_its_timeout():
    """Issue 39: with timeout=1 such a reward returned after 2.6-4.2 s with reward_timeouts=0 (its
    thread kept the GIL, so the timeout never fired), and a longer input blocked the trainer."""
    before = _alive()
    t = time.monotonic()
    total, per_fn, stats = compute_rewards([catastrophic_regex, lambda completions, **_: [1.0] * len(completions)],
                                           ["p", "q"], ["x", "y"], timeout=1.0, on_error="zero")
    wall = time.monotonic() - t
    # the old thread path never returned on this input; the bound leaves room for forking a
    # large trainer process on a loaded machine
    assert wall < 1.0 + 5.0, wall
    assert stats["reward_timeouts"] == 1.0 and stats["reward_errors"] == 2.0
    assert per_fn[:, 0].tolist() == [0.0, 0.0] and total.tolist() == [1.0, 1.0]  # the other reward still counts
    _no_leftovers(before)


def test_a_spinning_reward_and_what_it_started_are_killed(tmp_path):
    """Issue 39: a reward that spins was abandoned, its thread kept running (3 leaked threads made the
    trainer's loop 3.2x slower). The worker, and a process the reward started, are killed."""
    pids = tmp_path / "pids"

    def spins(prompts, completions, **_):
        child = subprocess.Popen(["sleep", "60"])
        pids.write_text(f"{os.getpid()} {child.pid}")
        while True:
            pass

    before, fds = _alive(), len(os.listdir("/proc/self/fd"))
    t = time.monotonic()
    with pytest.raises(RewardTimeout, match="worker process was killed"):
        call_with_timeout(lambda: spins(["p"], ["c"]), timeout=1.0, name="reward function spins")
    assert time.monotonic() - t < 1.0 + 1.0
    worker, grandchild = (int(x) for x in pids.read_text().split())
    assert worker != os.getpid()
    for pid in (worker, grandchild):
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, pid
    _no_leftovers(before)
    assert len(os.listdir("/proc/self/fd")) == fds  # the worker's pipe is closed too


def test_closures_and_lambdas_need_no_pickling_and_errors_come_back():
    offset = 0.5
    scale = lambda completions, **_: [len(c) + offset for c in completions]  # noqa: E731
    lock = threading.Lock()  # a closure over an unpicklable object runs too (fork, no pickling)

    def locked(completions, **_):
        with lock:
            return [2.0] * len(completions)

    total, per_fn, stats = compute_rewards([scale, locked], ["p", "q"], ["ab", "abc"], timeout=5.0)
    assert per_fn.tolist() == [[2.5, 2.0], [3.5, 2.0]] and stats["reward_errors"] == 0.0

    def boom():
        raise KeyError("no such column")

    with pytest.raises(KeyError, match="no such column") as info:
        call_with_timeout(boom, timeout=5.0)
    assert "in boom" in str(info.value.__cause__)  # the worker's traceback is chained
    with pytest.raises(RuntimeError, match="ended without an answer"):
        call_with_timeout(lambda: os.kill(os.getpid(), signal.SIGKILL), timeout=5.0)
    with pytest.raises(TypeError, match="cannot be sent back"):
        call_with_timeout(lambda: [threading.Lock()], timeout=5.0)


def test_side_effects_stay_in_the_worker_unless_marked_thread_safe():
    seen: list[int] = []

    def records(completions, **_):
        seen.append(os.getpid())
        return [0.0] * len(completions)

    compute_rewards([records], ["p"], ["c"], timeout=5.0)
    assert seen == []  # it ran in a forked worker: documented, and the reason for the mark
    compute_rewards([thread_safe_reward(records)], ["p"], ["c"], timeout=5.0)
    assert seen == [os.getpid()]
    assert workers.runs_in_thread(code_execution_reward()) and not workers.runs_in_thread(catastrophic_regex)


_KILLED_TRAINER = r"""
import importlib.util, sys, time
spec = importlib.util.spec_from_file_location("w", sys.argv[1])
w = importlib.util.module_from_spec(spec); spec.loader.exec_module(w)
def spin():
    print(__import__("os").getpid(), flush=True)
    while True:
        pass
w.call_in_worker(spin, 60.0)
"""


def test_a_killed_caller_leaves_no_worker():
    caller = subprocess.Popen([sys.executable, "-c", _KILLED_TRAINER, workers.__file__], stdout=subprocess.PIPE,
                              text=True)
    try:
        worker = int(caller.stdout.readline())
        assert psutil.pid_exists(worker)
    finally:
        caller.kill()
        caller.wait()
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline and psutil.pid_exists(worker):
        if psutil.Process(worker).status() == psutil.STATUS_ZOMBIE:
            break
        time.sleep(0.05)
    assert not psutil.pid_exists(worker) or psutil.Process(worker).status() == psutil.STATUS_ZOMBIE


async def blocking_coroutine(prompts, completions, **_):
    """A coroutine that blocks its event loop with GIL-holding work: no ``await`` ever yields,
    so ``asyncio.wait_for`` cannot cancel it (the loop never runs the timeout)."""
    return [1.0 if re.match(r"(a+)+$", "a" * 40 + "b" + c) else 0.0 for c in completions]


def test_a_coroutine_that_blocks_its_loop_is_killed_at_its_timeout():
    """Issue 39: async rewards were cancelled, not killed: one blocking its loop held the
    trainer for the timeout + 5 s and then left its thread running. It now runs in the worker."""
    before = _alive()
    t = time.monotonic()
    total, per_fn, stats = compute_rewards([blocking_coroutine, lambda completions, **_: [1.0] * len(completions)],
                                           ["p", "q"], ["x", "y"], timeout=1.0, on_error="zero")
    wall = time.monotonic() - t
    assert wall < 1.0 + 2.0, wall  # before: timeout + 5 s, and the thread ran on
    assert stats["reward_timeouts"] == 1.0 and per_fn[:, 0].tolist() == [0.0, 0.0]
    assert total.tolist() == [1.0, 1.0]
    _no_leftovers(before)


def test_evaluate_scores_through_the_same_timeout_as_training(tiny, task):
    """``evaluate`` (and ``GRPOTrainer.evaluate``) called rewards with no limit: a hanging
    verifier hung evaluation. It now scores through compute_rewards with ``reward_timeout``."""
    from tdrl.llm import GRPOConfig, GRPOTrainer, evaluate

    _, model, tok = tiny
    ds = task.splits(8, 4, seed=0)[1]

    def hangs(prompts, completions, **_):
        while True:
            pass

    def ones(prompts, completions, **_):
        return [1.0] * len(completions)

    before = _alive()
    t = time.monotonic()
    assert evaluate(model, tok, ds, hangs, max_new_tokens=2, reward_timeout=0.5, on_reward_error="zero") == 0.0
    assert time.monotonic() - t < 0.5 + 10.0
    assert evaluate(model, tok, ds, ones, max_new_tokens=2, reward_timeout=0.5) == 1.0
    with pytest.raises(RewardFunctionError, match="did not return within 0.5 s"):
        evaluate(model, tok, ds, hangs, max_new_tokens=2, reward_timeout=0.5, on_reward_error="raise")
    trainer = GRPOTrainer(model, tok, [ones, hangs], ds, GRPOConfig(
        steps=1, prompts_per_step=2, group_size=2, max_new_tokens=2, reward_timeout=0.5,
        on_reward_error="zero", progress=False), eval_dataset=ds)
    assert trainer.evaluate() == {"eval_ones": 1.0, "eval_hangs": 0.0}
    _no_leftovers(before)
