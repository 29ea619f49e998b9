"""Selection rules and root-policy helpers, as small functions over a batch of trees.

A selection function has the signature ``(tree, node_index [B], depth: int) -> action [B]``;
bind its options with ``functools.partial``. Ties go to the lowest action index, so a search
is deterministic given its random inputs (Dirichlet noise, Gumbel draws).

* :func:`puct_selection` — AlphaZero / MuZero PUCT (Silver et al., 2018; Schrittwieser et al.,
  2020): ``Q + c(n) * P(a) * sqrt(N) / (1 + N(a))`` with
  ``c(n) = pb_c_init + log((N + pb_c_base + 1) / pb_c_base)``.
* :func:`ucb1_selection` — UCB1 / UCT (Kocsis & Szepesvari, 2006), ignores priors; unvisited
  actions first.
* :func:`gumbel_root_selection` and :func:`gumbel_interior_selection` — Gumbel MuZero
  (Danihelka et al., 2022): sequential halving over the top-``m`` actions of
  ``gumbel + logits`` at the root, and the deterministic "match the improved policy"
  rule elsewhere.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache

import torch
from torch import Tensor

from .qtransforms import qtransform_by_parent_and_siblings, qtransform_completed_by_mix_value
from .tree import NodeStats, Tree, node_batched

QTransform = Callable[[NodeStats], Tensor]
SelectionFn = Callable[[Tree, Tensor, int], Tensor]


def masked_argmax(scores: Tensor, invalid_actions: Tensor | None) -> Tensor:
    """Argmax over the last dim that never returns an invalid action (ties: lowest index).

    Args:
        scores: ``[..., A]``.
        invalid_actions: ``[..., A]`` bool or None; rows where every action is invalid fall
            back to the plain argmax.

    Returns:
        ``[...]`` int64 actions.
    """
    if invalid_actions is not None:
        invalid = invalid_actions & ~invalid_actions.all(-1, keepdim=True)
        scores = scores.masked_fill(invalid, -torch.inf)
    return scores.argmax(-1)


def _argmax_valid(scores: Tensor, invalid: Tensor) -> Tensor:
    # ``invalid`` comes from the tree, where all-invalid rows are already stored as all-valid.
    return scores.masked_fill(invalid, -torch.inf).argmax(-1)


def puct_scores(
    stats: NodeStats,
    *,
    pb_c_init: float = 1.25,
    pb_c_base: float = 19652.0,
    qtransform: QTransform = qtransform_by_parent_and_siblings,
) -> Tensor:
    """PUCT scores ``[B, A]`` of the children of one node per tree (``tree.node_stats``).

    ``N`` is the node's own visit count (which includes its expansion), as in mctx.
    """
    node_visit = stats.node_visit[..., None]
    pb_c = pb_c_init + torch.log((node_visit + (pb_c_base + 1.0)) / pb_c_base)
    policy_score = (node_visit.sqrt() * pb_c) * stats.prior_probs / (stats.visits + 1)
    return qtransform(stats) + policy_score


@node_batched
def puct_selection(
    tree: Tree,
    node_index: Tensor,
    depth: int = 0,
    *,
    pb_c_init: float = 1.25,
    pb_c_base: float = 19652.0,
    qtransform: QTransform = qtransform_by_parent_and_siblings,
) -> Tensor:
    """Pick the valid child with the highest PUCT score. Returns ``[B]`` actions."""
    stats = tree.node_stats(node_index)
    scores = puct_scores(stats, pb_c_init=pb_c_init, pb_c_base=pb_c_base, qtransform=qtransform)
    return _argmax_valid(scores, stats.invalid)


def ucb1_scores(
    stats: NodeStats,
    *,
    exploration: float = math.sqrt(2.0),
    qtransform: QTransform = qtransform_by_parent_and_siblings,
) -> Tensor:
    """UCB1 scores ``[B, A]``: ``Q + c * sqrt(log N / N(a))``; unvisited children get ``+inf``."""
    visit_counts = stats.visits
    bonus = exploration * torch.sqrt(stats.node_visit.log()[..., None] / visit_counts.clamp(min=1))
    scores = qtransform(stats) + bonus
    return scores.masked_fill(visit_counts == 0, torch.inf)


@node_batched
def ucb1_selection(
    tree: Tree,
    node_index: Tensor,
    depth: int = 0,
    *,
    exploration: float = math.sqrt(2.0),
    qtransform: QTransform = qtransform_by_parent_and_siblings,
) -> Tensor:
    """Pick the valid child with the highest UCB1 score. Returns ``[B]`` actions."""
    stats = tree.node_stats(node_index)
    scores = ucb1_scores(stats, exploration=exploration, qtransform=qtransform)
    # +inf ties among unvisited children: argmax picks the lowest valid index.
    return _argmax_valid(scores.nan_to_num(posinf=torch.finfo(scores.dtype).max), stats.invalid)


# --------------------------------------------------------------------------------- Gumbel


def sequence_of_considered_visits(max_num_considered: int, num_simulations: int) -> list[int]:
    """Visit count an action must have to be simulated next, for each root simulation.

    Sequential halving: ``m`` actions get the same visits per phase, then the worse half is
    dropped, until ``num_simulations`` is used up (Danihelka et al., 2022, section 3.2).

    Args:
        max_num_considered: ``m``, the number of actions considered in the first phase.
        num_simulations: ``n``, the simulation budget.

    Returns:
        ``n`` visit counts.
    """
    if max_num_considered <= 1:
        return list(range(num_simulations))
    log2max = math.ceil(math.log2(max_num_considered))
    sequence: list[int] = []
    visits = [0] * max_num_considered
    considered = max_num_considered
    while len(sequence) < num_simulations:
        extra = max(1, int(num_simulations / (log2max * considered)))
        for _ in range(extra):
            sequence.extend(visits[:considered])
            for i in range(considered):
                visits[i] += 1
        considered = max(2, considered // 2)
    return sequence[:num_simulations]


@lru_cache(maxsize=64)
def _considered_visits_table(max_num_considered: int, num_simulations: int) -> tuple:
    return tuple(
        tuple(sequence_of_considered_visits(m, num_simulations))
        for m in range(max_num_considered + 1)
    )


def considered_visits_table(
    max_num_considered: int, num_simulations: int, device: torch.device | str = "cpu"
) -> Tensor:
    """``[m + 1, n]`` int64 table: row ``k`` is the sequence for ``k`` considered actions."""
    return _table_tensor(max_num_considered, num_simulations, str(device))


@lru_cache(maxsize=64)
def _table_tensor(max_num_considered: int, num_simulations: int, device: str) -> Tensor:
    table = _considered_visits_table(max_num_considered, num_simulations)
    return torch.tensor(table, dtype=torch.int64, device=device)


def gumbel_score(
    considered_visit: Tensor,
    gumbel: Tensor,
    logits: Tensor,
    normalized_qvalues: Tensor,
    visit_counts: Tensor,
) -> Tensor:
    """``gumbel + logits + sigma(q)`` for actions whose visits equal ``considered_visit``.

    Args:
        considered_visit: ``[B]`` or ``[B, 1]`` visit count an action needs to be a candidate.
        gumbel, logits, normalized_qvalues, visit_counts: ``[B, A]``.

    Returns:
        ``[B, A]``; ``-inf`` for actions that are not candidates.
    """
    if considered_visit.dim() == 1:
        considered_visit = considered_visit[:, None]
    logits = logits - logits.amax(-1, keepdim=True)
    score = (gumbel + logits + normalized_qvalues).clamp(min=-1e9)
    return score.masked_fill(visit_counts != considered_visit, -torch.inf)


def gumbel_root_selection(
    tree: Tree,
    node_index: Tensor,
    depth: int = 0,
    *,
    num_simulations: int,
    max_num_considered_actions: int = 16,
    qtransform: QTransform = qtransform_completed_by_mix_value,
) -> Tensor:
    """Sequential halving at the root with the Gumbel-Top-k trick.

    Reads the root Gumbel noise from ``tree.extra["gumbel"]`` ``[B, A]``.

    Returns:
        ``[B]`` actions, always among the top-``m`` of ``gumbel + logits``.
    """
    stats = tree.node_stats(node_index)
    visit_counts, invalid = stats.visits, stats.invalid
    num_valid = (~invalid).sum(-1)
    num_considered = num_valid.clamp(max=max_num_considered_actions)
    table = considered_visits_table(
        max_num_considered_actions, num_simulations, device=node_index.device
    )
    simulation_index = visit_counts.sum(-1).long().clamp(max=num_simulations - 1)
    considered_visit = table[num_considered, simulation_index]
    scores = gumbel_score(
        considered_visit.to(visit_counts.dtype),
        tree.extra["gumbel"],
        stats.prior_logits,
        qtransform(stats),
        visit_counts,
    )
    return _argmax_valid(scores, invalid)


@node_batched
def gumbel_interior_selection(
    tree: Tree,
    node_index: Tensor,
    depth: int = 0,
    *,
    qtransform: QTransform = qtransform_completed_by_mix_value,
) -> Tensor:
    """Deterministic selection that makes the visits match the improved policy.

    ``argmax_a pi'(a) - N(a) / (1 + sum_b N(b))`` with
    ``pi' = softmax(logits + sigma(completed Q))`` (Danihelka et al., 2022, eq. 14).
    """
    stats = tree.node_stats(node_index)
    visit_counts = stats.visits
    probs = torch.softmax(stats.prior_logits + qtransform(stats), -1)
    scores = probs - visit_counts / (1 + visit_counts.sum(-1, keepdim=True))
    return _argmax_valid(scores, stats.invalid)


# ------------------------------------------------------------------------ root noise, sampling


def _standard_gamma(alpha: Tensor, generator: torch.Generator | None) -> Tensor:
    if generator is None:
        return torch._standard_gamma(alpha)
    seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device))
    devices = [alpha.device] if alpha.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        return torch._standard_gamma(alpha)


def add_dirichlet_noise(
    prior_logits: Tensor,
    *,
    alpha: float,
    fraction: float,
    invalid_actions: Tensor | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """AlphaZero root exploration: ``P' = (1 - fraction) * P + fraction * Dir(alpha)``.

    The Dirichlet noise is drawn over the valid actions only.

    Args:
        prior_logits: ``[B, A]``.
        alpha: Dirichlet concentration (0.3 for chess, 0.03 for Go; ~10 / typical #moves).
        fraction: weight of the noise (0.25 in AlphaZero).
        invalid_actions: ``[B, A]`` bool or None.
        generator: optional generator for reproducible noise.

    Returns:
        ``[B, A]`` logits (log-probabilities) of the noisy prior.
    """
    probs = torch.softmax(prior_logits, -1)
    gamma = _standard_gamma(torch.full_like(probs, alpha), generator)
    if invalid_actions is not None:
        gamma = gamma.masked_fill(invalid_actions, 0.0)
    noise = gamma / gamma.sum(-1, keepdim=True).clamp(min=torch.finfo(gamma.dtype).tiny)
    mixed = (1 - fraction) * probs + fraction * noise
    return mixed.clamp(min=torch.finfo(mixed.dtype).tiny).log()


def sample_gumbel(
    shape: tuple[int, ...],
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    generator: torch.Generator | None = None,
) -> Tensor:
    """Standard Gumbel noise ``-log(-log U)`` of the given shape."""
    tiny = torch.finfo(dtype).tiny
    u = torch.rand(shape, dtype=dtype, device=device, generator=generator)
    return -torch.log(-torch.log(u.clamp(min=tiny, max=1 - 1e-7)))


def sample_from_visits(
    visit_counts: Tensor,
    temperature: float,
    *,
    invalid_actions: Tensor | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Choose the action to play with probability ``N(a)^(1/T)`` (``T=0``: most visited).

    Args:
        visit_counts: ``[B, A]`` root visit counts.
        temperature: ``T >= 0``.
        invalid_actions: ``[B, A]`` bool or None.
        generator: optional generator.

    Returns:
        ``[B]`` int64 actions.
    """
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if temperature == 0 and invalid_actions is None:
        return visit_counts.argmax(-1)  # the most visited, ties to the lowest action
    counts = visit_counts.to(torch.float64)
    valid = torch.ones_like(counts, dtype=torch.bool)
    if invalid_actions is not None:
        valid = ~(invalid_actions & ~invalid_actions.all(-1, keepdim=True))
        counts = counts.masked_fill(~valid, 0)
    if temperature == 0:
        return masked_argmax(counts, invalid_actions)
    logits = counts.log() / temperature  # -inf for unvisited actions
    top = logits.amax(-1, keepdim=True)
    visited = torch.isfinite(top)  # rows with no visit at all: uniform over valid actions
    probs = torch.where(visited, (logits - torch.where(visited, top, 0.0)).exp(), valid.double())
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
