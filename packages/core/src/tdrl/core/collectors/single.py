"""The single-process collector: an env (single or batched) + a policy -> batches of steps.

Iterating a :class:`Collector` yields TensorDicts of shape ``(*env_batch, T)`` (time last)
with the data-contract keys (root: observations, ``"action"``, policy outputs, done flags;
``"next"``: observations, ``"reward"``, done flags) plus ``("collector", "traj_ids")``, an
id per step that is unique per episode. The env state, including any recurrent state the
policy writes under ``"next"``, carries over from one batch to the next.
"""

from __future__ import annotations

import copy
import logging
from contextlib import nullcontext
from collections.abc import Callable

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import InteractionType, set_interaction_type

from ..envs import EnvBase
from ..envs._fastpath import paused_gc
from ..td_access import entries, get_entry, new_td, plain_td_maker
from ..keys import DONE, NEXT, TRAJ_ID, TRUNCATED
from .random_frames import PolicyTemplate, materialize_lazy
from .contract import BatchCollector
from .utils import compact_batch
from tdrl.core.torchrl_names import accept_torchrl_names

__all__ = ["Collector", "as_interaction_type"]

_log = logging.getLogger(__name__)
_RESET = "_reset"


def as_interaction_type(mode: InteractionType | str | None) -> InteractionType:
    """``InteractionType`` from an enum member or its name (``"random"``, ``"deterministic"``,
    ``"mode"``, ``"mean"``); ``None`` means ``RANDOM``."""
    if mode is None:
        return InteractionType.RANDOM
    if isinstance(mode, InteractionType):
        return mode
    try:
        return InteractionType[str(mode).upper()]
    except KeyError:
        names = [m.name.lower() for m in InteractionType]
        raise ValueError(f"Unknown exploration_type {mode!r}; expected one of {names}.") from None


def _module_params(policy) -> TensorDictBase | None:
    if isinstance(policy, torch.nn.Module):
        return TensorDict.from_module(policy)
    return None


def _fast_call(policy):
    """A faster equivalent of a plain ``TensorDictModule`` (exact type, plain keys).

    ``TensorDictModule.__call__`` spends tens of microseconds per call on dispatch; per
    env step that is a large share of a small policy's cost. The shortcut reads the
    in-keys, calls the wrapped module and writes the out-keys, which is what such a
    module does. Anything else (subclasses, sequences, probabilistic modules) is called
    as is.
    """
    from tensordict.nn import TensorDictModule

    if type(policy) is not TensorDictModule or not isinstance(policy.module, torch.nn.Module):
        return policy
    in_keys, out_keys, module = list(policy.in_keys), list(policy.out_keys), policy.module
    if not out_keys or any(not isinstance(k, (str, tuple)) for k in in_keys + out_keys):
        return policy
    single = len(out_keys) == 1
    key0 = out_keys[0]
    flat = all(isinstance(k, str) for k in in_keys + out_keys)

    def call(td: TensorDictBase) -> TensorDictBase:
        if flat and type(td) is TensorDict:
            # plain keys of a plain TensorDict: read and write its dict directly; the
            # output's leading dims are checked against the batch size (cheap)
            items = entries(td)
            try:
                args = [items[k] for k in in_keys]
            except KeyError:
                args = None  # the generic path below raises the usual error
            if args is not None:
                out = module(*args)
                if single:
                    out = out[0] if isinstance(out, tuple) else out
                    if (isinstance(out, torch.Tensor) and not td.is_locked
                            and out.shape[: td.batch_dims] == td.batch_size
                            and (td.device is None or out.device == td.device)
                            and not hasattr(td, "_consolidated")):
                        items[key0] = out
                        return td
                    td.set(key0, out)
                else:
                    for k, v in zip(out_keys, out):
                        td.set(k, v)
                return td
        args = [td.get(k, None) for k in in_keys]
        if any(a is None for a in args):
            missing = [k for k, a in zip(in_keys, args) if a is None]
            raise KeyError(f"The policy reads {missing}, which the TensorDict does not hold; "
                           f"its keys are {sorted(map(str, td.keys(True, True)))}.")
        out = module(*args)
        if single:
            td.set(key0, out[0] if isinstance(out, tuple) else out)
        else:
            for k, v in zip(out_keys, out):
                td.set(k, v)
        return td

    return call


def _stack_steps(steps: list, dim: int) -> TensorDictBase:
    """``torch.stack(steps, dim)`` for TensorDicts that all share one key structure.

    Reads the leaves straight from each TensorDict, which is several times cheaper per
    step than the generic stack; any mismatch (other keys, lazy TensorDicts) falls back
    to ``torch.stack``.
    """
    first = steps[0]
    try:
        if type(first) is not TensorDict or any(type(td) is not TensorDict for td in steps):
            raise TypeError
        n = len(entries(first))
        if any(len(entries(td)) != n for td in steps):
            raise KeyError
        source = {}
        for key, value in entries(first).items():
            values = [entries(td)[key] for td in steps]
            if isinstance(value, torch.Tensor):
                source[key] = torch.stack(values, dim)
            else:
                source[key] = _stack_steps(values, dim)
        bs = list(first.batch_size)
        bs.insert(dim, len(steps))
        return new_td(source, torch.Size(bs), first.device)
    except (AttributeError, KeyError, TypeError, RuntimeError):
        return torch.stack(steps, dim)


def policy_device(policy) -> torch.device | None:
    if isinstance(policy, torch.nn.Module):
        for p in policy.parameters():
            return p.device
    return None


@accept_torchrl_names
class Collector(BatchCollector):
    """Collects ``frames_per_batch`` env steps per iteration, up to ``total_frames``.

    Args:
        env: an :class:`~tdrl.core.envs.EnvBase`, or a callable returning one (the collector
            then owns the env and closes it in :meth:`shutdown`).
        policy: callable ``td -> td`` writing ``"action"`` (usually a TensorDictModule);
            ``None`` draws random actions from the action spec.
        frames_per_batch: env steps per batch, over all sub-envs. Rounded up to a multiple
            of the number of sub-envs, so a batch has ``T = frames_per_batch / n_envs``.
        total_frames: stop after this many frames (rounded up to whole batches); ``-1``
            never stops.
        init_random_frames: the first frames use random actions from the action spec. Their
            steps carry the keys the policy writes (``action_value``, ``loc`` / ``scale``...)
            as zeros and actions in the policy's dtype, so that a replay buffer takes random
            and policy batches alike: the policy is run once, on a copy, to learn them (see
            :mod:`.random_frames`).
        split_trajs: yield trajectories instead: a zero-padded TensorDict
            ``(num_trajs, max_len)`` with a bool ``("collector", "mask")``.
        exploration_type: interaction type the policy runs under
            (``InteractionType.RANDOM`` samples, ``DETERMINISTIC`` takes the mode/mean).
        device: device the policy runs on. A module on another device is deep-copied
            there; :meth:`update_policy_weights_` then copies the original's weights over.
        storing_device: device of the yielded batches (default: the env's).
        max_frames_per_traj: truncate episodes after this many steps (``truncated`` and
            ``done`` are set, then the sub-env resets); ``None``: the env decides.
        reset_at_each_iter: reset every sub-env at the start of each batch.
        seed: seed of the env (``env.set_seed``); ``None`` leaves it to the env (one never seeded
            draws its seed from torch's default generator at its first reset).
        compact_obs: drop ``("next", <observation keys>)`` (the env's observation spec, listed
            in ``compact_keys``) from the yielded batches, keeping ``("next", "reward")`` and
            the done flags: each observation is held once, not twice (TorchRL's spelling).
            :class:`~tdrl.core.replay.NextStateReconstructor` rebuilds them from the
            trajectory where a consumer needs them.
    """

    # an env with a dict stepper (``EnvBase.dict_stepper``: a GymEnv, also behind the
    # transforms the apps use) runs a loop on plain dicts (``_dict_rollout``; the same
    # batches). False forces the generic loop (tests, A/B timing).
    _dict_loop: bool = True
    # False: leave tensordict's interaction type alone (it is one process-wide global, so
    # threads that enter and leave it concurrently can leave it stuck; an inference server's
    # thread workers, whose policy runs in the server thread, set this)
    _own_interaction: bool = True

    def __init__(
        self,
        env: EnvBase | Callable[[], EnvBase],
        policy: Callable[[TensorDictBase], TensorDictBase] | None = None,
        *,
        frames_per_batch: int,
        total_frames: int = -1,
        init_random_frames: int = 0,
        split_trajs: bool = False,
        exploration_type: InteractionType | str = InteractionType.RANDOM,
        device: torch.device | str | None = None,
        storing_device: torch.device | str | None = None,
        max_frames_per_traj: int | None = None,
        reset_at_each_iter: bool = False,
        seed: int | None = None,
        compact_obs: bool = False,
    ) -> None:
        self._owns_env = not isinstance(env, EnvBase)
        self.env = env if isinstance(env, EnvBase) else env()
        if not isinstance(self.env, EnvBase):
            raise TypeError(f"env must be an EnvBase or a callable returning one, got {type(self.env)}.")
        if frames_per_batch < 1:
            raise ValueError(f"frames_per_batch must be >= 1, got {frames_per_batch}.")
        n_envs = max(1, self.env.batch_size.numel())
        self.steps_per_batch = -(-frames_per_batch // n_envs)
        if self.steps_per_batch * n_envs != frames_per_batch:
            _log.warning("frames_per_batch=%d rounded up to %d (a multiple of %d sub-envs).",
                         frames_per_batch, self.steps_per_batch * n_envs, n_envs)
        self.frames_per_batch = self.steps_per_batch * n_envs
        self.total_frames = int(total_frames)
        if self.total_frames > 0 and self.total_frames % self.frames_per_batch:
            self.total_frames = -(-self.total_frames // self.frames_per_batch) * self.frames_per_batch
        self.init_random_frames = int(init_random_frames)
        self.split_trajs = split_trajs
        self.exploration_type = as_interaction_type(exploration_type)
        # TorchRL's scripts pass -1 for "no limit"
        self.max_frames_per_traj = None if max_frames_per_traj is not None and max_frames_per_traj < 0 else max_frames_per_traj
        self.reset_at_each_iter = reset_at_each_iter
        self.storing_device = torch.device(storing_device) if storing_device else self.env.device
        self.compact_obs = bool(compact_obs)
        # the observation keys dropped from "next" when compact (the env's observation spec)
        self.compact_keys = tuple(self.env.observation_keys) if self.compact_obs else ()
        # what "next" does not store: the compact keys and the env's unstored keys
        # (NextObservationDelta's full next observations, kept as deltas)
        self._unstored = tuple(dict.fromkeys((*self.compact_keys, *self.env.unstored_next_keys)))
        self._set_policy(policy, device)
        if seed is not None:
            self.env.set_seed(seed)
        self.frames = 0
        self._td: TensorDictBase | None = None
        shape = self.env.batch_size
        self._traj_ids = torch.arange(max(1, shape.numel())).reshape(shape)
        self._next_traj_id = max(1, shape.numel())
        self._traj_stride, self._traj_offset = 1, 0  # disjoint id ranges across workers
        self._step_count = torch.zeros((*shape, 1), dtype=torch.long)
        self._reward_keys = set(self.env.step_only_keys)  # not carried into the next root
        self._make_root = plain_td_maker(self.env.batch_size, self.env.device)
        self._closed = False

    # ------------------------------------------------------------------ policy
    def _set_policy(self, policy, device) -> None:
        self._source_policy = policy
        self.policy_device = torch.device(device) if device is not None else None
        current = policy_device(policy)
        if (policy is not None and self.policy_device is not None and current is not None
                and current != self.policy_device):
            policy = copy.deepcopy(policy).to(self.policy_device)
        self.policy = policy
        materialize_lazy(policy, self.env.observation_spec)
        self._call = _fast_call(policy) if policy is not None else None
        self._template: PolicyTemplate | None = None  # what random steps are padded with
        if self.policy_device is None:
            self.policy_device = current or self.env.device

    def update_policy_weights_(self, weights=None) -> None:
        """Copy new weights into the collector's policy, in place.

        Args:
            weights: a module (its parameters and buffers are copied), a state dict, a
                TensorDict of parameters (``TensorDict.from_module``), or ``None`` to copy
                from the policy the collector was built with (needed only when the
                collector runs a copy on another device).
        """
        params = _module_params(self.policy)
        if params is None:
            if weights is None:
                return
            raise TypeError("update_policy_weights_ needs a torch.nn.Module policy.")
        if weights is None:
            if self.policy is self._source_policy:
                return
            weights = self._source_policy
        if isinstance(weights, torch.nn.Module):
            weights = TensorDict.from_module(weights)
        if isinstance(weights, TensorDictBase):
            params.data.update_(weights.data if hasattr(weights, "data") else weights)
        elif isinstance(weights, dict):
            self.policy.load_state_dict(weights)
        else:
            raise TypeError(f"Unsupported weights type {type(weights).__name__}.")

    # ------------------------------------------------------------------ collection
    def set_seed(self, seed: int) -> int:
        """Seed the env; returns the next unused seed."""
        return self.env.set_seed(seed)

    def reset(self) -> None:
        """Reset every sub-env (the next batch starts new episodes)."""
        self._td = None

    def _new_traj_ids(self, done: torch.Tensor) -> None:
        n = int(done.sum())
        fresh = torch.arange(self._next_traj_id, self._next_traj_id + n)
        self._next_traj_id += n
        self._traj_ids = self._traj_ids.masked_scatter(done, fresh)

    def _start(self) -> TensorDictBase:
        td = self.env.reset()
        if self.frames > 0:  # a new episode for every sub-env
            self._new_traj_ids(torch.ones(self._traj_ids.shape, dtype=torch.bool))
        self._step_count.zero_()
        return td

    def next_batch(self) -> TensorDictBase:
        """One batch (the collector contract's step): :meth:`rollout`."""
        return self.rollout()

    def rollout(self) -> TensorDictBase:
        """Collect one batch ``(*env_batch, T)`` (without advancing ``total_frames`` checks)."""
        if self._closed:
            raise RuntimeError("This collector was shut down.")
        env, policy = self.env, self._call
        if self._td is None or self.reset_at_each_iter:
            self._td = self._start()
        td = self._td
        steps, ids = [], []
        random_left = max(0, self.init_random_frames - self.frames)
        n_envs = self.frames_per_batch // self.steps_per_batch
        env_dev, pol_dev = env.device, self.policy_device
        moves = policy is not None and pol_dev != env_dev
        nb = len(env.batch_size)
        max_steps = self.max_frames_per_traj
        plan = None
        if self._dict_loop and not random_left and max_steps is None and policy is not None:
            plan = self._dict_plan(td)
        mode = set_interaction_type(self.exploration_type) if self._own_interaction else nullcontext()
        with mode, torch.no_grad(), paused_gc():
            if plan is not None:  # the env steps on plain dicts
                out, ids = self._dict_rollout(td, self.steps_per_batch, plan)
                td = self._td
            for t in range(self.steps_per_batch if plan is None else 0):
                if policy is None:
                    td = env.rand_action(td)
                elif random_left > t * n_envs:
                    td = self._random_step(td, moves)
                elif moves:
                    out = policy(td.to(pol_dev))
                    td = out.to(env_dev)
                else:
                    td = policy(td)
                preset = get_entry(td, NEXT, None)  # e.g. a recurrent state the policy wrote
                td = env.step(td)
                nxt = get_entry(td, NEXT, None)
                if preset is not None:
                    for key, value in preset.items():
                        if key not in nxt.keys():
                            nxt.set(key, value)
                cut = False
                if max_steps is not None:
                    self._step_count += 1
                    over = self._step_count >= max_steps
                    if bool(over.any()):
                        nxt.set(TRUNCATED, nxt.get(TRUNCATED) | over)
                        nxt.set(DONE, nxt.get(DONE) | over)
                        cut = True
                steps.append(td)
                ids.append(self._traj_ids)
                td = self._next_root(nxt, cut)
            self._td = td
            # stack and drop the per-step TensorDicts before the collector resumes, so
            # that it never walks them
            if plan is None:
                out = _stack_steps(steps, nb)
            del steps
        out.set(TRAJ_ID, torch.stack(ids, nb) * self._traj_stride + self._traj_offset)
        if self._unstored:
            out = compact_batch(out, self._unstored)
        if self.storing_device != out.device:
            out = out.to(self.storing_device)
        self.frames += self.frames_per_batch
        return out

    def _random_step(self, td: TensorDictBase, moves: bool) -> TensorDictBase:
        """Random actions, padded to look like the policy's output (:mod:`.random_frames`)."""
        if self._template is None:
            env_dev, pol_dev = self.env.device, self.policy_device
            self._template = PolicyTemplate(
                self._call, td, list(self.env.action_keys),
                to_policy=(lambda x: x.to(pol_dev)) if moves else (lambda x: x),
                to_env=(lambda x: x.to(env_dev)) if moves else (lambda x: x))
        return self._template.pad(self.env.rand_action(td))

    def _next_root(self, nxt: TensorDictBase, cut: bool = False) -> TensorDictBase:
        """The root of the next step: ``nxt`` without rewards; done sub-envs are reset.

        Args:
            nxt: the ``"next"`` TensorDict of the step just taken.
            cut: the collector changed the done flags (``max_frames_per_traj``), so the
                env's own "any done" answer does not hold.
        """
        rk = self._reward_keys
        root = None
        if type(nxt) is TensorDict:  # flat plain TensorDict: copy its dict, no checks
            source = {k: v for k, v in entries(nxt).items() if k not in rk}
            if not any(isinstance(v, TensorDictBase) for v in source.values()):
                root = self._make_root(source)
        if root is None:  # nested entries: new containers, so the root shares none with nxt
            root = nxt.exclude(*rk)
        done = get_entry(root, DONE)
        # a GymWrapper knows whether any sub-env is done (a Python bool, no tensor op);
        # wrappers that may change the flags (transforms) say None
        hint = None if cut else self.env.last_any_done
        if hint is None:
            hint = done.item() if done.numel() == 1 else bool(done.any())
        if hint:
            root.set(_RESET, done)
            reset = self.env.reset(root)
            # keep what the reset did not produce (e.g. recurrent states under "next")
            for key in root.keys():
                if key != _RESET and key not in reset.keys():
                    reset.set(key, root.get(key))
            if _RESET in reset.keys():
                del reset[_RESET]
            root = reset
            done = done.reshape(self._traj_ids.shape)
            self._new_traj_ids(done)
            if self.max_frames_per_traj is not None:
                self._step_count.masked_fill_(done.reshape(self._step_count.shape), 0)
        return root

    # ------------------------------------------------------------------ dict loop
    def _dict_plan(self, td: TensorDictBase) -> tuple | None:
        """``(stepper, resetter, act)`` when :meth:`_dict_rollout` can run from the root
        ``td``, else ``None`` (the generic loop runs).

        ``stepper`` is the env's :meth:`~tdrl.core.envs.EnvBase.dict_stepper`, ``resetter``
        its :meth:`~tdrl.core.envs.EnvBase.dict_resetter` (``None``: resets take the
        generic path). ``act(root) -> root`` runs the policy on the root's dict: a plain
        ``TensorDictModule`` (string keys, one out-key) calls its ``module`` on the in-keys,
        a policy with a ``dict_call`` (:class:`~tdrl.core.modules.ProbabilisticActor`) runs
        that, any other policy module whose out-keys are plain strings is called on a
        TensorDict."""
        from tensordict.nn import TensorDictModule, TensorDictModuleBase

        env, policy = self.env, self.policy
        if self.policy_device != env.device:
            return None
        if (type(td) is not TensorDict or td.is_locked or td.device != env.device
                or NEXT in td.keys()
                or not all(isinstance(v, torch.Tensor) for v in td.values())):
            return None
        if type(policy) is TensorDictModule and self._call is not policy:  # see _fast_call
            in_keys, out_keys = list(policy.in_keys), list(policy.out_keys)
            if len(out_keys) != 1 or any(k not in td.keys() for k in in_keys):
                return None
            act = self._module_act(policy.module, in_keys, out_keys[0])
        elif isinstance(policy, TensorDictModuleBase):
            out_keys = list(policy.out_keys)
            if not out_keys or not all(isinstance(k, str) and k != NEXT for k in out_keys):
                return None
            dict_call = getattr(policy, "dict_call", None)
            act = None if dict_call is None else dict_call(env.batch_size, env.device)
            if act is None:
                call, make_root = self._call, self._make_root

                def act(root: dict) -> dict:
                    holder = call(make_root(root))
                    return entries(holder)
        else:
            return None
        if any(k not in out_keys for k in env.action_keys):
            return None  # the policy does not write the action: the generic loop says so
        stepper = env.dict_stepper()
        if stepper is None:
            return None
        return stepper, env.dict_resetter(), act

    def _module_act(self, module: Callable, in_keys: list, out_key: str) -> Callable[[dict], dict]:
        """The dict loop's call of a plain ``TensorDictModule``'s ``module``: its output is
        written into the root's dict when it fits the batch, else through a TensorDict (which
        casts, moves or raises as the generic loop would)."""
        batch_size, device = self.env.batch_size, self.env.device
        nb, make_root, tensor = len(batch_size), self._make_root, torch.Tensor

        def act(root: dict) -> dict:
            out = module(*[root[k] for k in in_keys])
            if type(out) is tuple:
                out = out[0]
            if type(out) is tensor and out.device == device and out.shape[:nb] == batch_size:
                root[out_key] = out
                return root
            holder = make_root(root)
            holder.set(out_key, out)
            return entries(holder)

        return act

    def _dict_rollout(self, td: TensorDict, steps: int, plan: tuple) -> tuple[TensorDict, list]:
        """Run ``steps`` env steps from the root ``td`` on plain ``{key: tensor}`` dicts.

        Does what the generic loop does (policy, ``env.step``, the next root) with the
        env's dict stepper, its dict resetter at episode ends (else :meth:`_next_root`) and
        one stack at the end.

        Returns:
            ``(batch, traj_ids)``: the batch ``(*env_batch, steps)`` without trajectory ids,
            and the per-step trajectory-id tensors. ``self._td`` is the new root.
        """
        stepper, resetter, act = plan
        nb = len(self.env.batch_size)
        make_root, rk = self._make_root, self._reward_keys
        roots, nexts, ids = [], [], []
        root = entries(td)  # the root's own dict: the policy writes into it, as in the loop
        for _ in range(steps):
            root = act(root)
            nxt, any_done = stepper(root)
            roots.append(root)
            nexts.append(nxt)
            ids.append(self._traj_ids)
            if any_done is None:
                done = nxt[DONE]
                any_done = done.item() if done.numel() == 1 else bool(done.any())
            if any_done and resetter is not None:  # what _next_root does, on dicts
                done = nxt[DONE]
                root = resetter({k: v for k, v in nxt.items() if k not in rk}, done)
                self._new_traj_ids(done.reshape(self._traj_ids.shape))
            elif any_done:  # the generic reset path (new trajectory ids)
                reset = self._next_root(make_root(nxt))
                root = entries(reset)
            else:
                root = {k: v for k, v in nxt.items() if k not in rk}
        self._td = make_root(root)
        return _stack_dicts(roots, nexts, make_root, nb, skip=self._unstored), ids

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        """Counters and the current env root (to resume a run)."""
        return {"frames": self.frames, "next_traj_id": self._next_traj_id,
                "traj_ids": self._traj_ids.clone(),
                "td": None if self._td is None else self._td.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.frames = int(state["frames"])
        self._next_traj_id = int(state["next_traj_id"])
        self._traj_ids = state["traj_ids"].clone()
        self._td = state["td"]

    def shutdown(self) -> None:
        """Close the env if the collector built it (idempotent)."""
        if not self._closed:
            self._closed = True
            if self._owns_env:
                self.env.close()

    def __repr__(self) -> str:
        return (f"Collector(env={self.env!r}, frames_per_batch={self.frames_per_batch}, "
                f"total_frames={self.total_frames}, frames={self.frames})")


def _stack_dicts(roots: list, nexts: list, make_root, dim: int, skip=()) -> TensorDict:
    """Stack per-step root and ``"next"`` dicts into one TensorDict ``(*env_batch, T)``;
    ``"next"`` entries named in ``skip`` (``compact_obs``) are not stacked at all."""
    n_root, n_next = len(roots[0]), len(nexts[0])
    try:
        if any(len(r) != n_root for r in roots) or any(len(n) != n_next for n in nexts):
            raise KeyError
        nxt = {k: torch.stack([n[k] for n in nexts], dim) for k in nexts[0] if k not in skip}
        source = {k: torch.stack([r[k] for r in roots], dim) for k in roots[0]}
    except (KeyError, RuntimeError, TypeError):
        # keys differ between steps: the generic per-step TensorDicts and their stack
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
    source[NEXT] = new_td(nxt, size, device)
    return new_td(source, size, device)
