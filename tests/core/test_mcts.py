"""Batched MCTS: hand-computed trees, forced wins, batched == single, root helpers."""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch

from tdrl.core.mcts import (
    NO_PARENT,
    POLICY_TARGET,
    ROOT_VALUE,
    VISIT_COUNTS,
    RecurrentOutput,
    RootOutput,
    TicTacToe,
    add_dirichlet_noise,
    muzero_policy,
    puct_selection,
    qtransform_by_min_max,
    sample_from_visits,
    search,
    simulator_model,
    ucb1_selection,
)

PRIOR = torch.tensor([0.3, 0.7]).log()


def _chain_model(embedding: torch.Tensor, action: torch.Tensor) -> RecurrentOutput:
    """Two actions: action 0 pays 1, action 1 pays 0; discount 0.9; value 0; prior 0.3/0.7."""
    batch = action.shape[0]
    return RecurrentOutput(
        embedding + 1,
        (action == 0).float(),
        torch.full((batch,), 0.9),
        PRIOR.expand(batch, 2),
        torch.zeros(batch),
    )


def _hand_root(batch: int = 1) -> RootOutput:
    return RootOutput(PRIOR.expand(batch, 2), torch.zeros(batch), torch.zeros(batch, 1))


def _hand_search(num_simulations: int):
    # c(N) = pb_c_init + log((N + base + 1) / base) ~= 2 with a huge base.
    select = partial(puct_selection, pb_c_init=2.0, pb_c_base=1e12)
    return search(_hand_root(), _chain_model, select, select, num_simulations)


def test_puct_tree_matches_hand_computation():
    # Scores = minmax-normalised Q + sqrt(N) * 2 * P(a) / (1 + N(a)), unvisited Q -> 0.
    # sim 1: root N=1: [0.6, 1.4] -> a1; node 1 = (root, a1), r=0, v=0.   root (2, 0)
    # sim 2: root N=2, all Q 0: [0.849, 0.990] -> a1; node 1 unvisited children -> a1;
    #        node 2 = (1, a1), r=0.                                      root (3, 0)
    # sim 3: root N=3: [1.039, 0.808] -> a0; node 3 = (root, a0), r=1.   root (4, 1)
    # sim 4: root N=4, value .25, Q=[1, 0] -> norm [1, 0]; + [0.6, 0.933] -> a0;
    #        node 3 -> a1; node 4 = (3, a1), r=0; root gets 1 + .9 * 0.  root (5, 2)
    # sim 5: root N=5, Q=[1, 0]: [1.447, 1.043] -> a0; node 3 (N=2, Q all 0):
    #        [0.849, 0.990] -> a1; node 4 -> a1; node 5 = (4, a1).       root (6, 3)
    tree = _hand_search(4)
    assert tree.children_visits[0, 0].tolist() == [2, 2]
    assert tree.node_values[0, 0].item() == pytest.approx(0.4)

    tree = _hand_search(5)
    assert tree.parents[0].tolist() == [NO_PARENT, 0, 1, 0, 3, 4]
    assert tree.action_from_parent[0].tolist() == [NO_PARENT, 1, 1, 0, 1, 1]
    assert tree.node_visits[0].tolist() == [6, 2, 1, 3, 2, 1]
    assert tree.value_sums[0].tolist() == pytest.approx([3, 0, 0, 0, 0, 0])
    assert tree.children_visits[0, 0].tolist() == [3, 2]
    assert tree.children_index[0, 0].tolist() == [3, 1]
    assert tree.children_rewards[0, 0].tolist() == [1.0, 0.0]
    summary = tree.root_summary()
    assert summary["value"].item() == pytest.approx(0.5)
    assert summary["q_values"][0].tolist() == pytest.approx([1.0, 0.0])
    # Embeddings follow the path: the model adds 1 per step.
    assert tree.embeddings["embedding"][0, :, 0].tolist() == [0, 1, 2, 1, 2, 3]


def test_ucb1_visits_every_action_once_then_the_best():
    # UCB1 tries unvisited actions first (lowest index first); with Q normalised in [0, 1]
    # by fixed bounds, the third simulation goes to the paying action 0:
    # score(a0) = 1/1 * ... Q=(1 - 0)/1 = 1 + sqrt(2 log 3 / 1); score(a1) = 0 + same bonus.
    select = partial(ucb1_selection, qtransform=partial(qtransform_by_min_max, min_value=0, max_value=1))
    tree = search(_hand_root(), _chain_model, select, select, 3)
    assert tree.children_index[0, 0].tolist() == [1, 2]
    assert tree.parents[0].tolist() == [NO_PARENT, 0, 0, 1]
    assert tree.children_visits[0, 0].tolist() == [2, 1]


def test_max_depth_reevaluates_instead_of_growing():
    select = partial(puct_selection, pb_c_init=2.0, pb_c_base=1e12)
    tree = search(_hand_root(), _chain_model, select, select, 5, max_depth=1)
    # Only the two root children exist (in the slots of the simulations that created
    # them); later simulations re-evaluate them.
    assert ((tree.parents[0] == 0).sum() == 2) and ((tree.parents[0] > 0).sum() == 0)
    assert tree.children_visits[0, 0].sum().item() == 5
    assert tree.node_visits[0, 0].item() == 6


def test_two_player_negates_discounts_and_values():
    game = TicTacToe()
    zero = lambda s: (torch.zeros(s.batch_size[0], 9), torch.zeros(s.batch_size[0]))  # noqa: E731
    root_fn, recurrent_fn = simulator_model(game, zero)
    state = game.from_strings(["XX.OO...."])
    out, tree = muzero_policy(
        root_fn(state), recurrent_fn, 20, two_player=True, dirichlet_fraction=0.0,
        temperature=0.0, return_tree=True,
    )  # fmt: skip
    expanded = tree.children_index[0, 0] >= 0
    discounts = tree.children_discounts[0, 0][expanded]
    # X's win at cell 2 ends the game (discount 0); every other move continues (discount -1).
    winning = tree.children_index[0, 0, 2] >= 0
    assert winning and tree.children_discounts[0, 0, 2] == 0 and tree.children_rewards[0, 0, 2] == 1
    assert set(discounts.tolist()) <= {0.0, -1.0}
    assert out["action"].item() == 2 and out[ROOT_VALUE].item() > 0.5


# Positions and their winning moves, from a minimax solver: (board, player to move, wins).
FORCED_WINS = [
    ("XX.OO....", {2}),  # X wins now (O threatens 5)
    ("XX.OO.X..", {5}),  # O to move wins now (X threatens 2)
    ("X..O.....", {1, 2, 4}),  # X forces a win in 5 plies
    ("X.......O", {2, 6}),  # X makes a fork
]


@pytest.mark.parametrize("num_simulations", [300])
def test_finds_forced_wins_in_tic_tac_toe(num_simulations):
    game = TicTacToe()
    zero = lambda s: (torch.zeros(s.batch_size[0], 9), torch.zeros(s.batch_size[0]))  # noqa: E731
    root_fn, recurrent_fn = simulator_model(game, zero)
    state = game.from_strings([board for board, _ in FORCED_WINS])
    out = muzero_policy(
        root_fn(state), recurrent_fn, num_simulations, two_player=True,
        dirichlet_fraction=0.0, temperature=0.0,
    )  # fmt: skip
    for (board, wins), action in zip(FORCED_WINS, out["action"].tolist(), strict=True):
        assert action in wins, f"{board}: played {action}, winning moves {wins}"
    assert (out[ROOT_VALUE][:2] > 0.8).all()  # immediate wins are seen as wins


def _random_model(num_actions: int, dim: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    dynamics = torch.randn(num_actions, dim, dim, generator=g) / dim**0.5
    heads = torch.randn(dim, num_actions + 2, generator=g)

    def recurrent(embedding, action):
        nxt = torch.tanh(torch.bmm(dynamics[action], embedding.unsqueeze(-1)).squeeze(-1))
        out = nxt @ heads
        reward = torch.tanh(out[:, -1])
        invalid = out[:, :num_actions] < -1.5  # some illegal actions, never all
        invalid[:, 0] = False
        return RecurrentOutput(
            nxt, reward, torch.full_like(reward, 0.95), out[:, :num_actions],
            torch.tanh(out[:, -2]), invalid,
        )  # fmt: skip

    def root(embedding):
        out = embedding @ heads
        return RootOutput(out[:, :num_actions], torch.tanh(out[:, -2]), embedding)

    return root, recurrent


@pytest.mark.parametrize("max_depth", [None, 3])
def test_batched_search_equals_single_searches(max_depth):
    root_fn, recurrent_fn = _random_model(num_actions=5, dim=6, seed=1)
    embeddings = torch.randn(6, 6, generator=torch.Generator().manual_seed(2))
    select = partial(puct_selection)
    batched = search(root_fn(embeddings), recurrent_fn, select, select, 24, max_depth=max_depth)
    for b in range(embeddings.shape[0]):
        single = search(root_fn(embeddings[b : b + 1]), recurrent_fn, select, select, 24, max_depth=max_depth)
        part = batched.select_trees(b)
        for name in ("node_data", "edge_data", "parents", "children_index", "invalid_actions"):
            torch.testing.assert_close(getattr(part, name), getattr(single, name), msg=name)
        torch.testing.assert_close(part.embeddings["embedding"], single.embeddings["embedding"])


def test_batched_tic_tac_toe_policy_equals_single():
    game = TicTacToe()
    zero = lambda s: (torch.zeros(s.batch_size[0], 9), torch.zeros(s.batch_size[0]))  # noqa: E731
    root_fn, recurrent_fn = simulator_model(game, zero)
    boards = ["X........", "XO.......", "X...O....", "........."]
    kwargs = dict(two_player=True, dirichlet_fraction=0.0, temperature=0.0)
    batched = muzero_policy(root_fn(game.from_strings(boards)), recurrent_fn, 30, **kwargs)
    for b, board in enumerate(boards):
        single = muzero_policy(root_fn(game.from_strings([board])), recurrent_fn, 30, **kwargs)
        torch.testing.assert_close(batched[b : b + 1].to_dict(), single.to_dict())


def test_policy_output_is_ready_for_training():
    root_fn, recurrent_fn = _random_model(num_actions=4, dim=5, seed=3)
    embeddings = torch.randn(8, 5)
    gen = torch.Generator().manual_seed(0)
    out = muzero_policy(root_fn(embeddings), recurrent_fn, 16, generator=gen)
    assert out.batch_size == torch.Size([8])
    assert out[POLICY_TARGET].shape == (8, 4) and out["action"].dtype == torch.int64
    torch.testing.assert_close(out[POLICY_TARGET].sum(-1), torch.ones(8))
    torch.testing.assert_close(out[POLICY_TARGET], out[VISIT_COUNTS] / 16.0)
    # The sampled action was visited (temperature 1 never plays an unvisited action).
    assert (out[VISIT_COUNTS].gather(1, out["action"][:, None]) > 0).all()


def test_dirichlet_noise_is_a_distribution_over_valid_actions():
    logits = torch.zeros(4, 5)
    invalid = torch.zeros(4, 5, dtype=torch.bool)
    invalid[:, 1] = True
    noisy = add_dirichlet_noise(
        logits, alpha=0.3, fraction=0.25, invalid_actions=invalid,
        generator=torch.Generator().manual_seed(0),
    )  # fmt: skip
    again = add_dirichlet_noise(
        logits, alpha=0.3, fraction=0.25, invalid_actions=invalid,
        generator=torch.Generator().manual_seed(0),
    )  # fmt: skip
    probs = noisy.exp()
    torch.testing.assert_close(probs.sum(-1), torch.ones(4))
    torch.testing.assert_close(noisy, again)
    # Invalid action 1 keeps only its (1 - fraction) prior share: 0.75 * 0.2.
    torch.testing.assert_close(probs[:, 1], torch.full((4,), 0.75 * 0.2))
    assert not torch.allclose(probs[:, 0], probs[:, 2])  # noise differs per action


def test_temperature_sampling():
    visits = torch.tensor([[1, 3, 0, 6]]).expand(4000, 4)
    assert (sample_from_visits(visits, 0.0) == 3).all()
    gen = torch.Generator().manual_seed(0)
    freq = torch.bincount(sample_from_visits(visits, 1.0, generator=gen), minlength=4) / 4000
    torch.testing.assert_close(freq, torch.tensor([0.1, 0.3, 0.0, 0.6]), atol=0.03, rtol=0)
    # T = 0.5 squares the counts: 1, 9, 0, 36 over 46.
    freq = torch.bincount(sample_from_visits(visits, 0.5, generator=gen), minlength=4) / 4000
    expected = torch.tensor([1.0, 9.0, 0.0, 36.0]) / 46
    torch.testing.assert_close(freq, expected, atol=0.03, rtol=0)
    with pytest.raises(ValueError, match="temperature"):
        sample_from_visits(visits, -1.0)


def test_errors_name_the_bad_shape():
    root_fn, recurrent_fn = _random_model(num_actions=3, dim=4, seed=0)
    root = root_fn(torch.randn(2, 4))
    with pytest.raises(ValueError, match=r"root.value must be \[B\]"):
        search(root._replace(value=torch.zeros(3)), recurrent_fn, puct_selection, puct_selection, 2)

    def bad(embedding, action):
        out = recurrent_fn(embedding, action)
        return out._replace(prior_logits=out.prior_logits[:, :2])

    with pytest.raises(ValueError, match="prior_logits must be"):
        search(root, bad, puct_selection, puct_selection, 2)
    assert math.isfinite(float(search(root, recurrent_fn, puct_selection, puct_selection, 2).value_sums.sum()))


def test_missing_embedding_key_names_it():
    """A model whose next embedding lacks a key of the root's TensorDict embedding is refused
    with the key's name (on the first expansion)."""
    from tensordict import TensorDict

    def model(embedding, action):
        batch = action.shape[0]
        nxt = TensorDict({"h": embedding["h"] + 1}, batch_size=[batch])  # drops "c"
        return RecurrentOutput(nxt, torch.zeros(batch), torch.ones(batch), PRIOR.expand(batch, 2),
                               torch.zeros(batch))

    root_embedding = TensorDict({"h": torch.zeros(2, 3), "c": torch.zeros(2, 1)}, batch_size=[2])
    root = RootOutput(PRIOR.expand(2, 2), torch.zeros(2), root_embedding)
    with pytest.raises(KeyError, match="lacks the key 'c'"):
        search(root, model, puct_selection, puct_selection, 3)
