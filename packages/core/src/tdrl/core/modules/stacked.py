"""Copies of one architecture stacked along a leading member dim and run in one batched call.

:class:`SeedStackedModule` holds ``n`` modules' parameters as ``[n, *shape]`` tensors and
evaluates member ``k`` on the ``k``-th block of a member-major batch: one ``baddbmm`` per layer
of a plain MLP, the module's own ``seed_stacked_forward`` when its class has one, ``vmap`` over
``functional_call`` otherwise. Used for seeds trained as one model (:mod:`tdrl.core.train.seeds`)
and for ensembles of critics (:class:`~tdrl.core.objectives.redq.CriticEnsemble`).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.func import functional_call, stack_module_state, vmap

__all__ = ["SeedStackedModule"]


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


def _trailing(module: nn.Module) -> bool:
    """Whether ``module`` holds no state and acts on trailing dims only (so it runs unchanged on
    ``[n_seeds, N, ...]``): an element-wise activation, a ``NormalParamExtractor``, or a flatten
    of negative dims."""
    from tensordict.nn import NormalParamExtractor

    if type(module) is nn.Flatten:
        return module.start_dim < 0 and module.end_dim < 0
    return type(module) in _ELEMENTWISE or type(module) is NormalParamExtractor


def _chain_plan(module: nn.Module, prefix: str = "") -> list[tuple] | None:
    """The steps of an ``nn.Sequential`` whose members each have a ``seed_stacked_forward``
    (``("own", prefix, member)``) or hold no state and act on trailing dims (``("plain", member)``,
    :func:`_trailing`),
    nested sequences flattened; None for anything else, or when no member has its own path."""
    if type(module) is not nn.Sequential:
        return None
    plan: list[tuple] = []
    for i, child in enumerate(module):
        name = f"{prefix}{i}."
        if getattr(type(child), "seed_stacked_forward", None) is not None:
            plan.append(("own", name, i))
        elif _trailing(child):
            plan.append(("plain", child))
        elif (inner := _chain_plan(child, name)) is not None:
            plan.append(("nested", i, inner))
        else:
            return None
    return plan if any(step[0] != "plain" for step in plan) else None


def _run_chain(plan: list[tuple], base: nn.Module, state: dict[str, Tensor], xs: tuple) -> Tensor | tuple:
    """Run a :func:`_chain_plan` on ``[n_seeds, N, ...]`` inputs (``state``: the stacked
    parameters and buffers under the sequence's names)."""
    for step in plan:
        if step[0] == "plain":
            out = step[1](*xs)
        elif step[0] == "own":
            member, prefix = base[step[2]], step[1]
            sub = {n[len(prefix):]: t for n, t in state.items() if n.startswith(prefix)}
            out = type(member).seed_stacked_forward(member, sub, *xs)
        else:
            out = _run_chain(step[2], base[step[1]], state, xs)
        xs = out if isinstance(out, tuple) else (out,)
    return xs if len(xs) > 1 else xs[0]


class SeedStackedModule(nn.Module):
    """``n_seeds`` copies of one architecture evaluated in one batched call.

    Args:
        modules: one module per seed, same architecture (their current weights are stacked).

    Shapes: input ``[n_seeds * N, ...]`` (seed-major) -> output ``[n_seeds * N, ...]``.
    Parameters are ``[n_seeds, *shape]`` (``stacked_params``), so an optimiser over them
    updates every seed at once. A plain MLP (linear layers and element-wise activations) runs
    as one ``baddbmm`` per layer; a module whose class defines
    ``seed_stacked_forward(params, *xs)`` (``params``: ``{name: [n_seeds, *shape]}`` under its
    own parameter and buffer names, inputs and outputs ``[n_seeds, N, ...]``; e.g. ``tdrl.marl``'s
    ``MultiAgentMLP`` and ``QMixer``) runs that batched path, and so does an ``nn.Sequential`` of
    such modules and parameter-free trailing-dim ones (a flatten, an activation, a
    ``NormalParamExtractor``: the actor heads of ``tdrl.marl``); any other module through ``vmap``
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
        self._stacked_forward = getattr(type(modules[0]), "seed_stacked_forward", None)
        self._chain = _chain_plan(modules[0]) if self._stacked_forward is None and self._plan is None else None

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
            out = self._stacked_forward(base, {**params, **buffers}, *split)
            return tuple(merge(y) for y in out) if isinstance(out, tuple) else merge(out)
        if self._chain is not None:  # a sequence of such modules and parameter-free steps
            out = _run_chain(self._chain, base, {**params, **buffers}, split)
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
