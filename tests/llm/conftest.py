"""Shared fixtures: a tiny model and tokenizer built, saved and reloaded from a temp folder."""

from __future__ import annotations

import copy
import shutil

import pytest

from tdrl.llm import ArithmeticTask, make_tiny_lm


@pytest.fixture(scope="session")
def task():
    return ArithmeticTask(max_value=9)


@pytest.fixture(scope="session")
def _tiny(tmp_path_factory, task):
    folder = tmp_path_factory.mktemp("tiny_lm")
    model, tok = make_tiny_lm(folder, task.corpus(), hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64, seed=0)
    return folder, model, tok


@pytest.fixture
def tiny(_tiny):
    """``(folder, model, tokenizer)``; the model is a fresh copy for each test."""
    folder, model, tok = _tiny
    return folder, copy.deepcopy(model), tok


@pytest.fixture
def needs_bwrap():
    """Skips a test that runs model-written code when bubblewrap is not installed. Where it is
    installed but cannot start, the test runs and fails with bubblewrap's own error: the sandbox
    fails closed, and so do its tests."""
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (the code sandbox needs it): apt-get install bubblewrap")
