"""Fixtures shared by the kernel tests."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode


class CountMatmuls(TorchDispatchMode):
    """Counts the matmuls (``mm`` / ``addmm`` / ``addmm_``) that run under it:
    ``with CountMatmuls() as c``."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.addmm_):
            self.count += 1
        return func(*args, **(kwargs or {}))


@pytest.fixture
def count_matmuls():
    """The :class:`CountMatmuls` class (instantiate one per measured block)."""
    return CountMatmuls
