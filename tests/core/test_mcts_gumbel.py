"""Gumbel MuZero search: sequential halving, considered set, completed Q, batched == single."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from tensordict import TensorDict

from tdrl.core.mcts import (
    CONSIDERED,
    POLICY_TARGET,
    VISIT_COUNTS,
    RecurrentOutput,
    RootOutput,
    TicTacToe,
    gumbel_interior_selection,
    gumbel_muzero_policy,
    gumbel_root_selection,
    qtransform_completed_by_mix_value,
    search,
    sequence_of_considered_visits,
    simulator_model,
)
from tdrl.core.mcts.tree import NodeStats


def _random_model(num_actions: int, dim: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    dynamics = torch.randn(num_actions, dim, dim, generator=g) / dim**0.5
    heads = torch.randn(dim, num_actions + 2, generator=g)

    def recurrent(embedding, action):
        nxt = torch.tanh(torch.bmm(dynamics[action], embedding.unsqueeze(-1)).squeeze(-1))
        out = nxt @ heads
        return RecurrentOutput(
            nxt, torch.tanh(out[:, -1]), torch.full((nxt.shape[0],), 0.9),
            out[:, :num_actions], torch.tanh(out[:, -2]),
        )  # fmt: skip

    def root(embedding):
        out = embedding @ heads
        return RootOutput(out[:, :num_actions], torch.tanh(out[:, -2]), embedding)

    return root, recurrent


def test_sequential_halving_sequence_by_hand():
    # m=4, n=8: log2(4)=2 phases; phase 1 gives each of 4 actions max(1, 8 // (2*4)) = 1
    # visit, phase 2 gives each of the best 2 actions 8 // (2*2) = 2 visits.
    assert sequence_of_considered_visits(4, 8) == [0, 0, 0, 0, 1, 1, 2, 2]
    # m=2, n=5: one visit each per round until the budget is used.
    assert sequence_of_considered_visits(2, 5) == [0, 0, 1, 1, 2]
    assert sequence_of_considered_visits(1, 3) == [0, 1, 2]
    # m=16, n=32: 4 phases; 16 actions x 1, then 8 x 1, 4 x 2, 2 x 4 = 32 visits.
    seq = sequence_of_considered_visits(16, 32)
    assert len(seq) == 32 and seq[:16] == [0] * 16 and seq[16:24] == [1] * 8


@pytest.mark.parametrize(("num_simulations", "m"), [(4, 2), (8, 4), (16, 4), (20, 16)])
def test_gumbel_never_picks_outside_the_considered_set(num_simulations, m):
    root_fn, recurrent_fn = _random_model(num_actions=8, dim=6, seed=num_simulations)
    batch = 64
    embeddings = torch.randn(batch, 6, generator=torch.Generator().manual_seed(m))
    invalid = torch.rand(batch, 8, generator=torch.Generator().manual_seed(1)) < 0.3
    invalid[:, 3] = False
    out, tree = gumbel_muzero_policy(
        root_fn(embeddings), recurrent_fn, num_simulations, invalid_actions=invalid,
        max_num_considered_actions=m, generator=torch.Generator().manual_seed(7),
        return_tree=True,
    )  # fmt: skip
    # The considered set, computed here from the Gumbel draw and the masked prior.
    scores = tree.extra["gumbel"] + root_fn(embeddings).prior_logits
    scores = scores.masked_fill(invalid, -torch.inf)
    k = torch.minimum((~invalid).sum(-1), torch.tensor(m))
    ranks = scores.argsort(-1, descending=True).argsort(-1)
    considered = (ranks < k[:, None]) & ~invalid
    torch.testing.assert_close(out[CONSIDERED], considered)
    action = out["action"]
    assert considered.gather(1, action[:, None]).all()
    # Only considered actions are ever simulated at the root.
    assert (out[VISIT_COUNTS][~considered] == 0).all()
    assert (out[VISIT_COUNTS].sum(-1) == num_simulations).all()
    # The chosen action is among the most visited.
    most = out[VISIT_COUNTS].max(-1).values
    assert (out[VISIT_COUNTS].gather(1, action[:, None]).squeeze(1) == most).all()
    # The policy target is a distribution over valid actions.
    torch.testing.assert_close(out[POLICY_TARGET].sum(-1), torch.ones(batch))
    assert (out[POLICY_TARGET][invalid] < 1e-6).all()


def test_gumbel_batched_equals_single():
    root_fn, recurrent_fn = _random_model(num_actions=6, dim=5, seed=3)
    embeddings = torch.randn(5, 5, generator=torch.Generator().manual_seed(4))
    gumbel = -torch.log(-torch.log(torch.rand(5, 6, generator=torch.Generator().manual_seed(5))))
    root_select = partial(gumbel_root_selection, num_simulations=12, max_num_considered_actions=4)
    run = partial(search, recurrent_fn=recurrent_fn, root_action_selection_fn=root_select,
                  interior_action_selection_fn=gumbel_interior_selection, num_simulations=12)  # fmt: skip
    batched = run(root_fn(embeddings), extra=TensorDict({"gumbel": gumbel}, [5]))
    for b in range(5):
        single = run(root_fn(embeddings[b : b + 1]), extra=TensorDict({"gumbel": gumbel[b : b + 1]}, [1]))
        part = batched.select_trees(b)
        torch.testing.assert_close(part.edge_data, single.edge_data)
        torch.testing.assert_close(part.children_index, single.children_index)


def test_completed_q_by_hand():
    # One node, 3 actions; action 0 visited twice with Q=1, action 1 once with Q=-1,
    # action 2 unvisited. Priors 0.5 / 0.25 / 0.25, raw value 0.
    # v_mix = (0 + 3 * (0.5 * 1 + 0.25 * -1) / 0.75) / (3 + 1) = 0.25
    # completed = [1, -1, 0.25] -> rescaled [1, 0, 0.625]; scale (50 + 2) * 0.1 = 5.2.
    probs = torch.tensor([[0.5, 0.25, 0.25]])
    stats = NodeStats(
        visits=torch.tensor([[2.0, 1.0, 0.0]]),
        qvalues=torch.tensor([[1.0, -1.0, 0.0]]),
        prior_logits=probs.log(),
        prior_probs=probs,
        invalid=torch.zeros(1, 3, dtype=torch.bool),
        node_visit=torch.tensor([4.0]),
        node_value=torch.tensor([0.0]),
        raw_value=torch.tensor([0.0]),
    )
    out = qtransform_completed_by_mix_value(stats)
    torch.testing.assert_close(out, torch.tensor([[1.0, 0.0, 0.625]]) * 5.2)


def test_gumbel_plays_the_winning_move():
    game = TicTacToe()
    zero = lambda s: (torch.zeros(s.batch_size[0], 9), torch.zeros(s.batch_size[0]))  # noqa: E731
    root_fn, recurrent_fn = simulator_model(game, zero)
    state = game.from_strings(["XX.OO....", "XX.OO.X..", "O.XO.X..."])
    out = gumbel_muzero_policy(
        root_fn(state), recurrent_fn, 32, two_player=True, max_num_considered_actions=9,
        generator=torch.Generator().manual_seed(0),
    )  # fmt: skip
    assert out["action"].tolist() == [2, 5, 8]
