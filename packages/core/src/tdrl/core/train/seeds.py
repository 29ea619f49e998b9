"""Several seeds of one training run as one vectorised model (purejaxrl's ``vmap`` over seeds).

purejaxrl writes ``make_train(config)`` -> a pure function of the seed, and ``vmap`` runs
every seed at once. A torch run steps Python envs, so the whole loop cannot be vmapped; what
is vectorised here is everything a seed owns, and :class:`SeedAxis` is the one object a
training loop holds for it (one seed is a stack of one, so a loop has no seed-count branch):

* networks: :func:`build_seeds` calls a function of the seed once per seed (under
  ``torch.manual_seed(seed)``, so each seed's initial weights equal a single-seed run's) and
  stacks the results (:func:`stack_seeds`): every parameter gets a leading seed dim and the
  network is evaluated as one batched call
  (:class:`~tdrl.core.modules.stacked.SeedStackedModule`: batched matmuls for MLPs and for modules
  with a ``seed_stacked_forward``, such as ``tdrl.marl``'s GRU / LSTM layers, whose time loop
  ``vmap`` cannot batch; ``torch.func.vmap`` over ``functional_call`` otherwise). One optimiser over the stacked parameters serves every seed:
  Adam is element-wise, and :func:`clip_grad_norm_per_seed` clips each seed's slice alone.
* envs: ``n_seeds`` seeds x ``E`` envs are one env of ``n_seeds * E`` sub-envs in seed-major
  blocks; :func:`block_seeds` gives sub-env ``k * E + j`` the seed ``seeds[k] + j`` (what a
  single run of seed ``seeds[k]`` gives its sub-env ``j``) and :func:`seed_sub_envs` applies
  them.
* metrics and statistics: :func:`per_seed` / :func:`seed_of_env` split a seed-major batch;
  :func:`normalize_per_seed` standardises advantages within each seed's block.

What stays shared: one random generator draws for every seed (actions, minibatch
permutations), so a vectorised seed equals its single-seed run given the same data, not
sample for sample; a seed's trajectory does not depend on the other seeds' data (tested).
Anything that pools statistics over the batch (observation normalisation, a shared
advantage normalisation) must be made per seed or refused (:meth:`SeedAxis.refuse_shared`).

``apps/ppo`` and ``apps/sac`` (``n_seeds=``), the MARL loops (``train_on_policy`` /
``train_off_policy``, all nine algorithms, recurrent MAPPO / IPPO / QMIX / VDN included: their
minibatches and replay items are whole sub-env trajectories, the same count from every seed's
block) and the MARL runner train through :class:`SeedAxis`:
the runner runs one axis of every seed, or one axis of one seed after another, through one body.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torch import Tensor, nn

from tdrl.core.modules.stacked import SeedStackedModule
from tdrl.core.objectives.redq import CriticEnsemble
from tdrl.core.objectives.sac import EntropyTemperature
from tdrl.core.train.evaluation import evaluate_per_env

__all__ = [
    "SeedAxis",
    "SeedStackedModule",
    "StackedTemperature",
    "stack_seeds",
    "build_seeds",
    "clip_grad_norm_per_seed",
    "block_seeds",
    "seed_sub_envs",
    "seed_of_env",
    "per_seed",
    "normalize_per_seed",
    "stacked_seed_counts",
    "stack_losses",
    "to_seed_items",
    "from_seed_items",
]


def _wraps_network(m: nn.Module) -> bool:
    """Whether ``m`` is a TensorDict module around a tensor network ``m.module`` that holds
    parameters and no TensorDict module (a ``TensorDictModule``, or one that reads and writes its
    keys itself, as ``tdrl.marl``'s ``MultiAgentGRU`` does): a sequence's member, not the sequence."""
    inner = getattr(m, "module", None)
    return (isinstance(m, TensorDictModuleBase) and isinstance(inner, nn.Module)
            and not any(isinstance(x, TensorDictModuleBase) for x in inner.modules())
            and any(True for _ in inner.parameters()))


def _stack_one(modules: Sequence[nn.Module]) -> nn.Module:
    """Stack one network over seeds: the inner nets of TensorDict modules, keeping their keys."""
    first = modules[0]
    if any(type(m) is not type(first) for m in modules):
        raise TypeError(f"stack_seeds: the seeds built different types {sorted({type(m).__name__ for m in modules})}; "
                        "a function of the seed must build the same architecture for every seed.")
    tdmods = [n for n, m in first.named_modules() if _wraps_network(m)]
    if not tdmods:
        return SeedStackedModule(modules)
    out = copy.deepcopy(first)
    for name in tdmods:
        inner = [m.get_submodule(name).module for m in modules]
        out.get_submodule(name).module = SeedStackedModule(inner)
    return out


def stack_seeds(built: Sequence[Any]) -> Any:
    """Stack what a function of the seed built, once per seed, into one vectorised structure.

    Args:
        built: one entry per seed, each a module or a tuple / list / dict of modules (the same
            structure for every seed). In a TensorDict module (an actor, a value operator, a
            recurrent layer such as ``tdrl.marl``'s ``MultiAgentGRU``) the inner networks
            (``.module``) are stacked and the keys, modes and distribution heads kept.

    Returns:
        The structure of ``built[0]`` whose networks take ``[n_seeds * N, ...]`` seed-major
        inputs and hold ``[n_seeds, *shape]`` parameters.
    """
    if not built:
        raise ValueError("stack_seeds needs at least one seed's networks.")
    first = built[0]
    if isinstance(first, dict):
        return {k: stack_seeds([b[k] for b in built]) for k in first}
    if isinstance(first, (tuple, list)):
        return type(first)(stack_seeds([b[i] for b in built]) for i in range(len(first)))
    if not isinstance(first, nn.Module):
        raise TypeError(f"stack_seeds: expected modules (or tuples / dicts of modules), got {type(first).__name__}.")
    return _stack_one(built)


def stack_losses(losses: Sequence[nn.Module]) -> nn.Module:
    """One loss over seed-stacked networks, from one loss per seed (same class and settings).

    The result is a copy of ``losses[0]`` (its keys, config and parameter-free parts) whose
    every child module holding parameters is replaced by the seeds' children stacked with
    :func:`stack_seeds`; target networks (``target_<name>``) are stacked from each seed's own
    target and stay frozen. An :class:`~tdrl.core.objectives.EntropyTemperature` becomes a
    :class:`StackedTemperature` (one temperature per seed), and REDQ's
    :class:`~tdrl.core.objectives.redq.CriticEnsemble` s are joined with its ``concat`` (one
    group of critics per seed).

    Args:
        losses: one loss per seed, e.g. built by :func:`build_seeds` with ``stack=False``.

    Returns:
        The seed-stacked loss: it takes ``[n_seeds * N]`` seed-major batches; its means over
        the batch are the mean over seeds of each seed's mean, so callers scale the total
        loss by ``n_seeds`` for each seed to get its own mean-loss gradient.
    """
    if not losses:
        raise ValueError("stack_losses needs at least one seed's loss.")
    first = losses[0]
    if any(type(x) is not type(first) for x in losses):
        raise TypeError(f"stack_losses: the seeds built different losses {sorted({type(x).__name__ for x in losses})}.")
    targets = {t for _, t in getattr(first, "_target_pairs", [])}
    out = copy.deepcopy(first)
    for name, child in first.named_children():
        parts = [x.get_submodule(name) for x in losses]
        if isinstance(child, EntropyTemperature):
            setattr(out, name, StackedTemperature.stack(parts))
        elif isinstance(child, CriticEnsemble):
            setattr(out, name, CriticEnsemble.concat(parts))
        elif any(True for _ in child.parameters()):
            stacked = stack_seeds(parts)
            if name in targets:
                for p in stacked.parameters():
                    p.requires_grad_(False)
            setattr(out, name, stacked)
    return out


def to_seed_items(td: TensorDictBase, n_seeds: int) -> TensorDictBase:
    """Seed-major transitions ``[n_seeds * N]`` -> ``N`` replay items, item ``i`` holding the
    ``i``-th transition of every seed (leaves ``[N, n_seeds, ...]``, batch ``[N]``).

    A replay storage of such items is one buffer per seed in one tensor: item ``i`` is what
    a single run of each seed would store at slot ``i``, and :func:`from_seed_items` turns a
    sample back into seed-major rows, each seed reading only its own transitions.
    """
    n = per_seed(td, n_seeds).shape[1]
    return td.apply(lambda t: t.reshape(n_seeds, n, *t.shape[1:]).transpose(0, 1), batch_size=[n])


def from_seed_items(sample: TensorDictBase, n_seeds: int, drop: Sequence[str] = ("index",)) -> TensorDictBase:
    """A replay sample of :func:`to_seed_items` items (batch ``[B]``, leaves
    ``[B, n_seeds, ...]``) -> seed-major rows ``[n_seeds * B]`` (seed ``k``'s sample is
    rows ``k * B .. (k + 1) * B``, the same slots for every seed). ``drop``: entries
    the buffer adds per item (its sampled ``index``)."""
    b = sample.shape[0]
    sample = sample.exclude(*drop)
    for key, leaf in sample.items(include_nested=True, leaves_only=True):
        if leaf.ndim < 2 or leaf.shape[1] != n_seeds:
            raise ValueError(f"from_seed_items: entry {key!r} has shape {tuple(leaf.shape)}; expected "
                             f"[{b}, n_seeds={n_seeds}, ...] (a sample of to_seed_items items).")
    return sample.apply(lambda t: t.transpose(0, 1).reshape(n_seeds * b, *t.shape[2:]), batch_size=[n_seeds * b])


def build_seeds(build: Callable[[int], Any], seeds: Sequence[int], stack: bool = True) -> Any:
    """The ``make_train`` entry: ``build(seed)`` once per seed, each under
    ``torch.manual_seed(seed)``, stacked with :func:`stack_seeds`.

    Args:
        build: a function of the seed returning a module or a tuple / dict of modules.
        seeds: one seed per stacked model (distinct).
        stack: False returns the per-seed list unstacked (for callers that stack parts
            of a larger bundle themselves).

    Returns:
        ``build``'s structure with every network stacked over ``seeds`` (or the list of
        ``build(seed)``). The global CPU generator is left as after building ``seeds[0]``, so
        what the caller draws next depends on ``seeds[0]`` alone, not on the other seeds.
    """
    seeds = list(seeds)
    if not seeds:
        raise ValueError("build_seeds needs at least one seed.")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"build_seeds: seeds {seeds} repeat a seed; each stacked model needs its own.")
    built, after_first = [], None
    for seed in seeds:
        torch.manual_seed(seed)
        built.append(build(seed))
        if after_first is None:
            after_first = torch.get_rng_state()
    # the CPU generator continues as a single run of seeds[0] continues after building: what is
    # drawn next (actions, permutations) depends on seeds[0] only, and never replays the draws
    # that initialised a network (a generator restored to just after manual_seed(seeds[0])
    # would hand the init's numbers to the action sampling)
    torch.set_rng_state(after_first)
    return stack_seeds(built) if stack else built


def stacked_seed_counts(module: nn.Module) -> set[int]:
    """The seed counts of the :class:`SeedStackedModule` s inside ``module`` (empty: none)."""
    return {m.n_seeds for m in module.modules() if isinstance(m, SeedStackedModule)}


@torch.no_grad()
def clip_grad_norm_per_seed(params: Iterable[Tensor], max_norm: float, n_seeds: int) -> Tensor:
    """Clip the gradient norm of each seed's slice (dim 0) of stacked parameters separately
    (``torch.nn.utils.clip_grad_norm_`` applied to every seed on its own).

    Args:
        params: stacked parameters ``[n_seeds, *shape]``.
        max_norm: the largest total gradient norm a seed keeps.
        n_seeds: the leading seed dim.

    Returns:
        The per-seed total norms before clipping, ``[n_seeds]``.
    """
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(n_seeds)
    for g in grads:
        if g.ndim == 0 or g.shape[0] != n_seeds:
            raise ValueError(f"clip_grad_norm_per_seed: a gradient of shape {tuple(g.shape)} has no leading "
                             f"seed dim of {n_seeds}; pass the parameters of seed-stacked networks.")
    sq = torch.stack([g.reshape(n_seeds, -1).pow(2).sum(-1) for g in grads]).sum(0)
    norm = sq.sqrt()
    scale = (max_norm / (norm + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(scale.reshape(n_seeds, *([1] * (g.ndim - 1))))
    return norm


def block_seeds(seeds: Sequence[int], num_envs: int) -> list[int]:
    """Per-sub-env seeds of a seed-major env: sub-env ``k * num_envs + j`` gets
    ``seeds[k] + j``, as a single run of seed ``seeds[k]`` seeds its sub-env ``j``.

    Args:
        seeds: the run seeds (one block each). num_envs: sub-envs per seed.

    Returns:
        ``len(seeds) * num_envs`` seeds.
    """
    if num_envs < 1:
        raise ValueError(f"block_seeds: num_envs={num_envs}; expected >= 1 sub-env per seed.")
    return [int(s) + j for s in seeds for j in range(num_envs)]


def seed_sub_envs(env, sub_seeds: Sequence[int]) -> None:
    """Seed each sub-env of ``env`` (the next reset starts from these seeds).

    Args:
        env: a batched env (possibly transformed) whose base env offers
            ``set_sub_env_seeds`` (e.g. :class:`~tdrl.core.envs.GymEnv` over a vector env).
        sub_seeds: one seed per sub-env (e.g. from :func:`block_seeds`).
    """
    base = env
    while not hasattr(base, "set_sub_env_seeds") and hasattr(base, "base_env") and base.base_env is not base:
        base = base.base_env
    if not hasattr(base, "set_sub_env_seeds"):
        raise TypeError(f"seed_sub_envs: {type(base).__name__} cannot seed its sub-envs one by one, so seed "
                        "blocks cannot reproduce single-seed runs; use a Gymnasium task (GymEnv) or run the "
                        "seeds one after another.")
    if len(sub_seeds) != env.batch_size.numel():
        raise ValueError(f"seed_sub_envs: {len(sub_seeds)} seeds for {env.batch_size.numel()} sub-envs.")
    base.set_sub_env_seeds([int(s) for s in sub_seeds])


def seed_of_env(env_index: int, n_envs: int) -> int:
    """The seed block (0-based) of seed-major sub-env ``env_index`` with ``n_envs`` per seed."""
    return int(env_index) // n_envs


def per_seed(x: Tensor | TensorDictBase, n_seeds: int) -> Tensor | TensorDictBase:
    """``[n_seeds * N, ...]`` seed-major -> ``[n_seeds, N, ...]`` (a view where possible)."""
    if x.shape[0] % n_seeds:
        raise ValueError(f"per_seed: leading dim {x.shape[0]} is not a multiple of n_seeds={n_seeds}.")
    return x.reshape(n_seeds, x.shape[0] // n_seeds, *x.shape[1:])


def normalize_per_seed(adv: Tensor, n_seeds: int, eps: float = 1e-8) -> Tensor:
    """Standardise ``adv`` (``[n_seeds * N, ...]``, seed-major) within each seed's block,
    as :class:`~tdrl.core.objectives.PPOLoss`'s ``normalize_advantage`` does over one
    seed's batch (``(a - mean) / std.clamp_min(eps)``, unbiased std).

    Returns:
        A tensor of ``adv``'s shape.
    """
    blocks = per_seed(adv, n_seeds).reshape(n_seeds, -1)
    if blocks.shape[1] < 2:
        return adv
    out = (blocks - blocks.mean(1, keepdim=True)) / blocks.std(1, keepdim=True).clamp_min(eps)
    return out.reshape(adv.shape)


class StackedTemperature(EntropyTemperature):
    """One SAC temperature per seed (``log_alpha`` ``[n_seeds]``), seed ``k``'s acting on the
    ``k``-th of ``n_seeds`` equal blocks of rows; what :func:`stack_losses` makes of the seeds'
    :class:`~tdrl.core.objectives.EntropyTemperature` s, so the loss itself never sees seeds."""

    @classmethod
    def stack(cls, temps: Sequence[EntropyTemperature]) -> "StackedTemperature":
        """The seeds' temperatures (same settings, their current values) as one."""
        first = temps[0]
        out = cls(1.0, first.target_entropy, first.fixed)
        out.min_log, out.max_log = first.min_log, first.max_log
        log_alpha = torch.stack([t.log_alpha.detach().reshape(()) for t in temps]).clone()
        if first.fixed:
            out.log_alpha = log_alpha
        else:
            out.log_alpha = nn.Parameter(log_alpha)
        return out

    def _rows(self, value: Tensor, like: Tensor) -> Tensor:
        """``value`` ``[n_seeds]`` on the seed-major blocks of ``like``'s leading dim."""
        n = value.shape[0]
        if like.ndim == 0 or like.shape[0] % n:
            raise ValueError(f"StackedTemperature: {n} seeds' temperatures, but the batch's leading dim "
                             f"{tuple(like.shape)[:1]} is not n_seeds seed-major blocks.")
        return value.repeat_interleave(like.shape[0] // n).reshape(-1, *([1] * (like.ndim - 1)))

    def alpha_for(self, like: Tensor) -> Tensor:
        """Each seed's detached alpha on its block of rows of ``like``."""
        return self._rows(self.alpha, like)

    def loss(self, log_prob: Tensor) -> Tensor | None:
        """The mean over seeds of each seed's temperature loss on its block of rows."""
        if self.fixed:
            return None
        return -(self._rows(self.log_alpha, log_prob) * (log_prob.detach() + self.target_entropy)).mean()


class SeedAxis:
    """Everything seed-shaped in one run; a single seed is a stack of one.

    purejaxrl vmaps ``make_train`` over seeds; a torch run steps Python envs, so instead the
    seeds become a leading dimension that this object owns, and an app or a loss written
    against it reads the same for one seed and for several:

    * networks: :meth:`build` / :meth:`build_loss` call a function of the seed once per seed
      under ``torch.manual_seed(seed)`` and stack the results (:func:`stack_seeds`,
      :func:`stack_losses`);
    * envs: one env of ``len(seeds)`` seed-major blocks of ``envs_per_seed`` sub-envs, block
      ``k`` seeded as a single run of ``seeds[k]`` seeds its envs (:meth:`seed_envs`, also after
      a resume and for evaluation, with an ``offset`` added to every seed);
    * batches: seed-major rows ``[n * R, ...]``; :meth:`split` views them ``[n, R, ...]``,
      :meth:`minibatches` takes the same positions of every seed's block, :meth:`normalize`
      standardises within each block, :meth:`backward` scales a mean loss so that each seed
      gets the gradient of its own mean, :meth:`clip_grad_norm_` clips each seed alone;
    * replay: :meth:`to_replay` / :meth:`from_replay` store item ``i`` as every seed's ``i``-th
      transition, so each seed samples only its own data;
    * metrics and evaluation: :meth:`episode_returns`, :meth:`metrics` (the mean over seeds
      and ``name/seed_<s>``), :meth:`evaluate` (one block of episodes per seed).

    One seed keeps the plain networks (a stack of one would run every layer as a batched
    matmul and clip with another reduction: not bit-identical to a single run, and slower),
    torch's ``clip_grad_norm_``, the env's own ``set_seed`` (which a torch env with one
    generator also offers), unsuffixed metric names and a single run's checkpoint names.
    That choice is :attr:`stacked`, made here once; callers never branch on the seed count.

    Args:
        seeds: the run seeds (distinct; one block each).
        envs_per_seed: sub-envs of the training env per seed.
    """

    def __init__(self, seeds: Sequence[int], envs_per_seed: int = 1) -> None:
        self.seeds = [int(s) for s in seeds]
        if not self.seeds:
            raise ValueError("SeedAxis needs at least one seed.")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"SeedAxis: seeds {self.seeds} repeat a seed; each seed is its own run.")
        if envs_per_seed < 1:
            raise ValueError(f"SeedAxis: envs_per_seed={envs_per_seed}; expected >= 1.")
        self.n, self.envs_per_seed = len(self.seeds), int(envs_per_seed)
        self.stacked = self.n > 1

    @classmethod
    def blocks(cls, n_seeds: int) -> "SeedAxis":
        """An axis of ``n_seeds`` blocks labelled ``0 .. n_seeds - 1``, for a loop that knows the
        count only (e.g. the MARL loops; the seeds' values and env seeding live with the caller)."""
        if n_seeds < 1:
            raise ValueError(f"n_seeds must be >= 1, got {n_seeds}.")
        return cls(range(n_seeds))

    @classmethod
    def of(cls, seeds: "SeedAxis | int") -> "SeedAxis":
        """``seeds`` itself, or :meth:`blocks` of a seed count (what a loop's ``n_seeds=`` takes)."""
        return seeds if isinstance(seeds, SeedAxis) else cls.blocks(int(seeds))

    def __len__(self) -> int:
        return self.n

    def __repr__(self) -> str:
        return f"SeedAxis(seeds={self.seeds}, envs_per_seed={self.envs_per_seed})"

    @property
    def num_envs(self) -> int:
        """Sub-envs of the training env: ``envs_per_seed`` per seed."""
        return self.n * self.envs_per_seed

    def refuse_shared(self, what: str, shared: bool, fix: str = "turn it off") -> None:
        """Raise :class:`~tdrl.core.train.ConfigError` when ``shared`` and several seeds would
        share ``what`` (running statistics, one generator), which would make them one run."""
        if shared and self.stacked:
            from tdrl.core.train.config import ConfigError

            raise ConfigError(f"{what} would be shared by the {self.n} seeds trained as one model, so they would "
                              f"not be independent runs; {fix}, or run the seeds one after another (-m seed=0,1,2).")

    def check_blocks(self, numel: int, what: str) -> int:
        """Sub-envs (or rows) per seed of ``numel`` seed-major ones; refuses a count that does
        not split into one equal block per seed."""
        if numel % self.n:
            raise ValueError(f"The {what}'s {numel} sub-envs do not split into n_seeds={self.n} blocks.")
        return numel // self.n

    def check_stacked(self, module: nn.Module, where: str) -> None:
        """Refuse ``module`` unless its seed-stacked networks hold exactly this axis's seeds (a
        single seed: plain networks, none stacked)."""
        found = stacked_seed_counts(module)
        if not self.stacked and found:
            raise ValueError(f"{where} has networks stacked over {sorted(found)} seeds; pass n_seeds to "
                             "train_on_policy / train_off_policy.")
        if self.stacked and found != {self.n}:
            raise ValueError(f"n_seeds={self.n}, but {where} has networks stacked over {sorted(found) or 'no'} "
                             "seeds; build the parts with make_vectorised_groups(..., seeds) with "
                             "len(seeds) == n_seeds.")

    # ------------------------------------------------------------------ networks
    def build(self, build: Callable[[int], Any]) -> Any:
        """``build(seed)`` once per seed under ``torch.manual_seed(seed)``, stacked over the
        seeds (:func:`build_seeds`); a single seed's networks as built."""
        built = build_seeds(build, self.seeds, stack=False)
        return stack_seeds(built) if self.stacked else built[0]

    def build_loss(self, build: Callable[[int], nn.Module]) -> nn.Module:
        """A loss per seed from ``build(seed)`` (as :meth:`build`), joined by :func:`stack_losses`."""
        built = build_seeds(build, self.seeds, stack=False)
        return stack_losses(built) if self.stacked else built[0]

    # ------------------------------------------------------------------ envs
    def env_seeds(self, offset: int = 0, envs_per_seed: int | None = None) -> list[int]:
        """Per-sub-env seeds of a seed-major env (:func:`block_seeds` of ``seed + offset``)."""
        return block_seeds([s + offset for s in self.seeds], envs_per_seed or self.envs_per_seed)

    def seed_envs(self, env, offset: int = 0, envs_per_seed: int | None = None) -> None:
        """Seed ``env``'s next reset: block ``k`` as a single run of ``seeds[k] + offset``
        (one block: the env's own ``set_seed``, which gives sub-env ``j`` the same ``seed + j``
        and which a torch env with one generator offers too)."""
        if self.stacked:
            seed_sub_envs(env, self.env_seeds(offset, envs_per_seed))
        else:
            env.set_seed(self.seeds[0] + offset)

    # ------------------------------------------------------------------ batches
    def split(self, x: Tensor | TensorDictBase) -> Tensor | TensorDictBase:
        """``[n * R, ...]`` seed-major -> ``[n, R, ...]`` (a view where possible)."""
        return per_seed(x, self.n)

    def minibatches(self, flat: TensorDictBase, size: int) -> Iterable[TensorDictBase]:
        """One shuffled pass over a seed-major ``[n * R]`` batch: minibatches of ``size`` rows
        per seed (``[n * size]``, seed-major), the same positions in every seed's block (one
        ``randperm`` of ``R`` for all)."""
        blocks = self.split(flat)
        r = blocks.shape[1]
        perm = torch.randperm(r, device=flat.device)
        for start in range(0, r, size):
            yield blocks[:, perm[start:start + size]].reshape(-1)

    def normalize(self, adv: Tensor, eps: float = 1e-8) -> Tensor:
        """Advantages standardised within each seed's block (:func:`normalize_per_seed`)."""
        return normalize_per_seed(adv, self.n, eps)

    def backward(self, loss: Tensor) -> None:
        """Backpropagate a loss that is a mean over seed-major rows, scaled by the seed count so
        that each seed's slice of the stacked parameters gets the gradient of its own mean."""
        (loss * self.n).backward()

    def clip_grad_norm_(self, params: Iterable[Tensor], max_norm: float) -> Tensor:
        """Clip each seed's gradient norm alone; returns the norms before clipping (``[n]``
        stacked, a scalar for one seed)."""
        if self.stacked:
            return clip_grad_norm_per_seed(params, max_norm, self.n)
        return nn.utils.clip_grad_norm_(params, max_norm)

    def to_replay(self, td: TensorDictBase) -> TensorDictBase:
        """Seed-major transitions ``[n * N]`` -> replay items (:func:`to_seed_items`)."""
        return to_seed_items(td, self.n) if self.stacked else td

    def from_replay(self, sample: TensorDictBase) -> TensorDictBase:
        """A replay sample of :meth:`to_replay` items -> seed-major rows (:func:`from_seed_items`)."""
        return from_seed_items(sample, self.n) if self.stacked else sample

    # ------------------------------------------------------------------ metrics, evaluation
    def episode_returns(self, batch: TensorDictBase) -> list[list[float]]:
        """Returns of the episodes that end in a seed-major batch, per seed (``RewardSum``'s
        ``("next", "episode_reward")`` where ``("next", "done")``)."""
        done, ret = self.split(batch["next", "done"]), self.split(batch["next", "episode_reward"])
        return [ret[k][done[k]].tolist() for k in range(self.n)]

    def names(self, name: str) -> list[str]:
        """The per-seed metric names ``name/seed_<s>`` (none for one seed: its value is the mean)."""
        return [f"{name}/seed_{s}" for s in self.seeds] if self.stacked else []

    def metrics(self, name: str, values: Sequence[float]) -> dict[str, float]:
        """``{name: mean over seeds, name/seed_<s>: value}`` from one value per seed."""
        values = [float(v) for v in values]
        return {name: sum(values) / len(values), **dict(zip(self.names(name), values))}

    def seed_values(self, name: str, values: Sequence[float]) -> dict:
        """``{<name>_seeds: values}``, one value per seed (none for one seed: the plain entry holds it)."""
        return {f"{name}_seeds": list(values)} if self.stacked else {}

    def summary(self, name: str, values: Sequence[float]) -> dict:
        """Summary entries of per-seed results: ``seeds`` and ``<name>_seeds`` (none for one seed)."""
        return {"seeds": self.seeds, **self.seed_values(name, values)} if self.stacked else {}

    def state(self, name: str, objects: Sequence[Any]) -> dict[str, Any]:
        """Checkpoint entries of per-seed objects: ``name_<k>`` (``name`` for one seed)."""
        return {f"{name}_{k}": o for k, o in enumerate(objects)} if self.stacked else {name: objects[0]}

    def evaluate(self, make_env: Callable[[int], Any], policy, episodes: int, offset: int) -> list[float]:
        """The deterministic policy's mean return per seed: ``make_env(n * episodes)`` holds one
        block of ``episodes`` sub-envs per seed, block ``k`` seeded as ``seeds[k] + offset``'s
        single run (:func:`~tdrl.core.train.evaluate_per_env`; the env is closed)."""
        n_env = self.n * episodes
        env = make_env(n_env)
        self.seed_envs(env, offset, episodes)
        per_env = evaluate_per_env(env, policy, n_env, None)
        return self.split(per_env).mean(1).tolist()
