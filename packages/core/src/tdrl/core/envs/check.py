"""``check_env_specs``: run a short rollout and compare it, key by key, with the specs."""

from __future__ import annotations

from tensordict import TensorDictBase

from ..keys import NEXT
from .common import RESET_KEY, EnvBase

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

    The reference is ``env.fake_tensordict()`` expanded with a time dim: every key in the
    rollout must be there and vice versa, with the same shape and dtype; with
    ``check_values`` every observation, action, reward, done and state entry must lie in
    its spec (``spec.is_in``).

    Args:
        env: the environment (it is reset and stepped).
        max_steps: rollout length.
        seed: seed the env first if given.
        break_when_any_done: passed to ``rollout``.
        check_values: also check values against the specs.

    Raises:
        AssertionError: listing every difference (key, what the spec says, what came out).
    """
    if seed is not None:
        env.set_seed(seed)
    real = env.rollout(max_steps, break_when_any_done=break_when_any_done)
    t = real.shape[len(env.batch_size)]
    fake = env.fake_tensordict()
    fake = fake.unsqueeze(-1).expand(*env.batch_size, t)
    real_leaves, fake_leaves = _leaves(real), _leaves(fake)
    problems = []
    for key in fake_leaves.keys() - real_leaves.keys():
        problems.append(f"{key!r} is in the specs but not in the rollout")
    for key in real_leaves.keys() - fake_leaves.keys():
        if key == RESET_KEY or (isinstance(key, tuple) and key[-1] == RESET_KEY):
            continue
        problems.append(f"{key!r} is in the rollout but in no spec")
    for key in sorted(real_leaves.keys() & fake_leaves.keys(), key=str):
        r, f = real_leaves[key], fake_leaves[key]
        if r.shape != f.shape:
            problems.append(f"{key!r}: spec shape {tuple(f.shape)}, rollout shape {tuple(r.shape)}")
        if r.dtype != f.dtype:
            problems.append(f"{key!r}: spec dtype {f.dtype}, rollout dtype {r.dtype}")
    if check_values and not problems:
        checks = [
            (None, env.observation_spec), (NEXT, env.observation_spec),
            (None, env.full_action_spec), (NEXT, env.full_reward_spec),
            (None, env.full_done_spec), (NEXT, env.full_done_spec),
        ]
        for step, td in enumerate(real.unbind(len(env.batch_size))):
            for prefix, comp in checks:
                for key, spec in comp.items(True, True):
                    full = _nest(prefix, key)
                    why = spec.describe_mismatch(td.get(full))
                    if why is not None:
                        problems.append(f"{full!r} at step {step}: {why} (spec {spec!r})")
            if problems:
                break
    if problems:
        raise AssertionError(
            f"{type(env).__name__} does not match its specs:\n  - " + "\n  - ".join(problems)
        )
