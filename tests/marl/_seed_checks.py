"""The data and the seed-equality check of the vectorised-seed tests (shared by test_vectorised_agents.py,
test_vectorised_qmix.py and test_vectorised_recurrent.py)."""

from __future__ import annotations

import torch

from tdrl.core.train.seeds import SeedStackedModule
from tdrl.marl.loops import GroupPolicies, collect


def assert_seed_state_equal(vec_loss, single_loss, k: int, tol: float, seed: int) -> int:
    """Seed ``k``'s slice of every stacked network of ``vec_loss`` (networks, mixers, targets)
    equals the single-seed loss's network of the same name (``seed`` names it in a failure);
    returns how many tensors were compared."""
    found = 0
    for name, mod in vec_loss.named_modules():
        if isinstance(mod, SeedStackedModule):
            ref = single_loss.get_submodule(name).state_dict()
            for n, v in mod.seed_state(k).items():
                torch.testing.assert_close(v, ref[n], rtol=tol, atol=tol, msg=f"{name}.{n} seed {seed}")
                found += 1
    return found


def collect_batches(env, groups, n: int, steps: int) -> list:
    """``n`` batches of ``steps`` steps of every sub-env, collected in a row by the (stacked)
    ``groups``' policies from one reset, under ``torch.manual_seed(0)``."""
    torch.manual_seed(0)
    policy = GroupPolicies({g: p.policy for g, p in groups.items()})
    batches, td = [], env.reset()
    for _ in range(n):
        batch, td = collect(env, policy, td, steps)
        batches.append(batch)
    return batches
