"""``TransformedEnv``: an environment seen through a (composed) transform."""

from __future__ import annotations

from collections.abc import Callable

from tensordict import TensorDictBase

from ..envs.common import EnvBase
from ..keys import NEXT
from .base import Compose, Transform

__all__ = ["TransformedEnv"]


class TransformedEnv(EnvBase):
    """Wrap ``env`` so that its outputs (and specs) pass through ``transform``.

    ``step`` sends a shallow copy of the input through ``transform.inv`` (e.g. action
    scaling) to the base env, then rewrites the base env's ``"next"`` with the transforms'
    ``_step``; ``reset`` rewrites the base env's reset output with ``_reset``. Partial resets
    (``"_reset"`` masks) are merged once, here, so stateful transforms stay consistent.

    Args:
        env: the base environment.
        transform: a transform or ``Compose``; more can be added with ``append_transform``.
        check_actions: check actions against the transformed action spec at every step
            (default: the base env's setting).

    Attributes of the base env that the wrapper does not define are forwarded to it.
    The transforms' statistics are in ``env.state_dict()`` / ``env.transform.state_dict()``.
    """

    def __init__(
        self,
        env: EnvBase,
        transform: Transform | None = None,
        check_actions: bool | None = None,
    ) -> None:
        self.base_env = env
        super().__init__(
            batch_size=env.batch_size,
            device=env.device,
            check_actions=env.check_actions if check_actions is None else check_actions,
        )
        if transform is None:
            transform = Compose()
        elif not isinstance(transform, Compose):
            transform = Compose(transform)
        self.transform = transform
        transform.set_container(self)
        self._refresh_specs()

    def _refresh_specs(self) -> None:
        """Recompute the specs from the base env's specs and the transforms."""
        base, t = self.base_env, self.transform
        self.observation_spec = t.transform_observation_spec(base.observation_spec.clone())
        self.full_reward_spec = t.transform_reward_spec(base.full_reward_spec.clone())
        self.full_done_spec = t.transform_done_spec(base.full_done_spec.clone())
        self.full_action_spec = t.transform_action_spec(base.full_action_spec.clone())
        self.full_state_spec = t.transform_state_spec(base.full_state_spec.clone())

    @property
    def step_only_keys(self) -> list:
        """The base env's, plus the keys the transforms name (see ``Transform.step_only_keys``)."""
        return [*self.base_env.step_only_keys, *self.transform.step_only_keys()]

    @property
    def unstored_next_keys(self) -> list:
        """The base env's, plus the keys the transforms name (``Transform.unstored_next_keys``)."""
        return [*self.base_env.unstored_next_keys, *self.transform.unstored_next_keys()]

    def fake_tensordict(self) -> TensorDictBase:
        """The base rule's zero TensorDict, rewritten by ``Transform.transform_fake_tensordict``."""
        return self.transform.transform_fake_tensordict(super().fake_tensordict())

    def apply(self, fn) -> TransformedEnv:
        """Call ``fn`` on every transform (and their submodules) then on this env, as
        ``nn.Module.apply`` does in TorchRL's scripts (e.g. dumping a ``VideoRecorder``)."""
        self.transform.apply(fn)
        fn(self)
        return self

    def append_transform(self, transform: Transform) -> TransformedEnv:
        """Add ``transform`` after the existing ones; returns self."""
        self.transform.append(transform)
        self._refresh_specs()
        return self

    def insert_transform(self, index: int, transform: Transform) -> TransformedEnv:
        self.transform.insert(index, transform)
        self._refresh_specs()
        return self

    # ------------------------------------------------------------------ EnvBase
    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        if self.transform.has_inv:
            td_in = self.transform.inv(tensordict.copy())
        else:
            td_in = tensordict
        if td_in is tensordict:
            next_td = self.base_env._step_checked(tensordict)
        else:
            next_td = self.base_env.step(td_in).get(NEXT)
        return self.transform._step(tensordict, next_td)

    def dict_stepper(self) -> Callable[[dict], tuple[dict, bool | None]] | None:
        """The base env's dict stepper followed by every transform's ``dict_step`` hook (see
        :meth:`EnvBase.dict_stepper`); ``None`` when the base env or a transform has none,
        when a transform rewrites the action (``inv``) or when actions are checked."""
        if (self.check_actions or self.transform.has_inv or type(self).step is not EnvBase.step
                or type(self)._step is not TransformedEnv._step):
            return None
        base = self.base_env.dict_stepper()
        hook = None if base is None else self.transform.dict_step(self.batch_size, self.device)
        if hook is None:
            return None
        transform, keeps_done = hook

        def stepper(root: dict) -> tuple[dict, bool | None]:
            nxt, any_done = base(root)
            transform(root, nxt)
            return nxt, any_done if keeps_done else None

        return stepper

    def _reset(self, tensordict: TensorDictBase | None, **kwargs) -> TensorDictBase:
        out = self.base_env._reset_unmerged(tensordict, **kwargs)
        return self.transform._reset(tensordict, out)

    def _dict_reset(self) -> Callable[[dict], dict] | None:
        """The base env's dict reset followed by every transform's ``dict_reset`` hook (see
        :meth:`EnvBase.dict_resetter`); ``None`` when one of them has none."""
        if type(self)._reset is not TransformedEnv._reset:
            return None
        base = self.base_env._dict_reset_unmerged()
        hook = None if base is None else self.transform.dict_reset(self.batch_size, self.device)
        if hook is None:
            return None

        def reset(root: dict) -> dict:
            out = base(root)
            hook(root, out)
            return out

        return reset

    def _set_seed(self, seed: int) -> int:
        return self.base_env.set_seed(seed)

    @property
    def seeded(self) -> bool:
        """Whether this env or its base env was seeded (a base env seeded before it was wrapped
        keeps its seed: the first ``reset`` draws none)."""
        return self._seeded or self.base_env.seeded

    def _close(self) -> None:
        self.base_env.close()

    # ------------------------------------------------------------------ modes
    def train(self, mode: bool = True) -> TransformedEnv:
        """Put the transforms in training mode (``mode=True``) or evaluation mode, as
        ``nn.Module.train`` (TorchRL's envs are modules): a :class:`VecNorm` in evaluation
        mode normalises without updating its statistics. Returns self."""
        self.transform.train(mode)
        return self

    def eval(self) -> TransformedEnv:
        """``train(False)``: the normalising transforms stop updating their statistics."""
        return self.train(False)

    @property
    def training(self) -> bool:
        """Whether the transforms are in training mode (see :meth:`train`)."""
        return self.transform.training

    # ------------------------------------------------------------------ state
    def state_dict(self, *args, **kwargs) -> dict:
        """The transforms' state (e.g. running normalisation statistics)."""
        return self.transform.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict: dict, strict: bool = True):
        return self.transform.load_state_dict(state_dict, strict=strict)

    def __getattr__(self, name: str):
        # Only reached when normal lookup fails: forward to the base env.
        if name.startswith("__") or name == "base_env":
            raise AttributeError(name)
        base = self.__dict__.get("base_env")
        if base is None:
            raise AttributeError(name)
        return getattr(base, name)

    def __repr__(self) -> str:
        return f"TransformedEnv(env={self.base_env!r}, transform={self.transform!r})"
