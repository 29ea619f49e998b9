"""A fused rescoring of many nodes for the default PUCT rule (the cached search's hot loop).

:func:`~tdrl.core.mcts.selection.puct_selection` with the default Q-transform
(:func:`~tdrl.core.mcts.qtransforms.qtransform_by_parent_and_siblings`) scores ``[M, A]``
tensors gathered row by row, so its reductions run over a short last dim (``A`` of 4 or 9)
and its broadcasts of per-node values are strided; at ``M`` of a few thousand nodes these
ops cost several times an elementwise op over the same data. :class:`FusedPUCT` computes the
very same float operations action-major, on ``[A, M]`` contiguous copies: reductions over
actions become elementwise ops between ``A`` rows, per-node values broadcast along a
contiguous dim, and the argmax is ``A - 1`` compare-and-keep steps (ties to the lowest
action, as ``argmax``). The scores are bit-for-bit those of ``puct_selection``.

The search uses it automatically (:func:`fused_rule`) when the interior rule is
``puct_selection``, optionally bound by ``functools.partial`` to ``pb_c_init`` /
``pb_c_base`` and to the default Q-transform (optionally with its ``epsilon``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import Tensor

from .qtransforms import qtransform_by_parent_and_siblings
from .selection import SelectionFn, puct_selection
from .tree import EdgeChannel, NodeChannel

_MAX_UNROLLED_ACTIONS = 16
"""Above this many actions the argmax is a transposed ``argmax`` instead of a loop."""


class FusedPUCT:
    """PUCT with parent-and-siblings min-max Q normalisation, over a flat node set.

    Args:
        pb_c_init, pb_c_base: PUCT constants (as :func:`puct_scores`).
        epsilon: lower bound of the Q normaliser (as the Q-transform).
    """

    def __init__(self, pb_c_init: float, pb_c_base: float, epsilon: float) -> None:
        self.pb_c_init, self.pb_c_base, self.epsilon = pb_c_init, pb_c_base, epsilon

    def __call__(
        self,
        node_rows: Tensor,
        edge_rows: Tensor,
        invalid_rows: Tensor | None,
        nodes: Tensor,
        node_stats: Tensor | None = None,
    ) -> Tensor:
        """Best action of each node in ``nodes``.

        Args:
            node_rows: ``[R, 4]`` packed node statistics (``Tree.node_data`` flattened).
            edge_rows: ``[R, A, 7]`` packed edge statistics (``Tree.edge_data`` flattened).
            invalid_rows: ``[R, A]`` bool illegal actions, or None when no node has any.
            nodes: ``[M]`` int64 rows to score.
            node_stats: optional ``[M, 4]`` ``node_rows[nodes]``, when the caller has them.

        Returns:
            ``[M]`` int64 actions, those of ``puct_selection`` on the same nodes.
        """
        num_actions = edge_rows.shape[1]
        edges = edge_rows.view(edge_rows.shape[0], -1).index_select(0, nodes)
        edges = edges.view(-1, num_actions, edge_rows.shape[2]).permute(2, 1, 0)  # [7, A, M]
        visits = edges[EdgeChannel.VISITS].contiguous()
        probs_q = edges[EdgeChannel.PRIOR_PROB:EdgeChannel.QVALUE + 1].contiguous()  # adjacent channels
        probs, qvalues = probs_q[0], probs_q[1]
        if node_stats is None:
            node_stats = node_rows.index_select(0, nodes)
        stats = node_stats.t()  # [4, M]
        node_visit = stats[NodeChannel.VISITS].contiguous()
        node_value = stats[NodeChannel.VALUE].contiguous()
        # Exploration: sqrt(N) * c(N) * P(a) / (1 + N(a)), c(N) = init + log((N + base + 1) / base)
        pb_c = ((node_visit + (self.pb_c_base + 1.0)) / self.pb_c_base).log_().add_(self.pb_c_init)
        scores = node_visit.sqrt().mul_(pb_c).mul(probs).div_(visits + 1)
        # Q min-max normalised over the node's value and its visited children.
        visited = visits > 0
        safe_q = torch.where(visited, qvalues, node_value)
        low = torch.minimum(node_value, safe_q.amin(0))
        high = torch.maximum(node_value, safe_q.amax(0))
        completed = torch.where(visited, qvalues, low)
        normalised = completed.sub_(low).div_((high - low).clamp_(min=self.epsilon))
        scores = normalised.add_(scores)
        if invalid_rows is not None:
            invalid = invalid_rows.index_select(0, nodes).t()
            scores.masked_fill_(invalid, -torch.inf)
        return first_argmax(scores)


def first_argmax(scores: Tensor) -> Tensor:
    """``scores.argmax(0)`` of ``[A, M]`` scores (ties to the lowest index), fast for small A.

    Returns:
        ``[M]`` int64.
    """
    num_actions = scores.shape[0]
    if num_actions > _MAX_UNROLLED_ACTIONS:
        return scores.t().argmax(-1)
    best = scores[0]
    action = torch.zeros(best.shape, dtype=torch.int64, device=scores.device)
    for a in range(1, num_actions):
        action.masked_fill_(scores[a] > best, a)
        best = torch.maximum(best, scores[a])  # NaN scores aside, the kept maximum
    return action


def unwrap_partial(fn: Callable | None) -> tuple[Callable, dict] | None:
    """``(function, keywords)`` under nested ``functools.partial`` keyword bindings of ``fn``
    (the outer binding wins), or None if a partial binds positional arguments."""
    kwargs: dict = {}
    while isinstance(fn, partial):
        if fn.args:
            return None
        kwargs = {**fn.keywords, **kwargs}
        fn = fn.func
    return fn, kwargs


def puct_settings(fn: SelectionFn) -> dict | None:
    """The keywords of a plain PUCT rule, ``partial(puct_selection, pb_c_init=..., pb_c_base=...,
    qtransform=...)`` (any subset), or None if ``fn`` is another rule."""
    unwrapped = unwrap_partial(fn)
    if unwrapped is None:
        return None
    fn, kwargs = unwrapped
    if fn is not puct_selection or set(kwargs) - {"pb_c_init", "pb_c_base", "qtransform"}:
        return None
    return kwargs


def fused_rule(fn: SelectionFn) -> FusedPUCT | None:
    """The fused scorer equal to ``fn``, or None if ``fn`` is not a plain PUCT rule."""
    kwargs = puct_settings(fn)
    if kwargs is None:
        return None
    qtransform = kwargs.get("qtransform", qtransform_by_parent_and_siblings)
    epsilon = 1e-8
    if isinstance(qtransform, partial):
        if qtransform.args or set(qtransform.keywords) - {"epsilon"}:
            return None
        epsilon = qtransform.keywords.get("epsilon", epsilon)
        qtransform = qtransform.func
    if qtransform is not qtransform_by_parent_and_siblings:
        return None
    return FusedPUCT(kwargs.get("pb_c_init", 1.25), kwargs.get("pb_c_base", 19652.0), epsilon)
