"""``EnvBase``: the TensorDict environment interface every tdrl environment implements.

Data contract (docs/ARCHITECTURE.md, TorchRL's conventions): ``reset`` returns the observation keys and
the done flags at the root; ``step`` writes step ``t+1`` under ``"next"`` (observations,
``reward``, ``done``, ``terminated``, ``truncated``); reward and done flags have a trailing
dim of 1; a rollout has shape ``(*batch_size, T)``.

Subclasses set the specs in ``__init__`` and implement ``_reset``, ``_step`` and ``_set_seed``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from tensordict import TensorDict, TensorDictBase

from tdrl.core.keys import next_key
from tdrl.core.td_access import entries, get_entry, is_flat_plain, new_td, plain_td_maker, set_entry

from ..keys import DONE, NEXT, REWARD, TERMINATED, TRUNCATED
from ..specs import Categorical, Composite, Unbounded
from ..specs.composite import spec_writes
from ._fastpath import paused_gc
from .env_specs import EnvSpecs
from .seeding import seed_from_torch

__all__ = ["EnvBase", "make_done_spec", "step_mdp", "RESET_KEY"]

RESET_KEY = "_reset"


def make_done_spec(batch_size: Sequence[int], device=None) -> Composite:
    """The default ``full_done_spec``: bool ``done``, ``terminated``, ``truncated`` of shape ``(*batch, 1)``."""
    shape = (*batch_size, 1)
    leaf = Categorical(2, shape, device, torch.bool)
    return Composite(
        {DONE: leaf, TERMINATED: leaf.clone(), TRUNCATED: leaf.clone()},
        shape=batch_size,
        device=device,
    )


def _from_source(source: dict, make: Callable[[dict], TensorDictBase]) -> TensorDictBase:
    """A TensorDict over a step's ``{key: tensor or dict}`` (what a ``dict_stepper`` returns),
    nested dicts as sub-TensorDicts, built by ``make`` (:func:`~tdrl.core.td_access.plain_td_maker`:
    no entry is validated, the env built them)."""
    if dict in map(type, source.values()):
        source = {k: _from_source(v, make) if isinstance(v, dict) else v for k, v in source.items()}
    return make(source)


def step_mdp(td: TensorDictBase, reward_keys: Sequence = (REWARD,)) -> TensorDictBase:
    """The root of step ``t+1``: ``td["next"]`` without the reward keys (tensors are shared).

    Args:
        td: a TensorDict with a ``"next"`` sub-tensordict, as returned by ``EnvBase.step``.
        reward_keys: the keys to drop.

    Returns:
        A new TensorDict with the same batch size.
    """
    nxt = td.get(NEXT)
    if is_flat_plain(nxt):
        # flat plain TensorDict: a new dict of the same tensors, no checks (nested
        # TensorDicts go through ``exclude`` so that the root never shares a container
        # with the stored ``"next"``)
        items = entries(nxt)
        source = {k: v for k, v in items.items() if k not in reward_keys}
        if not any(isinstance(v, TensorDictBase) for v in source.values()):
            return new_td(source, nxt.batch_size, nxt.device)
    return nxt.exclude(*reward_keys)


def _mask_like(mask: torch.Tensor, val: torch.Tensor, n_batch: int) -> torch.Tensor:
    """Reshape a ``(*batch, 1)`` or ``(*batch,)`` mask to broadcast against ``val`` (*batch, ...)."""
    m = mask.reshape(mask.shape[:n_batch])
    return m.reshape(*m.shape, *([1] * (val.ndim - n_batch)))


class EnvBase(EnvSpecs):
    """Base class of tdrl environments.

    Args:
        batch_size: batch size of the environment (``()`` for a single env, ``(n,)`` for n envs).
        device: device of the TensorDicts it reads and writes.
        check_actions: when True, every ``step`` checks the action keys against the action
            spec (shape, dtype, values) and raises an error that names the key, the spec and
            what was given. Off by default: it costs time on every step.

    Attributes:
        observation_spec (Composite): observation keys, shape ``batch_size``.
        full_action_spec (Composite): ``{"action": spec}``; ``action_spec`` is its leaf.
        full_reward_spec (Composite): ``{"reward": Unbounded((*batch, 1))}``.
        full_done_spec (Composite): bool ``done``/``terminated``/``truncated`` ``(*batch, 1)``.
        full_state_spec (Composite): extra inputs ``step`` reads besides the action (often empty).
    """

    _seeded = False  # set by set_seed; envs whose randomness is torch's own generator say True

    def __init__(
        self,
        *,
        batch_size: Sequence[int] | torch.Size = (),
        device: torch.device | str | None = "cpu",
        check_actions: bool = False,
    ) -> None:
        self.batch_size = torch.Size(batch_size)
        self.device = torch.device(device if device is not None else "cpu")
        self.check_actions = check_actions
        self.is_closed = False
        b = self.batch_size
        self._observation_spec = Composite(shape=b, device=self.device)
        self._full_action_spec = Composite(shape=b, device=self.device)
        self._full_reward_spec = Composite(
            {REWARD: Unbounded((*b, 1), self.device, torch.float32)}, shape=b, device=self.device
        )
        self._full_done_spec = make_done_spec(b, self.device)
        self._full_state_spec = Composite(shape=b, device=self.device)

    def reset(self, tensordict: TensorDictBase | None = None, **kwargs) -> TensorDictBase:
        """Reset the environment (or, with a ``"_reset"`` mask, only some sub-envs).

        Args:
            tensordict: optional input. If it holds a bool ``"_reset"`` entry of shape
                ``(*batch, 1)`` (or ``(*batch,)``), only those sub-envs reset; the others keep
                the values ``tensordict`` holds.

        Returns:
            A new TensorDict of batch size ``batch_size`` with the observation keys and the
            done flags (all False for the envs that reset). With a ``"_reset"`` mask, entries
            of ``tensordict`` that the env does not produce are carried over.
        """
        self._assert_open()
        if not self.seeded:  # never seeded: the seed comes from torch's generator (see .seeding)
            if kwargs.get("seed") is not None:
                self._seeded = True
            elif type(self)._set_seed is not EnvBase._set_seed:
                self.set_seed(seed_from_torch(max(1, self.batch_size.numel())))
        mask = None
        if tensordict is not None:
            mask = tensordict.get(RESET_KEY, None)
        if mask is not None and not bool(mask.any()):
            return tensordict.exclude(RESET_KEY)
        out = self._reset_unmerged(tensordict, **kwargs)
        if mask is not None:
            if not bool(mask.all()):
                out = self._merge_partial(out, tensordict, mask)
            # keys the env does not produce (e.g. a policy's recurrent state) are carried
            # over, as TorchRL does; modules use "is_init" to know where an episode starts
            for key in tensordict.keys(include_nested=True, leaves_only=True):
                if key != RESET_KEY and out.get(key, None) is None:
                    out.set(key, tensordict.get(key))
        return out

    def _reset_unmerged(self, tensordict: TensorDictBase | None, **kwargs) -> TensorDictBase:
        """``_reset`` plus default done flags, before partial-reset rows are merged back.

        Wrappers (``TransformedEnv``) call this on their base env so that the merge with
        the caller's tensordict happens once, at the outermost level.
        """
        out = self._reset(tensordict, **kwargs)
        for key, spec in self._full_done_spec.items(True, True):
            if out.get(key, None) is None:
                out.set(key, spec.zero())
        return out

    def _merge_partial(self, out: TensorDictBase, old: TensorDictBase, mask: torch.Tensor):
        n = len(self.batch_size)
        for key in list(out.keys(include_nested=True, leaves_only=True)):
            prev = old.get(key, None)
            if prev is None or key == RESET_KEY:
                continue
            new = out.get(key)
            if prev.shape != new.shape:
                continue
            out.set(key, torch.where(_mask_like(mask, new, n), new, prev))
        return out

    @property
    def last_any_done(self) -> bool | None:
        """Whether any sub-env was done at the last ``step``, when the env knows it without a
        tensor op (a Python bool), else ``None``. Wrappers that may change the done flags
        (transforms) answer ``None``."""
        return None

    def dict_stepper(self) -> Callable[[dict], tuple[dict, bool | None]] | None:
        """A function doing what ``step`` does, on plain dicts, or ``None`` when this env has none.

        ``stepper(root)`` reads the action (and any state input) from ``root``, a dict of
        tensors of the root TensorDict of step ``t``, and returns ``(next, any_done)``:
        ``next`` is a new dict holding what ``step`` would write under ``"next"`` (same
        keys, key order and values) and ``any_done`` is :attr:`last_any_done` after the step.
        Collectors use it to skip building TensorDicts per step; resets still go through
        ``reset``. The answer holds for the env's current settings: ask again after a change
        (``check_actions``, transforms, info keys).
        """
        return None

    def dict_resetter(self) -> Callable[[dict, torch.Tensor], dict] | None:
        """A function doing what a partial ``reset`` does, on plain dicts, or ``None``.

        ``resetter(root, mask)`` returns a new dict equal to what
        ``reset(TensorDict({**root, "_reset": mask}))`` returns: the sub-envs where ``mask``
        (``(*batch, 1)`` bool) is True reset, the others keep the values in ``root``, and the
        entries of ``root`` the env does not produce are carried over. ``root`` holds flat
        string keys. Collectors use it beside :meth:`dict_stepper` so that an episode's end
        costs no TensorDict either. Built from :meth:`_dict_reset` (``None`` by default).
        """
        if type(self).reset is not EnvBase.reset:
            return None
        inner = self._dict_reset_unmerged()
        if inner is None:
            return None
        n = len(self.batch_size)

        def resetter(root: dict, mask: torch.Tensor) -> dict:
            out = inner({**root, RESET_KEY: mask})
            if not bool(mask.all()):
                flat, by_ndim = mask.reshape(mask.shape[:n]), {}
                for key, new in out.items():
                    prev = root.get(key)
                    if prev is not None and prev.shape == new.shape:
                        m = by_ndim.get(new.ndim)
                        if m is None:
                            m = by_ndim[new.ndim] = flat.reshape(*flat.shape, *([1] * (new.ndim - n)))
                        out[key] = torch.where(m, new, prev)
            for key, value in root.items():
                if key not in out:
                    out[key] = value
            return out

        return resetter

    def _dict_reset_unmerged(self) -> Callable[[dict], dict] | None:
        """:meth:`_dict_reset` plus the default done flags (as :meth:`_reset_unmerged`)."""
        if type(self)._reset_unmerged is not EnvBase._reset_unmerged:
            return None
        inner = self._dict_reset()
        done = list(self._full_done_spec.items(True, True))
        if inner is None or not all(isinstance(k, str) for k, _ in done):
            return None

        def reset(root: dict) -> dict:
            out = inner(root)
            for key, spec in done:
                if key not in out:
                    out[key] = spec.zero()
            return out

        return reset

    def _dict_reset(self) -> Callable[[dict], dict] | None:
        """``_reset`` on plain dicts: ``fn(root)`` (``root`` holding the ``"_reset"`` mask)
        returns a new dict of what ``_reset`` produces, before the merge; ``None`` (the
        default) when the env has none."""
        return None

    def step(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Apply the action in ``tensordict`` and write step ``t+1`` under ``"next"``.

        Args:
            tensordict: batch size ``batch_size``, holding ``"action"`` (and any state input).

        Returns:
            ``tensordict`` itself, with ``tensordict["next"]`` = observations, ``reward``
            ``(*batch, 1)``, ``done``/``terminated``/``truncated`` ``(*batch, 1)`` bool.
            Entries already under ``"next"`` that the env does not produce (a recurrent
            policy's next state) are kept, as in TorchRL.

        A plain, unlocked TensorDict without ``"next"`` goes through the env's
        :meth:`dict_stepper` where it has one (the body the collectors run); otherwise, and with
        ``check_actions``, through the checked ``_step``.
        """
        plan = self._step_plan() if type(tensordict) is TensorDict else None
        if plan is not None and not tensordict.is_locked:
            root = entries(tensordict)
            if NEXT not in root:  # the env's dict stepper: what step_and_maybe_reset runs
                root[NEXT] = _from_source(plan[0](root)[0], plan[1])
                return tensordict
        if self.check_actions:
            self._assert_actions(tensordict)
        next_td = self._step(tensordict)
        preset = get_entry(tensordict, NEXT, None)
        if preset is not None:
            # entries a policy wrote for t+1 (e.g. ("next", "recurrent_state")) are kept
            for key in preset.keys(include_nested=True, leaves_only=True):
                if next_td.get(key, None) is None:
                    next_td.set(key, preset.get(key))
        set_entry(tensordict, NEXT, next_td)  # no re-validation of a TensorDict built with the right batch size
        return tensordict

    def _step_checked(self, tensordict: TensorDictBase) -> TensorDictBase:
        """``_step`` with the action check when ``check_actions`` is on: the ``"next"`` content."""
        if self.check_actions:
            self._assert_actions(tensordict)
        return self._step(tensordict)

    def _td_maker(self) -> Callable[[dict], TensorDictBase]:
        """:func:`~tdrl.core.td_access.plain_td_maker` for this env's batch size and device (kept
        while they stay the same)."""
        made = self.__dict__.get("_made_td_maker")
        key = (self.batch_size, self.device)
        if made is None or made[0] != key:
            made = self.__dict__["_made_td_maker"] = (key, plain_td_maker(*key))
        return made[1]

    def _step_plan(self) -> tuple | None:
        """What :meth:`step_and_maybe_reset` needs per step on its dict path, read once:
        ``(stepper, make, reward_keys, unstored)`` (:meth:`dict_stepper`, :meth:`_td_maker`, the
        :attr:`step_only_keys` as plain strings, whether :attr:`unstored_next_keys` is
        non-empty), or ``None`` when the env has no dict stepper. Kept while the stepper is the
        same function and no spec was written to (:func:`~tdrl.core.specs.composite.spec_writes`)."""
        stepper = self.dict_stepper()
        if stepper is None:
            return None
        plan = self.__dict__.get("_made_step_plan")
        if plan is not None and plan[0] is stepper and plan[1] == spec_writes():
            return plan[2]
        step_only = self.step_only_keys
        keys = tuple(step_only) if all(isinstance(k, str) for k in step_only) else None
        found = (stepper, self._td_maker(), keys, bool(self.unstored_next_keys))
        self.__dict__["_made_step_plan"] = (stepper, spec_writes(), found)
        return found

    def step_and_maybe_reset(
        self, tensordict: TensorDictBase
    ) -> tuple[TensorDictBase, TensorDictBase]:
        """Step, then build the root of the next step, resetting the sub-envs that are done.

        Returns:
            ``(tensordict, next_root)``: the stepped tensordict (with ``"next"``) and a new
            TensorDict for step ``t+1`` (``"next"`` without reward; sub-envs that were done
            are reset there).
        """
        any_done = None
        plan = self._step_plan() if type(tensordict) is TensorDict else None
        root = entries(tensordict) if plan is not None and not tensordict.is_locked else None
        if root is not None and NEXT not in root:
            # the env's one step body on plain dicts (what the collector runs): no TensorDict
            # checks, and no tensor op for "any done" where the env knows it as a Python bool
            stepper, make, reward_keys, unstored = plan
            nxt, any_done = stepper(root)
            root[NEXT] = _from_source(nxt, make)  # the plain, unlocked TensorDict's own dict
            resetter = None
            if any_done and reward_keys is not None and isinstance(self.done_key, str):
                resetter = self.dict_resetter()  # episode ends: the env's dict reset, if any
            if (any_done is False or resetter is not None) and reward_keys is not None:
                kept = dict(nxt)
                for key in reward_keys:
                    kept.pop(key, None)
                if resetter is not None:
                    kept = resetter(kept, nxt[self.done_key])
                if unstored:
                    self.drop_unstored(tensordict)
                return tensordict, _from_source(kept, make)
        else:
            tensordict = self.step(tensordict)
        next_root = step_mdp(tensordict, self.step_only_keys)
        self.drop_unstored(tensordict)
        done = next_root.get(self.done_key)
        if any_done or (any_done is None and bool(done.any())):
            set_entry(next_root, RESET_KEY, done.clone())
            next_root = self.reset(next_root)
            if RESET_KEY in next_root.keys():
                del next_root[RESET_KEY]
        return tensordict, next_root

    def rollout(
        self,
        max_steps: int,
        policy: Callable[[TensorDictBase], TensorDictBase] | None = None,
        break_when_any_done: bool = True,
        auto_reset: bool = True,
        tensordict: TensorDictBase | None = None,
        return_contiguous: bool = True,
        auto_cast_to_device: bool = False,
    ) -> TensorDictBase:
        """Run up to ``max_steps`` steps and stack them along a new last batch dim.

        Args:
            max_steps: number of steps.
            policy: callable ``td -> td`` writing the action; random actions if ``None``.
            break_when_any_done: stop after the first step where any sub-env is done;
                otherwise done sub-envs are reset and the rollout goes on.
            auto_reset: reset first (with ``tensordict`` as input if given); if False,
                ``tensordict`` is the starting state.
            tensordict: see ``auto_reset``.
            return_contiguous: stack into one TensorDict (else a lazy stack).
            auto_cast_to_device: accepted for TorchRL's scripts; the policy reads the env's
                TensorDicts where they are (put policy and env on one device).

        Returns:
            A TensorDict of batch size ``(*batch_size, T)`` with ``T <= max_steps``.
        """
        if auto_reset:
            td = self.reset(tensordict)
        elif tensordict is None:
            raise ValueError("rollout(auto_reset=False) needs a starting `tensordict`.")
        else:
            td = tensordict
        steps = []
        done_key = self.done_key
        with paused_gc():  # see paused_gc: the kept steps would trigger full collections
            for _ in range(max_steps):
                if policy is None:
                    td = self.rand_action(td)
                else:
                    out = policy(td)
                    td = td if out is None else out  # a policy may write in place, return None
                if break_when_any_done:
                    td = self.step(td)
                    steps.append(td)
                    stop = bool(td.get(next_key(done_key)).any())
                    nxt = None if stop else step_mdp(td, self.step_only_keys)
                    self.drop_unstored(td)
                    if stop:
                        break
                    td = nxt
                else:
                    td, nxt = self.step_and_maybe_reset(td)
                    steps.append(td)
                    td = nxt
            dim = len(self.batch_size)
            if return_contiguous:
                return torch.stack(steps, dim)
            from tensordict import LazyStackedTensorDict

            return LazyStackedTensorDict.lazy_stack(steps, dim)

    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        """Seed the environment; the next ``reset`` starts from this seed. An env reset
        without one draws its seed from torch's default generator (:mod:`.seeding`).

        Returns:
            The next unused seed (``seed`` plus the number of seeds this env consumed), so
            that seeds can be chained across environments.
        """
        nxt = self._set_seed(int(seed))
        self._seeded = True
        return int(nxt) if nxt is not None else int(seed) + 1

    @property
    def seeded(self) -> bool:
        """Whether the env has a seed (``set_seed``, ``reset(seed=)``, or one drawn from
        torch's generator at its first ``reset``, see :mod:`tdrl.core.envs.seeding`)."""
        return self._seeded

    def rand_action(self, tensordict: TensorDictBase | None = None) -> TensorDictBase:
        """Write random actions from the action spec into ``tensordict`` (created if None)."""
        if tensordict is None:
            tensordict = new_td({}, self.batch_size, self.device)
        for key, spec in self._full_action_spec.items(True, True):
            tensordict.set(key, spec.rand())
        return tensordict

    def rand_step(self, tensordict: TensorDictBase | None = None) -> TensorDictBase:
        """A step with random actions."""
        return self.step(self.rand_action(tensordict))

    def fake_tensordict(self) -> TensorDictBase:
        """A zero TensorDict with every key a step produces (root and ``"next"``)."""
        root = self._observation_spec.zero()
        root.update(self._full_done_spec.zero())
        root.update(self._full_state_spec.zero())
        root.update(self._full_action_spec.zero())
        nxt = self._observation_spec.zero()
        nxt.update(self._full_reward_spec.zero())
        nxt.update(self._full_done_spec.zero())
        root.set(NEXT, nxt)
        return root

    def close(self) -> None:
        """Release the environment's resources (idempotent)."""
        if not self.is_closed:
            self.is_closed = True
            self._close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _assert_open(self) -> None:
        if self.is_closed:
            raise RuntimeError(f"{type(self).__name__} is closed.")

    def _assert_actions(self, td: TensorDictBase) -> None:
        if td.batch_size != self.batch_size:
            raise ValueError(
                f"step() got a TensorDict of batch size {tuple(td.batch_size)}; the env has "
                f"batch_size {tuple(self.batch_size)}."
            )
        for key, spec in self._full_action_spec.items(True, True):
            val = td.get(key, None)
            if val is None:
                raise KeyError(f"step() needs the action key {key!r} (spec {spec!r}); it is missing.")
            if not isinstance(val, torch.Tensor):
                raise TypeError(f"Action {key!r} must be a tensor, got {type(val).__name__}.")
            if val.shape != spec.shape:
                raise ValueError(
                    f"Action {key!r} has shape {tuple(val.shape)}; the action spec {spec!r} "
                    f"expects shape {tuple(spec.shape)}."
                )
            if val.dtype != spec.dtype:
                raise TypeError(
                    f"Action {key!r} has dtype {val.dtype}; the action spec {spec!r} expects "
                    f"dtype {spec.dtype}."
                )
            why = spec.describe_mismatch(val)
            if why is not None:
                raise ValueError(f"Action {key!r} is outside the action spec {spec!r}: {why}.")

    # ------------------------------------------------------------------ to implement
    def _reset(self, tensordict: TensorDictBase | None, **kwargs) -> TensorDictBase:
        raise NotImplementedError

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        raise NotImplementedError

    def _set_seed(self, seed: int) -> int | None:
        raise NotImplementedError

    def _close(self) -> None:
        pass

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(batch_size={tuple(self.batch_size)}, device={self.device}, "
            f"obs={self.observation_keys}, action={self._full_action_spec.keys(True, True)})"
        )
