"""Batched Monte-Carlo tree search in tensors: AlphaZero, MuZero and Gumbel MuZero.

``B`` searches run at once over a :class:`Tree` of tensors ``[B, N, ...]``; the user passes a
model callable ``(embedding, action) -> (next_embedding, reward, discount, prior_logits,
value)``. AlphaZero style: a simulator stepping cloned game states (:func:`simulator_model`)
plus a prior/value net; MuZero style: a learned dynamics model. The policies return a
TensorDict with the action, the policy target and the root value.

Example::

    root_fn, recurrent_fn = simulator_model(TicTacToe(), evaluate)
    out = muzero_policy(root_fn(states), recurrent_fn, num_simulations=64, two_player=True)
    out["action"], out["policy_target"], out["root_value"]
"""

from __future__ import annotations

from .games import RolloutEvaluator, TicTacToe, simulator_model
from .policies import (
    CONSIDERED,
    POLICY_TARGET,
    Q_VALUES,
    ROOT_VALUE,
    VISIT_COUNTS,
    considered_actions,
    gumbel_muzero_policy,
    muzero_policy,
)
from .qtransforms import (
    qtransform_by_min_max,
    qtransform_by_parent_and_siblings,
    qtransform_completed_by_mix_value,
)
from .model_io import EmbeddingStore, RecurrentFn
from .search import search
from .selection import (
    add_dirichlet_noise,
    considered_visits_table,
    gumbel_interior_selection,
    gumbel_root_selection,
    gumbel_score,
    masked_argmax,
    puct_scores,
    puct_selection,
    sample_from_visits,
    sample_gumbel,
    sequence_of_considered_visits,
    ucb1_scores,
    ucb1_selection,
)
from .tree import (
    NO_PARENT,
    ROOT_INDEX,
    UNVISITED,
    EdgeChannel,
    NodeChannel,
    RecurrentOutput,
    RootOutput,
    Tree,
    init_tree,
    mask_invalid_logits,
    node_batched,
    supports_node_batches,
)

__all__ = [
    "CONSIDERED",
    "NO_PARENT",
    "POLICY_TARGET",
    "Q_VALUES",
    "ROOT_INDEX",
    "ROOT_VALUE",
    "UNVISITED",
    "VISIT_COUNTS",
    "EdgeChannel",
    "EmbeddingStore",
    "NodeChannel",
    "RecurrentFn",
    "RecurrentOutput",
    "RolloutEvaluator",
    "RootOutput",
    "TicTacToe",
    "Tree",
    "add_dirichlet_noise",
    "considered_actions",
    "considered_visits_table",
    "gumbel_interior_selection",
    "gumbel_muzero_policy",
    "gumbel_root_selection",
    "gumbel_score",
    "init_tree",
    "mask_invalid_logits",
    "masked_argmax",
    "muzero_policy",
    "node_batched",
    "puct_scores",
    "puct_selection",
    "qtransform_by_min_max",
    "qtransform_by_parent_and_siblings",
    "qtransform_completed_by_mix_value",
    "sample_from_visits",
    "sample_gumbel",
    "search",
    "sequence_of_considered_visits",
    "simulator_model",
    "supports_node_batches",
    "ucb1_scores",
    "ucb1_selection",
]
