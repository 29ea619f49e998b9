"""The Collector's specialised loop for one plain Gymnasium env and a plain policy module.

With one Pendulum-sized env a frame costs ~100-180 us (policy + simulator), so every
generic step of the collector (``EnvBase.step``, a TensorDict per step and per ``"next"``,
the policy's dispatch, the preset / flag checks) weighs a lot. When the setup is the
simplest one (a :class:`~tdrl.core.envs.GymWrapper` of one env or of a vector env, array
observations on the CPU, no info keys, no action checks; a plain ``TensorDictModule`` with
string keys and one out-key; no random frames, no ``max_frames_per_traj``), this loop does
the same work on plain ``{key: tensor}`` dicts: it calls the wrapped module on the in-keys
(what the ``TensorDictModule`` does), steps the Gymnasium env through the wrapper's own
step implementation and stacks the dicts once at the end. Resets go through the
collector's generic code. The batch is the one the generic loop returns (same keys, key
order, values and trajectory ids; tested).
"""

from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase

from ..envs import EnvBase, GymWrapper
from ..keys import ACTION, NEXT

__all__ = ["plan_gym_loop", "run_gym_loop"]


def plan_gym_loop(collector, td: TensorDictBase) -> tuple | None:
    """The plan ``(module, in_keys, out_key, step_source)`` when ``collector`` can use
    :func:`run_gym_loop` from the root ``td``, else ``None`` (the generic loop runs).

    ``module`` is the policy's wrapped ``nn.Module``, ``out_key`` is ``"action"`` and
    ``step_source`` the env's dict-returning step implementation."""
    from tensordict.nn import TensorDictModule

    env, policy = collector.env, collector.policy
    if (not isinstance(env, GymWrapper) or env.check_actions
            or type(env).step is not EnvBase.step or type(env)._step is not GymWrapper._step
            or getattr(env._step_impl, "__func__", None) not in _SLAB_STEPS
            or env._info_reader is not None or list(env.reward_keys) != ["reward"]):
        return None
    if (type(policy) is not TensorDictModule or not isinstance(policy.module, torch.nn.Module)
            or collector._call is policy or collector.policy_device != env.device):
        return None
    in_keys, out_keys = list(policy.in_keys), list(policy.out_keys)
    if (len(out_keys) != 1 or not all(isinstance(k, str) for k in in_keys + out_keys)
            or out_keys[0] != ACTION):
        return None
    if (type(td) is not TensorDict or td.is_locked or td.device != env.device
            or NEXT in td._tensordict or any(k not in td._tensordict for k in in_keys)
            or not all(isinstance(v, torch.Tensor) for v in td._tensordict.values())):
        return None
    step_source = (env._step_slab_source if env._step_impl.__func__ is GymWrapper._step_slab
                   else env._step_vector_slab_source)
    return policy.module, in_keys, out_keys[0], step_source


_SLAB_STEPS = (GymWrapper._step_slab, GymWrapper._step_vector_slab)


def run_gym_loop(collector, td: TensorDict, steps: int, plan: tuple) -> tuple[TensorDict, list]:
    """Run ``steps`` env steps from the root ``td`` (a plan of :func:`plan_gym_loop`).

    Returns:
        ``(batch, traj_ids)``: the batch ``(*env_batch, steps)`` without trajectory ids,
        and the per-step trajectory-id tensors ``env_batch``. ``collector._td`` is the new
        root.
    """
    module, in_keys, out_key, step_source = plan
    env = collector.env
    gym_step, act_conv = env._env.step, env._act_conv
    batch_size, device = env.batch_size, env.device
    nb = len(batch_size)
    make_root, next_root = collector._make_root, collector._next_root
    tensor = torch.Tensor
    roots, nexts, ids = [], [], []
    root = td._tensordict  # the root's own dict: the policy writes into it, as in the loop
    for _ in range(steps):
        out = module(*[root[k] for k in in_keys])
        if type(out) is tuple:
            out = out[0]
        if type(out) is tensor and out.device == device and out.shape[:nb] == batch_size:
            root[out_key] = out
        else:  # what the TensorDict does with it (casts, device moves, errors)
            holder = make_root(root)
            holder.set(out_key, out)
            root = holder._tensordict
        src = step_source(gym_step(act_conv(root[ACTION])))
        roots.append(root)
        nexts.append(src)
        ids.append(collector._traj_ids)
        if env._last_any_done:  # the generic reset path (new trajectory ids)
            reset = next_root(make_root(src))
            root = reset._tensordict if type(reset) is TensorDict else dict(reset.items())
        else:
            root = {k: v for k, v in src.items() if k != "reward"}
    collector._td = make_root(root)
    return _stack_dicts(roots, nexts, make_root, nb), ids


def _stack_dicts(roots: list, nexts: list, make_root, dim: int) -> TensorDict:
    """Stack per-step root and ``"next"`` dicts into one TensorDict ``(*env_batch, T)``."""
    n_root, n_next = len(roots[0]), len(nexts[0])
    try:
        if any(len(r) != n_root for r in roots) or any(len(n) != n_next for n in nexts):
            raise KeyError
        nxt = {k: torch.stack([n[k] for n in nexts], dim) for k in nexts[0]}
        source = {k: torch.stack([r[k] for r in roots], dim) for k in roots[0]}
    except (KeyError, RuntimeError, TypeError):
        # keys differ between steps: the generic per-step TensorDicts and their stack
        from .single import _stack_steps

        steps = []
        for r, n in zip(roots, nexts):
            step = make_root(r)
            step.set(NEXT, make_root(n))
            steps.append(step)
        return _stack_steps(steps, dim)
    proto = make_root({})
    size = list(proto.batch_size)
    size.insert(dim, len(roots))
    size, device = torch.Size(size), proto.device
    source[NEXT] = TensorDict._new_unsafe(nxt, batch_size=size, device=device)
    return TensorDict._new_unsafe(source, batch_size=size, device=device)
