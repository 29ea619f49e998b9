"""``EnvSpecs``: the spec attributes every :class:`~tdrl.core.envs.EnvBase` has (TorchRL's names):
the observation / action / reward / done / state specs with their checked setters, their
one-leaf and unbatched views, and the key lists read from them (including the keys a step
writes under ``"next"`` that are not carried to the next root or not stored).

``EnvBase.__init__`` creates the five ``_*_spec`` Composites these read.
"""

from __future__ import annotations

from tensordict import TensorDictBase

from ..keys import ACTION, DONE, NEXT, OBSERVATION, REWARD
from ..specs import Composite, TensorSpec, unbatched_spec
from ..specs.env_views import input_spec_of, output_spec_of, specs_of

__all__ = ["CompositeSpec", "EnvSpecs"]


class CompositeSpec:
    """A spec attribute of :class:`EnvSpecs` (``observation_spec``, ``full_*_spec``): a
    :class:`Composite` of the env's batch shape, stored as ``_<name>`` and checked when set;
    a bare :class:`TensorSpec` is wrapped under ``default_key`` (``None``: refused)."""

    def __init__(self, name: str, default_key: str | None) -> None:
        self.name, self.slot, self.default_key = name, "_" + name, default_key

    def __get__(self, env, owner=None):
        return self if env is None else getattr(env, self.slot)

    def __set__(self, env, spec) -> None:
        setattr(env, self.slot, env._check_composite(spec, self.name, self.default_key))


class EnvSpecs:
    """Mixin of :class:`~tdrl.core.envs.EnvBase`: its specs and keys (see the module docstring)."""

    _observation_spec: Composite
    _full_action_spec: Composite
    _full_reward_spec: Composite
    _full_done_spec: Composite
    _full_state_spec: Composite

    def _check_composite(self, spec, name: str, default_key: str | None) -> Composite:
        """``spec`` as a spec attribute ``name`` of this env, or the error saying why not."""
        if isinstance(spec, TensorSpec):
            if default_key is None:
                raise TypeError(f"{name} must be a Composite, got {type(spec).__name__}.")
            spec = Composite({default_key: spec}, shape=self.batch_size, device=self.device)
        if not isinstance(spec, Composite):
            raise TypeError(f"{name} must be a Composite, got {type(spec).__name__}.")
        if spec.shape != self.batch_size:
            raise ValueError(
                f"{name} must have shape batch_size={tuple(self.batch_size)}, got {tuple(spec.shape)}."
            )
        return spec

    observation_spec = CompositeSpec("observation_spec", OBSERVATION)
    full_action_spec = CompositeSpec("full_action_spec", ACTION)
    full_reward_spec = CompositeSpec("full_reward_spec", REWARD)
    full_done_spec = CompositeSpec("full_done_spec", None)
    full_state_spec = CompositeSpec("full_state_spec", None)
    state_spec = full_state_spec

    @property
    def action_spec(self) -> TensorSpec:
        """The action leaf spec (``full_action_spec["action"]``, or the only leaf)."""
        return self._single_leaf(self._full_action_spec, ACTION, "action")

    @action_spec.setter
    def action_spec(self, spec) -> None:
        self.full_action_spec = spec

    # one sub-env's specs (TorchRL's names): the specs without the batch dims
    action_spec_unbatched = property(lambda self: unbatched_spec(self.action_spec, len(self.batch_size)))
    full_action_spec_unbatched = property(lambda self: unbatched_spec(self.full_action_spec, len(self.batch_size)))
    observation_spec_unbatched = property(lambda self: unbatched_spec(self.observation_spec, len(self.batch_size)))
    input_spec, output_spec, specs = property(input_spec_of), property(output_spec_of), property(specs_of)  # TorchRL's views

    @property
    def reward_spec(self) -> TensorSpec:
        return self._single_leaf(self._full_reward_spec, REWARD, "reward")

    @reward_spec.setter
    def reward_spec(self, spec) -> None:
        self.full_reward_spec = spec

    @property
    def done_spec(self) -> TensorSpec | Composite:
        """The done leaf spec if there is a single done key, else ``full_done_spec``."""
        leaves = self._full_done_spec.keys(True, True)
        return self._full_done_spec[leaves[0]] if len(leaves) == 1 else self._full_done_spec

    @staticmethod
    def _single_leaf(comp: Composite, key: str, what: str) -> TensorSpec:
        if key in comp:
            return comp[key]
        leaves = comp.keys(True, True)
        if len(leaves) == 1:
            return comp[leaves[0]]
        raise KeyError(f"No single {what} spec: the keys are {leaves}; use full_{what}_spec.")

    @property
    def action_keys(self) -> list:
        return self._full_action_spec.keys(True, True)

    @property
    def reward_keys(self) -> list:
        return self._full_reward_spec.keys(True, True)

    @property
    def done_keys(self) -> list:
        return self._full_done_spec.keys(True, True)

    @property
    def observation_keys(self) -> list:
        return self._observation_spec.keys(True, True)

    @property
    def step_only_keys(self) -> list:
        """Keys of ``"next"`` not carried into the next root (``step_mdp``): the rewards, plus a
        ``TransformedEnv``'s transforms' (``NextObservationDelta``'s ``"delta"``)."""
        return self.reward_keys

    @property
    def unstored_next_keys(self) -> list:
        """Keys of ``"next"`` dropped from the stored step once the next root is built from them
        (:meth:`drop_unstored`): none here, a ``TransformedEnv``'s transforms'."""
        return []

    def drop_unstored(self, td: TensorDictBase) -> None:
        """Remove :attr:`unstored_next_keys` from ``td["next"]``, in place."""
        keys = self.unstored_next_keys
        nxt = td.get(NEXT) if keys else None
        for key in keys:
            if nxt.get(key, None) is not None:
                nxt.del_(key)

    @property
    def action_key(self):
        return self.action_keys[0]

    @property
    def reward_key(self):
        return self.reward_keys[0]

    @property
    def done_key(self):
        keys = self.done_keys
        return DONE if DONE in keys else keys[0]

    # ------------------------------------------------------------------ API
