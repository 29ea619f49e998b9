"""Several seeds of one algorithm trained as one vectorised model (all nine: MAPPO / IPPO, QMIX /
VDN, MADDPG / IDDPG, MASAC / ISAC, IQL).

A thin user of :mod:`tdrl.core.train.seeds`: each seed's networks are built (and
initialised) by :func:`~tdrl.core.train.seeds.build_seeds`, then stacked along a new leading
seed dim (:class:`~tdrl.core.train.seeds.SeedStackedModule`: ``stack_module_state`` and one
batched call, the multi-agent MLPs, mixers and GRU / LSTM layers through their own
``seed_stacked_forward``). Recurrent MAPPO / IPPO and QMIX / VDN (``config.recurrent``) stack the
loss's sequence-mode networks and re-point the step-mode collection policy (and the advantage's
critic) at them: every seed's cells stacked, one batched GEMM per step, each sub-env's hidden
state carried in its seed's block. The env holds ``n_seeds`` seed-major
blocks of sub-envs, so one env step, one forward pass and one optimiser step serve every
seed; Adam is element-wise and :func:`~tdrl.marl.loops.train_on_policy` clips gradients
per seed, so the seeds stay independent. Every agent group of a multi-group env is stacked
the same way (:func:`make_vectorised_groups`). Beyond the peers: BenchMARL runs seeds one
after another. QMIX / VDN seeds stack the Q networks, the mixer and both targets
(:func:`~tdrl.core.train.seeds.stack_losses`) and train with
``train_off_policy(..., n_seeds=)`` (:mod:`tdrl.marl.loops`: seed-major replay items,
per-seed clipping, one epsilon schedule counted in one seed's frames). MADDPG / IDDPG, MASAC /
ISAC and IQL stack core's DDPG / SAC / DQN loss of every seed the same way (actor, critics and
targets; SAC's temperature becomes one per seed, ``StackedTemperature``); the losses never see
the seeds, and the exploration (Gaussian noise, epsilon) keeps one schedule for all seeds,
counted in one seed's frames, with each sub-env drawing its own noise.

What stays shared between the seeds: the random draws (actions, the epoch permutation, a
sampled entropy estimate) come from one generator for all seeds, so a vectorised run equals
single-seed runs given the same data, not sample for sample. Value normalisation,
``normalize_advantage`` and agent masks with False entries are refused (their statistics
would mix the seeds).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tensordict.nn import ProbabilisticTensorDictSequential, TensorDictSequential
from torch import nn

from tdrl.core.train.seeds import SeedAxis, SeedStackedModule, build_seeds, stack_losses, stack_seeds, stacked_seed_counts

from .algorithms import (
    OffPolicyParts, OnPolicyParts, make_groups, make_iddpg, make_ippo, make_iql, make_isac, make_maddpg, make_mappo,
    make_masac, make_qmix, make_vdn,
)
from .keys import GROUP
from .modules import recurrent_view
from .objectives import AgentLoss, MAPPOConfig, QMIXConfig

__all__ = ["SeedStackedModule", "make_vectorised_groups", "make_vectorised_on_policy"]


_BUILDERS: dict[str, Callable] = {"mappo": make_mappo, "ippo": make_ippo, "qmix": make_qmix, "vdn": make_vdn,
                                  "maddpg": make_maddpg, "iddpg": make_iddpg, "masac": make_masac,
                                  "isac": make_isac, "iql": make_iql}
_OFF_POLICY = ("qmix", "vdn", "maddpg", "iddpg", "masac", "isac", "iql")


def _stack_parts(per_seed: list[OnPolicyParts], group: str) -> OnPolicyParts:
    """One group's parts with actor and critic stacked over the seeds of ``per_seed``."""
    first = per_seed[0]
    est = first.estimator
    if first.loss.value_norm is not None or est.value_norm is not None or est.average_advantage:
        raise ValueError(
            f"group {group!r}: value normalisation and average_advantage are not supported with "
            "vectorised seeds (their statistics would be shared by the seeds); build the parts "
            "without value_norm and with average_advantage=False, or run the seeds one after another."
        )
    if first.recurrent:
        return _stack_recurrent_parts(per_seed, group)
    actor_params = stack_seeds([p.policy.module[0] for p in per_seed])
    critic = stack_seeds([p.critic for p in per_seed])
    policy = ProbabilisticTensorDictSequential(actor_params, *list(first.policy.module[1:]))
    loss = type(first.loss)(policy, critic, first.loss.config, group=group)
    # reuse_values stays off: the seed-stacked critic needs [n_seeds * N] seed-major batches, and
    # the reuse path evaluates it on a masked subset of the next observations.
    estimator = type(est)(est.gamma, est.lmbda, group, critic)
    return OnPolicyParts(policy, critic, loss, estimator)


def _stack_recurrent_parts(per_seed: list[OnPolicyParts], group: str) -> OnPolicyParts:
    """Recurrent MAPPO / IPPO: the loss's sequence-mode actor and critic stacked over the seeds,
    and the collection policy (both in step mode) and the estimator's step-mode critic re-pointed
    at the same stacked networks (a step-mode layer and its sequence-mode view share one network)."""
    first = per_seed[0]
    actor, critic = stack_seeds([p.loss.actor for p in per_seed]), stack_seeds([p.critic for p in per_seed])
    loss = type(first.loss)(actor, critic, first.loss.config, group=group)
    names = {id(m): n for n, m in first.loss.named_modules() if n}
    policy = _relink(first.policy, names, loss)
    est = first.estimator
    # reuse_values stays off, as for the MLP critic: the reuse path runs a masked subset of rows
    estimator = type(est)(est.gamma, est.lmbda, group, _relink(est.value_network, names, loss))
    return OnPolicyParts(policy, critic, loss, estimator, recurrent=True)


def _relink(module: nn.Module, names: dict[int, str], stacked: nn.Module) -> nn.Module:
    """``module`` with every submodule that is a network of the single-seed loss (``names``: its
    ``id -> name`` in that loss) replaced by the stacked loss's network of the same name."""
    name = names.get(id(module))
    if name is not None:
        return stacked.get_submodule(name)
    for child_name, child in list(module.named_children()):
        new = _relink(child, names, stacked)
        if new is not child:
            setattr(module, child_name, new)
    return module


def _stack_agent_parts(per_seed: list[OffPolicyParts]) -> OffPolicyParts:
    """One group's MADDPG / IDDPG / MASAC / ISAC / IQL parts: core's loss of every seed joined by
    :func:`~tdrl.core.train.seeds.stack_losses` (actor, critics and their targets stacked, SAC's
    temperature one per seed), and the first seed's exploring policy re-pointed at the stacked
    networks it shares with the loss (the actor, or IQL's Q network); the exploration module
    (Gaussian noise or epsilon-greedy: no parameters) keeps one schedule for all seeds."""
    first = per_seed[0]
    core = stack_losses([p.loss.loss for p in per_seed])
    names = {id(m): n for n, m in first.loss.loss.named_modules() if n}
    policy = _relink(first.policy, names, core)
    if stacked_seed_counts(policy) != {len(per_seed)}:  # the policy acts with a network the loss does not train
        raise TypeError(f"{type(core).__name__}: the exploring policy shares no network with the loss, so it cannot "
                        "act with the stacked networks; train these seeds one after another.")
    return OffPolicyParts(policy, first.explore, AgentLoss(core, first.loss.group), first.config)


def _stack_off_parts(per_seed: list[OffPolicyParts]) -> OffPolicyParts:
    """One group's QMIX / VDN parts with the Q network, the mixer and their targets stacked over
    the seeds of ``per_seed``; the greedy head and the epsilon-greedy module (no parameters,
    one schedule for all seeds) are the first seed's."""
    first = per_seed[0]
    if isinstance(first.loss, AgentLoss):
        return _stack_agent_parts(per_seed)
    loss = stack_losses([p.loss for p in per_seed])
    greedy, explore = first.policy.module[0].module[1], first.policy.module[1]
    acting = recurrent_view(loss.local_value_network, False) if first.recurrent else loss.local_value_network
    policy = TensorDictSequential(TensorDictSequential(acting, greedy), explore)
    return OffPolicyParts(policy, explore, loss, first.config, recurrent=first.recurrent)


def make_vectorised_groups(algorithm: str | Callable, env, seeds: Sequence[int],
                           config: MAPPOConfig | QMIXConfig | None = None, groups: Sequence[str] | None = None,
                           num_cells: Sequence[int] = (256, 256)) -> dict[str, OnPolicyParts | OffPolicyParts]:
    """Parts of every agent group with each group's networks stacked over ``seeds``: MAPPO/IPPO
    (actor and critic), QMIX/VDN (Q network, mixer and their targets), MADDPG/IDDPG and
    MASAC/ISAC (actor, critics, target critics; SAC's temperature per seed) or IQL (Q network and
    its target).

    Seed ``s`` is built exactly as a single-seed run builds it: ``torch.manual_seed(s)``
    then :func:`~tdrl.marl.algorithms.make_groups` over all ``groups`` in order, so its
    initial weights equal that run's in every group. Train with
    ``train_on_policy(env, parts, cfg, n_seeds=len(seeds))`` (MAPPO/IPPO) or
    ``train_off_policy(env, parts, cfg, n_seeds=len(seeds))`` (the off-policy ones).

    Args:
        algorithm: a name of :data:`~tdrl.marl.algorithms.ALGORITHMS` (or its builder,
            :func:`make_mappo`, ...).
        env: the training env; its ``len(seeds) * E`` sub-envs are ``len(seeds)`` seed-major
            blocks of ``E`` (e.g. ``VmasEnv(num_envs=len(seeds) * E)`` or
            ``SerialEnv(len(seeds) * E, make_env)``).
        seeds: one seed per stacked model.
        config: the algorithm's config (None: its defaults); ``normalize_advantage`` must be
            False (minibatch statistics would mix the seeds).
        groups: which groups (default: all of the env's groups).
        num_cells: hidden sizes of every network.

    Returns:
        ``{group: OnPolicyParts}`` (MAPPO/IPPO) or ``{group: OffPolicyParts}`` (the others) whose
        networks take ``[len(seeds) * N, ...]`` seed-major inputs.
    """
    names = {v: k for k, v in _BUILDERS.items()}
    name = names.get(algorithm, algorithm)
    if not isinstance(name, str) or name not in _BUILDERS:
        raise ValueError(
            f"Vectorised seeds support the algorithms {sorted(_BUILDERS)}; got {algorithm!r}. "
            "Train other algorithms' seeds one after another."
        )
    if not seeds:
        raise ValueError("make_vectorised_groups needs at least one seed.")
    axis = SeedAxis(seeds)
    if env.batch_size.numel() % axis.n:
        raise ValueError(f"The env's {env.batch_size.numel()} sub-envs do not split into {axis.n} seeds.")
    axis.refuse_shared("normalize_advantage=True (the minibatch statistics)",
                       getattr(config, "normalize_advantage", False),
                       "set normalize_advantage=False (or standardise advantages per seed yourself)")
    per_seed = build_seeds(lambda seed: make_groups(name, env, config, groups, num_cells=num_cells), axis.seeds,
                           stack=False)
    if not axis.stacked:  # one seed is a stack of one: its plain networks, as a single run builds them
        return per_seed[0]
    if name in _OFF_POLICY:
        return {g: _stack_off_parts([p[g] for p in per_seed]) for g in per_seed[0]}
    return {g: _stack_parts([p[g] for p in per_seed], g) for g in per_seed[0]}


def make_vectorised_on_policy(env, seeds: Sequence[int], config: MAPPOConfig | None = None,
                              algorithm: str = "mappo", group: str = GROUP,
                              num_cells: Sequence[int] = (256, 256)) -> OnPolicyParts:
    """MAPPO/IPPO parts of one ``group`` whose actor and critic are stacked over ``seeds``.

    Each seed's networks are initialised under ``torch.manual_seed(seed)``, exactly as a
    single-seed run would build them. ``env`` must hold ``len(seeds)`` seed-major blocks of
    sub-envs (e.g. ``VmasEnv(num_envs=len(seeds) * E)``); train with
    ``train_on_policy(..., n_seeds=len(seeds))``. For several groups use
    :func:`make_vectorised_groups`.
    """
    return make_vectorised_groups(algorithm, env, seeds, config, [group], num_cells)[group]
