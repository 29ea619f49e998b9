"""Several seeds of one training run as one vectorised model (purejaxrl's ``vmap`` over seeds).

purejaxrl writes ``make_train(config)`` -> a pure function of the seed, and ``vmap`` runs
every seed at once. A torch run steps Python envs, so the whole loop cannot be vmapped; what
is vectorised here is everything a seed owns:

* networks: :func:`build_seeds` calls a function of the seed once per seed (under
  ``torch.manual_seed(seed)``, so each seed's initial weights equal a single-seed run's) and
  stacks the results (:func:`stack_seeds`): every parameter gets a leading seed dim and the
  network is evaluated with ``torch.func.vmap`` over ``functional_call``
  (:class:`SeedStackedModule`). One optimiser over the stacked parameters serves every seed:
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
advantage normalisation) must be made per seed or refused by the caller.

Used by :mod:`tdrl.marl.vectorised` (MAPPO/IPPO, QMIX/VDN), ``apps/ppo`` and ``apps/sac`` (``n_seeds=``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule
from torch import Tensor, nn
from torch.func import functional_call, stack_module_state, vmap

__all__ = [
    "SeedStackedModule",
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


_ELEMENTWISE = (nn.Tanh, nn.ReLU, nn.ELU, nn.SiLU, nn.GELU, nn.LeakyReLU, nn.Sigmoid, nn.Softplus, nn.Mish,
                nn.Identity)


def _linear_plan(module: nn.Module, prefix: str = "") -> list[tuple] | None:
    """The layers of a plain MLP (``nn.Sequential`` / ``tdrl.core.modules.MLP`` of ``nn.Linear``
    and element-wise activations, nested ones flattened, optionally ending in a
    ``NormalParamExtractor``) for the batched-matmul path; None for anything else."""
    from tensordict.nn import NormalParamExtractor

    from tdrl.core.modules.models import MLP

    if type(module) not in (nn.Sequential, MLP):
        return None
    if prefix and type(module) is MLP and len(module.out_shape) > 1:  # a reshape inside: not flat
        return None
    plan: list[tuple] = []
    children = list(module)
    for i, child in enumerate(children):
        if plan and plan[-1][0] == "split":  # a NormalParamExtractor ends the plan
            return None
        if type(child) is nn.Linear:
            plan.append(("linear", f"{prefix}{i}.weight", f"{prefix}{i}.bias" if child.bias is not None else None))
        elif type(child) in _ELEMENTWISE:
            plan.append(("act", child))
        elif type(child) is NormalParamExtractor and i == len(children) - 1:
            plan.append(("split", child))
        elif (inner := _linear_plan(child, f"{prefix}{i}.")) is not None:
            plan.extend(inner)
        else:
            return None
    return plan


class SeedStackedModule(nn.Module):
    """``n_seeds`` copies of one architecture evaluated in one batched call.

    Args:
        modules: one module per seed, same architecture (their current weights are stacked).

    Shapes: input ``[n_seeds * N, ...]`` (seed-major) -> output ``[n_seeds * N, ...]``.
    Parameters are ``[n_seeds, *shape]`` (``stacked_params``), so an optimiser over them
    updates every seed at once. A plain MLP (linear layers and element-wise activations) runs
    as one ``baddbmm`` per layer; a module whose class defines
    ``seed_stacked_forward(params, *xs)`` (``params``: ``{name: [n_seeds, *shape]}`` under its
    own parameter names, inputs and outputs ``[n_seeds, N, ...]``; e.g. ``tdrl.marl``'s
    ``MultiAgentMLP`` and ``QMixer``) runs that batched path; any other module through ``vmap``
    over ``functional_call`` (the same result, with more per-call overhead: ~2.5 ms a call on
    this CPU). The stacked copies need not be seeds: REDQ's critic ensemble
    (:class:`~tdrl.core.objectives.redq.CriticEnsemble`) stacks its critics, runs a subset of
    them with ``forward(..., index=)`` and joins seeds' ensembles with :meth:`concat`.
    """

    def __init__(self, modules: Sequence[nn.Module]) -> None:
        super().__init__()
        if not modules:
            raise ValueError("SeedStackedModule needs at least one module (one per seed).")
        self.n_seeds = len(modules)
        params, buffers = stack_module_state(list(modules))
        self._names = list(params)
        self.stacked_params = nn.ParameterList([nn.Parameter(params[n].detach().clone()) for n in self._names])
        self._buffer_names = list(buffers)
        for i, n in enumerate(self._buffer_names):
            self.register_buffer(f"_stacked_buffer_{i}", buffers[n].clone())
        self._base = [copy.deepcopy(modules[0]).to("meta")]  # a list: not a registered submodule
        self._plan = _linear_plan(modules[0]) if not self._buffer_names else None
        self._stacked_forward = (getattr(type(modules[0]), "seed_stacked_forward", None)
                                 if not self._buffer_names else None)

    def _state(self) -> tuple[dict, dict]:
        params = dict(zip(self._names, self.stacked_params))
        buffers = {n: getattr(self, f"_stacked_buffer_{i}") for i, n in enumerate(self._buffer_names)}
        return params, buffers

    def stacked(self) -> dict[str, Tensor]:
        """The stacked parameters ``{name: [n_seeds, *shape]}`` under the single module's names
        (the live parameters: writes and gradients reach the module)."""
        return dict(zip(self._names, self.stacked_params))

    def seed_state(self, k: int) -> dict[str, Tensor]:
        """Seed ``k``'s parameters and buffers under the single module's names (a state dict)."""
        params, buffers = self._state()
        return {n: t[k].detach() for n, t in {**params, **buffers}.items()}

    @classmethod
    def concat(cls, stacks: Sequence["SeedStackedModule"]) -> "SeedStackedModule":
        """One stacked module whose members are those of ``stacks``, in order (e.g. each seed's
        ensemble of critics: member ``k * n + i`` is critic ``i`` of seed ``k``)."""
        first = stacks[0]
        if any(type(m) is not cls or m._names != first._names for m in stacks):
            raise TypeError("SeedStackedModule.concat: every part must be a SeedStackedModule of one architecture.")
        out = copy.deepcopy(first)
        out.n_seeds = sum(m.n_seeds for m in stacks)
        out.stacked_params = nn.ParameterList([
            nn.Parameter(torch.cat([m.stacked_params[i].detach() for m in stacks]),
                         requires_grad=first.stacked_params[i].requires_grad)
            for i in range(len(first._names))])
        for i in range(len(first._buffer_names)):
            setattr(out, f"_stacked_buffer_{i}", torch.cat([getattr(m, f"_stacked_buffer_{i}") for m in stacks]))
        return out

    def forward(self, *xs: Tensor, index: Tensor | None = None, detach: bool = False):
        """Inputs ``[n * R, ...]`` in ``n`` member-major blocks -> outputs ``[n * R, ...]``.

        Args:
            xs: the inputs (block ``k`` goes to member ``k``).
            index: optional member indices ``[n]`` (repeats allowed): only those members run,
                block ``j`` through member ``index[j]`` (``n = n_seeds`` without it).
            detach: run with detached parameters (gradients reach the inputs only).
        """
        params, buffers = self._state()
        if index is not None:
            params = {n: t[index] for n, t in params.items()}
            buffers = {n: t[index] for n, t in buffers.items()}
        if detach:
            params = {n: t.detach() for n, t in params.items()}
        s = self.n_seeds if index is None else int(index.numel())
        if xs[0].shape[0] % s:
            raise ValueError(f"SeedStackedModule: leading dim {xs[0].shape[0]} is not a multiple of n_seeds={s} "
                             "(inputs must be n_seeds seed-major blocks, one per stacked member).")
        if self._plan is not None:
            return self._forward_linear(xs, params, s)
        split = tuple(x.reshape(s, x.shape[0] // s, *x.shape[1:]) for x in xs)
        base = self._base[0]
        merge = lambda y: y.reshape(s * y.shape[1], *y.shape[2:])  # noqa: E731
        if self._stacked_forward is not None:  # the module's own batched path over the seed dim
            out = self._stacked_forward(base, params, *split)
            return tuple(merge(y) for y in out) if isinstance(out, tuple) else merge(out)

        def one(params, buffers, *inp):
            return functional_call(base, (params, buffers), inp)

        out = vmap(one)(params, buffers, *split)
        return tuple(merge(y) for y in out) if isinstance(out, tuple) else merge(out)

    def _forward_linear(self, xs: tuple[Tensor, ...], params: dict[str, Tensor],
                        n: int) -> Tensor | tuple[Tensor, ...]:
        """The MLP path: ``[n, rows, features]`` through one ``baddbmm`` per layer."""
        x = xs[0] if len(xs) == 1 else torch.cat(xs, dim=-1)
        lead = x.shape[:-1]
        x = x.reshape(n, -1, x.shape[-1])
        for step in self._plan:
            if step[0] == "act":
                x = step[1](x)
                continue
            if step[0] == "split":  # NormalParamExtractor: (loc, scale), row-wise
                return tuple(y.reshape(*lead, y.shape[-1]) for y in step[1](x))
            w = params[step[1]].transpose(1, 2)
            x = torch.bmm(x, w) if step[2] is None else torch.baddbmm(params[step[2]].unsqueeze(1), x, w)
        out = x.reshape(*lead, x.shape[-1])
        out_shape = getattr(self._base[0], "out_shape", ())
        return out.reshape(*out.shape[:-1], *out_shape) if len(out_shape) > 1 else out


def _stack_one(modules: Sequence[nn.Module]) -> nn.Module:
    """Stack one network over seeds: the inner nets of TensorDict modules, keeping their keys."""
    first = modules[0]
    if any(type(m) is not type(first) for m in modules):
        raise TypeError(f"stack_seeds: the seeds built different types {sorted({type(m).__name__ for m in modules})}; "
                        "a function of the seed must build the same architecture for every seed.")
    # the innermost TensorDict modules that hold parameters (a sequence's members, not the sequence)
    tdmods = [n for n, m in first.named_modules() if isinstance(m, TensorDictModule)
              and not any(isinstance(x, TensorDictModule) for x in m.module.modules())
              and any(True for _ in m.module.parameters())]
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
            structure for every seed). In a TensorDict module (an actor, a value operator) the
            inner networks are stacked and the keys and distribution heads kept.

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
    target and stay frozen. A child class may stack itself: a classmethod
    ``stack_seeds(modules)`` is used when present (e.g.
    :class:`~tdrl.core.objectives.EntropyTemperature`: one temperature per seed).

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
        hook = getattr(type(child), "stack_seeds", None)
        if hook is not None:
            setattr(out, name, hook(parts))
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
