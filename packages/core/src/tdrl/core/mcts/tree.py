"""The search tree of a batch of ``B`` searches, held in tensors.

Modelled on mctx's ``Tree`` (Danihelka et al., 2022): one frozen dataclass of tensors with a
leading batch dim ``B`` (one tree per row), a node dim ``N = num_simulations + 1`` (node 0 is
the root, node ``s + 1`` is the node expanded by simulation ``s``) and an action dim ``A``.
There is no Python object per node; the search fills the tensors in place.

Conventions:
  * ``node_visits[b, n]`` counts the node's own evaluation plus every simulation that passed
    through it, so the root has ``1 + num_simulations`` visits after a search.
  * ``value_sums[b, n] / node_visits[b, n]`` is the node's mean value, seen by the player to
    act at that node.
  * The edge ``(n, a)`` carries the reward and discount of that transition:
    ``Q(n, a) = children_rewards[n, a] + children_discounts[n, a] * value(child)``.
    For two-player zero-sum games the search stores the discount negated, so that a child's
    value (seen by the opponent) counts against the player at ``n``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple, TypeVar

import torch
from tensordict import TensorDict, TensorDictBase
from torch import Tensor

from tdrl.core.td_access import new_td

UNVISITED = -1
"""Entry of ``children_index`` for a child that has not been expanded."""
NO_PARENT = -1
"""Entry of ``parents`` / ``action_from_parent`` for the root and for unused nodes."""
ROOT_INDEX = 0
"""Index of the root node in every tree."""
EMBEDDING_KEY = "embedding"
"""Key under which a plain-tensor embedding is stored in ``Tree.embeddings``."""


class RootOutput(NamedTuple):
    """What the representation (or the simulator and the net) says about the roots.

    Attributes:
        prior_logits: ``[B, A]`` prior logits of the root policy.
        value: ``[B]`` value estimate of the root states (the player to act's view).
        embedding: the root states or latent embeddings: a TensorDict with batch ``[B]`` or a
            tensor ``[B, ...]``; handed back to the recurrent model unchanged in kind.
        invalid_actions: optional ``[B, A]`` bool, True for illegal actions at the roots.
    """

    prior_logits: Tensor
    value: Tensor
    embedding: TensorDictBase | Tensor
    invalid_actions: Tensor | None = None


class RecurrentOutput(NamedTuple):
    """What the recurrent model returns for one transition per tree.

    A recurrent model is any callable ``(embedding, action) -> RecurrentOutput`` (or a plain
    tuple in the same order), with ``embedding`` of batch ``[B]`` and ``action`` ``[B]`` int64.

    Attributes:
        next_embedding: the next states / embeddings, batch ``[B]``, same kind as the input.
        reward: ``[B]`` reward of the transition, seen by the player who acted.
        discount: ``[B]`` discount of the transition, ``0`` after a terminal transition.
        prior_logits: ``[B, A]`` prior logits at the next state.
        value: ``[B]`` value of the next state, seen by the player to act there (``0`` for a
            terminal state).
        invalid_actions: optional ``[B, A]`` bool, True for illegal actions at the next state.
    """

    next_embedding: TensorDictBase | Tensor
    reward: Tensor
    discount: Tensor
    prior_logits: Tensor
    value: Tensor
    invalid_actions: Tensor | None = None


class NodeStats(NamedTuple):
    """One node per tree, as seen by a selection rule (``Tree.node_stats``).

    Attributes:
        visits: ``[B, A]`` children visit counts.
        qvalues: ``[B, A]`` ``r + discount * value(child)`` (``r`` for unvisited children).
        prior_logits: ``[B, A]`` (invalid actions masked).
        prior_probs: ``[B, A]`` ``softmax(prior_logits)``.
        invalid: ``[B, A]`` bool.
        node_visit: ``[B]`` the node's visit count.
        node_value: ``[B]`` the node's mean value.
        raw_value: ``[B]`` the model's value of the node.
    """

    visits: Tensor
    qvalues: Tensor
    prior_logits: Tensor
    prior_probs: Tensor
    invalid: Tensor
    node_visit: Tensor
    node_value: Tensor
    raw_value: Tensor


_F = TypeVar("_F", bound=Callable)


def node_batched(fn: _F) -> _F:
    """Declare that a selection function (or Q-transform) scores a batch of nodes per tree.

    A function so marked must accept ``node_index`` of any shape ``[B, *K]`` (returning
    ``[B, *K]`` actions, or ``[B, *K, A]`` Q-values) and depend only on
    ``tree.node_stats(node_index)`` (the statistics of the scored node and its edges), never
    on the search depth, on random draws or on other tree fields: the search calls it on all
    trees flattened into one (``B = 1``, empty embeddings and extras).
    :func:`~tdrl.core.mcts.search` then caches each node's chosen action and rescores only
    the nodes a simulation changed, so that walking down a tree costs a few gathers per
    level. Unmarked interior selection functions are called level by level.

    Returns:
        ``fn`` itself, marked.
    """
    fn.batched_nodes = True
    return fn


def supports_node_batches(fn: Callable) -> bool:
    """Whether ``fn`` (or the function under its ``functools.partial``) is :func:`node_batched`.

    A ``qtransform`` bound into a partial must be node-batched too.
    """
    while isinstance(fn, partial):
        qtransform = fn.keywords.get("qtransform")
        if qtransform is not None and not supports_node_batches(qtransform):
            return False
        fn = fn.func
    return bool(getattr(fn, "batched_nodes", False))


class NodeChannel:
    """Channels of :attr:`Tree.node_data` ``[B, N, 4]`` (one gather fetches a node's row)."""

    VISITS = 0
    VALUE_SUM = 1
    RAW_VALUE = 2  # the model's value at expansion
    VALUE = 3  # VALUE_SUM / VISITS, kept up to date by the backup


class EdgeChannel:
    """Channels of :attr:`Tree.edge_data` ``[B, N, A, 7]``."""

    VISITS = 0
    VALUE_SUM = 1
    REWARD = 2
    DISCOUNT = 3  # negated for two players
    PRIOR_LOGIT = 4  # invalid actions masked
    PRIOR_PROB = 5
    QVALUE = 6  # REWARD + DISCOUNT * VALUE_SUM / VISITS


# The named views of the channels, in channel order.
_NODE_FIELDS = ("node_visits", "value_sums", "raw_values", "node_values")
_EDGE_FIELDS = (
    "children_visits", "children_value_sums", "children_rewards", "children_discounts",
    "children_prior_logits", "children_prior_probs", "children_qvalues",
)  # fmt: skip


@dataclass(frozen=True)
class Tree:
    """A batch of ``B`` search trees with ``N`` node slots and ``A`` actions.

    The fields cannot be rebound; the search writes into the tensors in place while it runs.
    Treat a returned tree as read-only. The float statistics are packed, per node and per
    edge, into two tensors (so that one gather fetches a node's row); the named views below
    are how to read them. Visit counts are floats there (exact below ``2**24``).

    Attributes:
        node_data: ``[B, N, 4]`` packed ``node_visits``, ``value_sums``, ``raw_values``,
            ``node_values`` (= sums / visits, kept up to date by the backup).
        edge_data: ``[B, N, A, 7]`` packed ``children_visits``, ``children_value_sums``,
            ``children_rewards``, ``children_discounts``, ``children_prior_logits``,
            ``children_prior_probs``, ``children_qvalues`` (= r + discount * child value).
        parents: ``[B, N]`` int64 parent index (``NO_PARENT`` for the root / unused slots).
        action_from_parent: ``[B, N]`` int64 action leading from the parent to the node.
        children_index: ``[B, N, A]`` int64 node index of each child (``UNVISITED`` if none).
        invalid_actions: ``[B, N, A]`` bool, illegal actions at each node; a node where
            every action is illegal (a terminal state) is stored with none illegal.
        embeddings: TensorDict ``[B, N]`` of the states / embeddings of the nodes.
        extra: TensorDict ``[B]`` of per-tree extras (e.g. the root ``"gumbel"`` ``[B, A]``).

    Views (``[B, N]`` or ``[B, N, A]``): ``node_visits``, ``value_sums`` (sum of the values
    backed up through the node), ``raw_values`` (the model's value at expansion),
    ``node_values`` (mean), ``children_visits``, ``children_value_sums``,
    ``children_values`` (mean), ``children_rewards``, ``children_discounts`` (negated for
    two players), ``children_prior_logits`` (invalid actions masked), ``children_prior_probs``,
    ``children_qvalues``.
    """

    node_data: Tensor
    edge_data: Tensor
    parents: Tensor
    action_from_parent: Tensor
    children_index: Tensor
    invalid_actions: Tensor
    embeddings: TensorDictBase
    extra: TensorDictBase

    def __getattr__(self, name: str) -> Tensor:
        # Named views into the packed storages (only reached for names that are not fields).
        if name == "_offsets":  # b * N, made on first use and reused by every gather
            offsets = torch.arange(self.batch_size, device=self.node_data.device) * self.num_nodes
            object.__setattr__(self, "_offsets", offsets)
            return offsets
        if name in _NODE_FIELDS:
            return self.node_data[..., _NODE_FIELDS.index(name)]
        if name in _EDGE_FIELDS:
            return self.edge_data[..., _EDGE_FIELDS.index(name)]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def batch_size(self) -> int:
        return self.node_data.shape[0]

    @property
    def num_nodes(self) -> int:
        return self.node_data.shape[1]

    @property
    def num_actions(self) -> int:
        return self.edge_data.shape[2]

    @property
    def children_values(self) -> Tensor:
        """``[B, N, A]`` mean value of each child (0 for unvisited children)."""
        return self.children_value_sums / self.children_visits.clamp(min=1)

    def flat_index(self, node_index: Tensor) -> Tensor:
        """Row of ``(b, node_index[b, ...])`` in the ``[B * N, ...]`` flattening.

        Args:
            node_index: ``[B]`` or ``[B, *K]`` int64.

        Returns:
            int64 of the shape of ``node_index``.
        """
        offsets = self._offsets
        if node_index.dim() > 1:
            offsets = offsets.view(-1, *([1] * (node_index.dim() - 1)))
        return offsets + node_index

    def node_stats(self, node_index: Tensor, flat: Tensor | None = None) -> NodeStats:
        """Gather what a selection rule needs about node ``node_index[b]`` of each tree.

        Args:
            node_index: ``[B]`` int64, or ``[B, *K]`` for several nodes per tree.
            flat: optional precomputed ``flat_index(node_index)``.

        Returns:
            :class:`NodeStats` with ``[B, *K, A]`` / ``[B, *K]`` tensors.
        """
        flat = self.flat_index(node_index) if flat is None else flat
        shape, rows = flat.shape, flat.reshape(-1)
        num_rows, num_actions = self.batch_size * self.num_nodes, self.num_actions
        edges = self.edge_data.view(num_rows, -1).index_select(0, rows)
        edges = edges.view(*shape, num_actions, -1)
        visits, logits = edges[..., EdgeChannel.VISITS], edges[..., EdgeChannel.PRIOR_LOGIT]
        probs, qvalues = edges[..., EdgeChannel.PRIOR_PROB], edges[..., EdgeChannel.QVALUE]
        nodes = self.node_data.view(num_rows, -1).index_select(0, rows)
        nodes = nodes.view(*shape, -1)
        node_visit, raw_value = nodes[..., NodeChannel.VISITS], nodes[..., NodeChannel.RAW_VALUE]
        node_value = nodes[..., NodeChannel.VALUE]
        invalid = self.invalid_actions.view(-1, num_actions).index_select(0, rows)
        invalid = invalid.view(*shape, num_actions)
        return NodeStats(
            visits=visits,
            qvalues=qvalues,
            prior_logits=logits,
            prior_probs=probs,
            invalid=invalid,
            node_visit=node_visit,
            node_value=node_value,
            raw_value=raw_value,
        )

    def qvalues(self, node_index: Tensor) -> Tensor:
        """``Q(n, a) = r(n, a) + discount(n, a) * value(child)``, shape ``[B, A]``.

        Unvisited children count with value 0; callers mask them by visit count.
        """
        return self.node_stats(node_index).qvalues

    def root_summary(self) -> TensorDict:
        """Root statistics as a TensorDict ``[B]``.

        Returns:
            ``"visit_counts"`` ``[B, A]`` int64, ``"visit_probs"`` ``[B, A]``, ``"value"``
            ``[B]`` (mean root value after the search), ``"q_values"`` ``[B, A]``.
        """
        visits = self.children_visits[:, ROOT_INDEX]
        qvalues = self.children_qvalues[:, ROOT_INDEX]
        return TensorDict(
            {
                "visit_counts": visits.round().long(),
                "visit_probs": visits / visits.sum(-1, keepdim=True).clamp(min=1),
                "value": self.node_values[:, ROOT_INDEX],
                "q_values": qvalues,
            },
            batch_size=[self.batch_size],
        )

    def select_trees(self, index: Tensor | slice | int) -> Tree:
        """The sub-batch of trees ``index`` (e.g. ``tree.select_trees(slice(2, 3))``)."""
        if isinstance(index, int):
            index = slice(index, index + 1)
        fields = {name: getattr(self, name)[index] for name in self.__dataclass_fields__}
        return Tree(**fields)


def mask_invalid_logits(logits: Tensor, invalid_actions: Tensor | None) -> Tensor:
    """Replace the logits of invalid actions by a very low finite value.

    Args:
        logits: ``[..., A]``.
        invalid_actions: ``[..., A]`` bool or None. Rows where every action is invalid are
            left unmasked (a terminal state keeps a well-defined, if meaningless, policy).

    Returns:
        ``[..., A]`` logits, shifted so that the largest valid one is 0.
    """
    if invalid_actions is None:
        return logits - logits.amax(-1, keepdim=True)
    invalid = invalid_actions & ~invalid_actions.all(-1, keepdim=True)
    low = torch.finfo(logits.dtype).min
    masked = logits.masked_fill(invalid, low)
    return (masked - masked.amax(-1, keepdim=True)).clamp(min=low)


def init_tree(
    root: RootOutput, num_nodes: int, extra: TensorDictBase | None = None, write_root: bool = True
) -> tuple[Tree, bool]:
    """Allocate a tree of ``num_nodes`` slots per search and write the root into slot 0.

    Args:
        root: the roots; ``root.prior_logits`` is ``[B, A]``, ``root.value`` ``[B]``.
        num_nodes: ``N``, usually ``num_simulations + 1``.
        extra: optional per-tree extras, batch ``[B]``.
        write_root: ``False`` (roots without illegal actions) allocates the statistics,
            index and illegal-action tensors and a plain-tensor embedding's slots
            unwritten, for the caller to fill as below (the numba engine fills them in its
            first compiled call); a TensorDict embedding is written either way.

    Returns:
        ``(tree, wrapped)`` where ``wrapped`` says the embedding was a plain tensor stored
        under ``EMBEDDING_KEY``.
    """
    logits, value = root.prior_logits, root.value
    if logits.dim() != 2:
        raise ValueError(f"root.prior_logits must be [B, A], got shape {tuple(logits.shape)}")
    batch, num_actions = logits.shape
    if value.shape != (batch,):
        raise ValueError(
            f"root.value must be [B]={batch}, got shape {tuple(value.shape)}; "
            "squeeze a trailing value dim of 1 first"
        )
    embedding, wrapped = _as_tensordict(root.embedding, batch, "root.embedding")  # None if wrapped
    device, dtype = logits.device, value.dtype
    invalid = root.invalid_actions
    if invalid is not None and invalid.shape != (batch, num_actions):
        raise ValueError(
            f"invalid_actions must be [B, A]={batch, num_actions}, got {tuple(invalid.shape)}"
        )

    if not write_root and invalid is not None:
        raise ValueError("init_tree(write_root=False) takes roots without illegal actions")

    def full(shape, fill, dt):
        if not write_root:  # the caller fills them
            return torch.empty(shape, dtype=dt, device=device)
        return torch.full(shape, fill, dtype=dt, device=device)

    nodes, edges = (batch, num_nodes), (batch, num_nodes, num_actions)
    if wrapped:  # one tensor: every slot a copy of the root's embedding, in three calls
        grid = root.embedding.new_empty((batch, num_nodes, *root.embedding.shape[1:]))
        if write_root:
            grid.copy_(root.embedding.unsqueeze(1))
        embeddings = new_td({EMBEDDING_KEY: grid}, torch.Size(nodes))  # the shape is [B, N, ...]
    else:
        embeddings = embedding.unsqueeze(1).expand(batch, num_nodes).clone()
    tree = Tree(
        node_data=full((*nodes, len(_NODE_FIELDS)), 0, dtype),
        edge_data=full((*edges, len(_EDGE_FIELDS)), 0, dtype),
        parents=full(nodes, NO_PARENT, torch.int64),
        action_from_parent=full(nodes, NO_PARENT, torch.int64),
        children_index=full(edges, UNVISITED, torch.int64),
        invalid_actions=full(edges, False, torch.bool),
        embeddings=embeddings,
        extra=extra if extra is not None else new_td({}, torch.Size([batch]), device),
    )
    if not write_root:
        return tree, wrapped
    logits = logits.to(dtype)
    if invalid is None:  # what mask_invalid_logits gives for an all-legal mask
        logits = (logits - logits.amax(-1, keepdim=True)).clamp_(min=torch.finfo(dtype).min)
    else:
        logits = mask_invalid_logits(logits, invalid)
        tree.invalid_actions.select(1, ROOT_INDEX).copy_(invalid & ~invalid.all(-1, keepdim=True))
    root_nodes = torch.stack([torch.ones_like(value), value, value, value], -1)  # VISITS, ...
    tree.node_data.select(1, ROOT_INDEX).copy_(root_nodes)
    priors = torch.stack([logits, torch.softmax(logits, -1)], -1)  # PRIOR_LOGIT, PRIOR_PROB
    tree.edge_data.select(1, ROOT_INDEX).narrow(-1, EdgeChannel.PRIOR_LOGIT, 2).copy_(priors)
    return tree, wrapped


def _as_tensordict(
    embedding: TensorDictBase | Tensor, batch: int, name: str
) -> tuple[TensorDictBase | None, bool]:
    """``(embedding, False)`` for a TensorDict of batch ``[B]``, ``(None, True)`` for a
    tensor ``[B, ...]`` (stored under ``EMBEDDING_KEY`` by the caller)."""
    if type(embedding) is Tensor and embedding.dim() and embedding.shape[0] == batch:
        return None, True
    if isinstance(embedding, TensorDictBase):
        if embedding.batch_size[:1] != torch.Size([batch]):
            raise ValueError(f"{name} must have batch [B]={batch}, got {embedding.batch_size}")
        if embedding.batch_dims > 1:
            embedding = embedding.copy()
            embedding.batch_size = [batch]
        return embedding, False
    if not isinstance(embedding, Tensor) or embedding.shape[:1] != (batch,):
        shape = getattr(embedding, "shape", type(embedding).__name__)
        raise ValueError(f"{name} must be a TensorDict [B] or a tensor [B, ...], got {shape}")
    return None, True
