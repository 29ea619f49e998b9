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
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
