"""tdrl.kernels: Triton kernels with pure-torch references for RL hot paths.

Every public op dispatches to its Triton kernel when ``triton`` is installed and the inputs
are on CUDA, and to the pure-torch reference otherwise (``TDRL_KERNELS=torch|triton|auto``
or :func:`use_backend` override this). The references are public too, with the same
signatures, under ``*_reference`` names.
"""

from __future__ import annotations

from ._dist import installed_version as _installed_version

from ._dispatch import current_backend, triton_available, use_backend
from .fused_linear.api import (
    fused_linear_cross_entropy,
    fused_linear_cross_entropy_reference,
    fused_linear_logprobs,
    fused_linear_logprobs_reference,
    fused_linear_pg_loss,
    fused_linear_pg_loss_reference,
)
from .logprobs import token_logprobs, token_logprobs_reference
from .pg_loss import pg_token_loss, pg_token_loss_reference
from .recurrent import gru_reference, gru_sequence, lstm_reference, lstm_sequence
from .scan import discounted_cumsum, discounted_cumsum_reference, gae, gae_reference
from .sum_tree import (
    sum_tree_find,
    sum_tree_find_reference,
    sum_tree_new,
    sum_tree_update,
    sum_tree_update_reference,
)

__version__ = _installed_version("tdrl-kernels")  # the version in this package's pyproject.toml

__all__ = [
    "__version__",
    "current_backend",
    "discounted_cumsum",
    "discounted_cumsum_reference",
    "fused_linear_cross_entropy",
    "fused_linear_cross_entropy_reference",
    "fused_linear_logprobs",
    "fused_linear_logprobs_reference",
    "fused_linear_pg_loss",
    "fused_linear_pg_loss_reference",
    "gae",
    "gae_reference",
    "gru_reference",
    "gru_sequence",
    "lstm_reference",
    "lstm_sequence",
    "pg_token_loss",
    "pg_token_loss_reference",
    "sum_tree_find",
    "sum_tree_find_reference",
    "sum_tree_new",
    "sum_tree_update",
    "sum_tree_update_reference",
    "token_logprobs",
    "token_logprobs_reference",
    "triton_available",
    "use_backend",
]
