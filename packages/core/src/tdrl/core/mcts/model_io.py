"""What the search reads from the user's model and how it stores the states: the model's
signature (:data:`RecurrentFn`), the checks of its outputs (shapes, dtypes, masked priors) and
the flat row reads and writes of the ``[B, N]`` embeddings. Shared by both engines of
:func:`~tdrl.core.mcts.search` (the tensor engine in :mod:`~tdrl.core.mcts.search`, the numba
engine in :mod:`~tdrl.core.mcts.numba_backend`), which import it and not each other."""

from __future__ import annotations

from collections.abc import Callable

import torch
from tensordict import TensorDict, TensorDictBase
from torch import Tensor

from tdrl.core.td_access import get_entry

from .tree import EMBEDDING_KEY, RecurrentOutput, mask_invalid_logits

__all__ = ["RecurrentFn", "EmbeddingStore", "check_vector", "leaf_priors", "leaf_logits", "normalize_invalid"]

RecurrentFn = Callable[[TensorDictBase | Tensor, Tensor], RecurrentOutput | tuple]
"""The model: ``(embedding [B], action [B]) -> RecurrentOutput`` (or the same 5- or 6-tuple)."""


class EmbeddingStore:
    """Fast row reads and writes of the ``[B, N]`` embeddings TensorDict (flat indices)."""

    def __init__(self, embeddings: TensorDictBase, wrapped: bool) -> None:
        self.wrapped = wrapped
        self.batch = embeddings.batch_size[:1]
        if wrapped:  # one tensor under EMBEDDING_KEY
            self.keys = [EMBEDDING_KEY]
            self.grids = [get_entry(embeddings, EMBEDDING_KEY)]  # [B, N, ...]
            self.leaves = [self.grids[0].flatten(0, 1)]
            return
        self.keys = list(embeddings.keys(include_nested=True, leaves_only=True))
        self.leaves = [embeddings.get(key).flatten(0, 1) for key in self.keys]
        self.grids = [leaf.unflatten(0, (self.batch[0], -1)) for leaf in self.leaves]  # [B, N]

    def read(self, flat: Tensor) -> TensorDictBase | Tensor:
        rows = [leaf.index_select(0, flat) for leaf in self.leaves]
        if self.wrapped:
            return rows[0]
        return TensorDict(dict(zip(self.keys, rows, strict=True)), batch_size=self.batch)

    def write_slot(self, slot: int, values: TensorDictBase | Tensor) -> None:
        """Write ``values`` (batch ``[B]``) into node slot ``slot`` of every tree."""
        if self.wrapped:
            self.grids[0][:, slot] = values
            return
        for grid, (_, value) in zip(self.grids, self._pairs(values), strict=True):
            grid[:, slot] = value

    def write(self, flat: Tensor, values: TensorDictBase | Tensor) -> None:
        if self.wrapped:
            self.leaves[0].index_copy_(0, flat, values.to(self.leaves[0].dtype))
            return
        for leaf, value in self._pairs(values):
            leaf.index_copy_(0, flat, value.to(leaf.dtype))

    def _pairs(self, values: TensorDictBase) -> list[tuple[Tensor, Tensor]]:
        """``(storage leaf, new value)`` per embedding key; a missing key is the user's error."""
        pairs = []
        for key, leaf in zip(self.keys, self.leaves, strict=True):
            value = values.get(key, None)
            if value is None:
                raise KeyError(
                    f"recurrent_fn next_embedding lacks the key {key!r} of the root embedding"
                )
            pairs.append((leaf, value))
        return pairs


def check_vector(x: Tensor, batch: int, name: str, dtype: torch.dtype) -> Tensor:
    """``x`` as a ``[batch]`` tensor of ``dtype`` (``[batch, 1]`` is squeezed), or a
    ``ValueError`` naming the model output ``name`` and the shape it should have."""
    if not isinstance(x, Tensor):
        x = torch.as_tensor(x)
    if x.shape == (batch, 1):
        x = x.squeeze(-1)
    if x.shape != (batch,):
        raise ValueError(f"recurrent_fn {name} must be [B]={batch}, got {tuple(x.shape)}")
    return x if x.dtype == dtype else x.to(dtype)


def leaf_priors(
    out: RecurrentOutput, batch: int, num_actions: int, dtype: torch.dtype
) -> tuple[Tensor, Tensor | None]:
    """The new leaves' ``[B, A, 2]`` masked prior logits and their softmax (edge channels
    ``PRIOR_LOGIT``, ``PRIOR_PROB``), and their ``[B, A]`` illegal actions (``None``: all legal, as fresh rows already say)."""
    logits, probs, invalid = leaf_logits(out, batch, num_actions, dtype)
    return torch.stack([logits, probs], -1), invalid


def leaf_logits(
    out: RecurrentOutput, batch: int, num_actions: int, dtype: torch.dtype
) -> tuple[Tensor, Tensor, Tensor | None]:
    """:func:`leaf_priors` unstacked: ``[B, A]`` masked logits, ``[B, A]`` their softmax and
    the ``[B, A]`` illegal actions (or ``None``)."""
    if out.prior_logits.shape != (batch, num_actions):
        raise ValueError(
            f"recurrent_fn prior_logits must be [B, A]={batch, num_actions}, "
            f"got {tuple(out.prior_logits.shape)}"
        )
    logits = out.prior_logits.to(dtype)
    if out.invalid_actions is None:
        invalid = None
        logits = (logits - logits.amax(-1, keepdim=True)).clamp_(min=torch.finfo(dtype).min)
    else:
        invalid = normalize_invalid(out.invalid_actions, batch, num_actions, logits.device)
        logits = mask_invalid_logits(logits, invalid)
    return logits, torch.softmax(logits, -1), invalid


def normalize_invalid(
    invalid: Tensor | None, batch: int, num_actions: int, device: torch.device
) -> Tensor:
    if invalid is None:
        return torch.zeros(batch, num_actions, dtype=torch.bool, device=device)
    if invalid.shape != (batch, num_actions):
        raise ValueError(
            f"recurrent_fn invalid_actions must be [B, A]={batch, num_actions}, "
            f"got {tuple(invalid.shape)}"
        )
    invalid = invalid.bool()
    return invalid & ~invalid.all(-1, keepdim=True)
