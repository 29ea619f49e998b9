"""``check_env_specs``: run a short rollout and compare it, key by key, with the specs."""

from __future__ import annotations

from tensordict import TensorDictBase

from ..keys import NEXT
from .common import RESET_KEY, EnvBase, step_mdp

__all__ = ["check_env_specs"]


def _leaves(td: TensorDictBase) -> dict:
    return {k: td.get(k) for k in td.keys(include_nested=True, leaves_only=True)}


def _nest(prefix: str | None, key):
    if prefix is None:
        return key
    return (prefix, key) if isinstance(key, str) else (prefix, *key)


def check_env_specs(
    env: EnvBase,
    max_steps: int = 3,
    seed: int | None = None,
    break_when_any_done: bool = False,
    check_values: bool = True,
) -> None:
    """Check that a rollout of ``env`` has exactly the keys, shapes, dtypes (and values)
    its specs announce.

    The reference is ``env.fake_tensordict()``: at every step, every key of the data must
    be there and vice versa, with the same shape and dtype; with
    ``check_values`` every observation, action, reward, done and state entry must lie in
    its spec (``spec.is_in``).

    Args:
        env: the environment (it is reset and stepped with random actions).
        max_steps: number of steps.
        seed: seed the env first if given.
        break_when_any_done: passed to ``rollout``.
        check_values: also check values against the specs.

    Raises:
        AssertionError: listing every difference (key, what the spec says, what came out).
    """
    if seed is not None:
        env.set_seed(seed)
    fake_leaves = _leaves(env.fake_tensordict())
    problems: list[str] = []
    td = env.reset()
    for step in range(max_steps):
        td = env.rand_action(td)
        if break_when_any_done:
            td = env.step(td)
            nxt = step_mdp(td, env.step_only_keys)  # before the unstored entries leave the step
            env.drop_unstored(td)
        else:
            td, nxt = env.step_and_maybe_reset(td)
        _compare(td, fake_leaves, step, problems)
        if check_values and not problems:
            _check_values(env, td, step, problems)
        if problems:
            break
        if break_when_any_done and bool(td.get(
                (NEXT, env.done_key) if isinstance(env.done_key, str) else (NEXT, *env.done_key)).any()):
            break
        td = nxt
    if problems:
        raise AssertionError(
            f"{type(env).__name__} does not match its specs:\n  - " + "\n  - ".join(problems)
        )


def _compare(td: TensorDictBase, fake_leaves: dict, step: int, problems: list) -> None:
    real_leaves = _leaves(td)
    for key in fake_leaves.keys() - real_leaves.keys():
        problems.append(f"{key!r} is in the specs but not in the data (step {step})")
    for key in real_leaves.keys() - fake_leaves.keys():
        if key == RESET_KEY or (isinstance(key, tuple) and key[-1] == RESET_KEY):
            continue
        problems.append(f"{key!r} is in the data but in no spec (step {step})")
    for key in sorted(real_leaves.keys() & fake_leaves.keys(), key=str):
        r, f = real_leaves[key], fake_leaves[key]
        if r.shape != f.shape:
            problems.append(f"{key!r}: spec shape {tuple(f.shape)}, data shape {tuple(r.shape)}")
        if r.dtype != f.dtype:
            problems.append(f"{key!r}: spec dtype {f.dtype}, data dtype {r.dtype}")


def _check_values(env: EnvBase, td: TensorDictBase, step: int, problems: list) -> None:
    checks = [
        (None, env.observation_spec), (NEXT, env.observation_spec),
        (None, env.full_action_spec), (NEXT, env.full_reward_spec),
        (None, env.full_done_spec), (NEXT, env.full_done_spec),
    ]
    unstored = set(env.unstored_next_keys)
    for prefix, comp in checks:
        for key, spec in comp.items(True, True):
            full = _nest(prefix, key)
            if prefix == NEXT and key in unstored:
                continue  # stored otherwise (e.g. as a delta): the fake TensorDict says how
            why = spec.describe_mismatch(td.get(full))
            if why is not None:
                problems.append(f"{full!r} at step {step}: {why} (spec {spec!r})")
