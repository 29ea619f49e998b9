"""Where an environment's seed comes from when the user gives none.

tdrl's rule (TorchRL's scripts rely on it without a library that enforces it): an env that was
never seeded draws its seed from torch's default generator the first time it resets, so that
``torch.manual_seed(s)`` at the top of a script makes every env in it repeatable, the ones the
script forgot to ``set_seed`` included (an evaluation env, typically), and two envs in one run
still get different seeds. Workers that build their own envs (multi-process collectors) take
``seed + 1000 * i`` from one such draw in the trainer, so they differ from each other too.
"""

from __future__ import annotations

import torch

__all__ = ["MAX_SEED", "seed_from_torch", "seed_if_unseeded"]

MAX_SEED = 2**31 - 1  # Gymnasium, DM Control and EnvPool accept seeds below 2**31


def seed_from_torch(span: int = 1) -> int:
    """A seed drawn from torch's default generator (one ``torch.randint`` call).

    Args:
        span: how many consecutive seeds the caller will use from it (``seed``, ``seed + 1``,
            ... ``seed + span - 1``, e.g. one per sub-env or ``1000 * n`` for ``n`` workers);
            all of them stay below :data:`MAX_SEED`.

    Returns:
        An int in ``[0, MAX_SEED - span)``.
    """
    if span < 1 or span >= MAX_SEED:
        raise ValueError(f"seed_from_torch: span must be in [1, {MAX_SEED}), got {span}.")
    return int(torch.randint(0, MAX_SEED - span, ()).item())


def seed_if_unseeded(env, seed: int | None) -> None:
    """``env.set_seed(seed)`` unless ``env`` already has a seed (or ``seed`` is None): how a
    collector's worker applies the base seed the trainer drew for it (``seed + 1000 * i``)
    without overriding a seed the env's maker set."""
    if seed is not None and not env.seeded:
        env.set_seed(seed)
