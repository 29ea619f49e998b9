"""Batches of environments: the shared machinery and :class:`SerialEnv`.

A batched env stacks ``num_workers`` copies of an env along a new leading batch dim:
``batch_size = (num_workers, *sub_env.batch_size)``. Data moves through preallocated
buffers (shared memory in :class:`~tdrl.core.envs.ParallelEnv`), one row per worker.
Seeds chain: worker ``i`` gets the seed returned by worker ``i - 1``'s ``set_seed``, so
``SerialEnv`` and ``ParallelEnv`` give identical rollouts under the same seeds.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence

import torch
from tensordict import TensorDictBase

from ..specs import Composite
from .common import RESET_KEY, EnvBase, make_done_spec

__all__ = ["SerialEnv"]


def _leaf_keys(spec: Composite) -> list:
    return spec.keys(include_nested=True, leaves_only=True)


class BatchedEnvBase(EnvBase):
    """Common code of :class:`SerialEnv` and :class:`ParallelEnv` (specs, buffers, protocol).

    Subclasses implement ``_run(cmd, workers, arg)`` that executes a command on the listed
    workers, reading inputs from and writing outputs to the buffers.
    """

    def _setup(self, meta: dict, num_workers: int, device) -> None:
        """Build specs and buffers from one sub-env's ``meta`` (its specs and batch size)."""
        sub_batch = torch.Size(meta["batch_size"])
        super().__init__(batch_size=(num_workers, *sub_batch), device=device,
                         check_actions=self.check_actions)
        b = self.batch_size
        lead = (num_workers,)

        def grow(spec: Composite) -> Composite:
            return spec.expand(*lead, *spec.shape).to(self.device)

        self.observation_spec = grow(meta["observation_spec"])
        self.full_action_spec = grow(meta["full_action_spec"])
        self.full_reward_spec = grow(meta["full_reward_spec"])
        self.full_done_spec = grow(meta["full_done_spec"])
        self.full_state_spec = grow(meta["full_state_spec"])
        self._in_keys = _leaf_keys(self.full_action_spec) + [
            k for k in _leaf_keys(self.full_state_spec) if k not in _leaf_keys(self.full_action_spec)
        ]
        self._next_keys = _leaf_keys(self.observation_spec) + _leaf_keys(
            self.full_reward_spec
        ) + _leaf_keys(self.full_done_spec)
        self._reset_keys = list(dict.fromkeys(
            _leaf_keys(self.observation_spec) + _leaf_keys(self.full_done_spec)
            + _leaf_keys(self.full_state_spec)
        ))
        self._in_keys = [k for k in self._in_keys]
        in_spec = Composite(shape=b, device=self.device)
        for k in self._in_keys:
            in_spec[k] = (self.full_action_spec.get(k) or self.full_state_spec[k]).clone()
        in_spec[RESET_KEY] = make_done_spec(b, self.device)["done"]
        next_spec = Composite(shape=b, device=self.device)
        for k in self._next_keys:
            next_spec[k] = (self.observation_spec.get(k) or self.full_reward_spec.get(k)
                            or self.full_done_spec[k]).clone()
        reset_spec = Composite(shape=b, device=self.device)
        for k in self._reset_keys:
            reset_spec[k] = (self.observation_spec.get(k) or self.full_done_spec.get(k)
                             or self.full_state_spec[k]).clone()
        # Buffers live on the CPU (shared memory for ParallelEnv); outputs move to `device`.
        self._in_buf = in_spec.to("cpu").zero()
        self._next_buf = next_spec.to("cpu").zero()
        self._reset_buf = reset_spec.to("cpu").zero()
        self._on_cpu = self.device.type == "cpu"

    def _share_buffers(self) -> None:
        for buf in (self._in_buf, self._next_buf, self._reset_buf):
            buf.share_memory_()

    # ------------------------------------------------------------------ EnvBase
    def _reset(self, tensordict: TensorDictBase | None, **kwargs) -> TensorDictBase:
        n = self.batch_size[0]
        mask = None if tensordict is None else tensordict.get(RESET_KEY, None)
        if mask is None:
            workers = list(range(n))
            self._in_buf.get(RESET_KEY).fill_(True)
        else:
            mask = mask.reshape(*self.batch_size, 1).to(torch.bool)
            self._in_buf.get(RESET_KEY).copy_(mask)
            workers = mask.reshape(n, -1).any(-1).nonzero().flatten().tolist()
        if tensordict is not None:
            for k in self._in_keys:
                v = tensordict.get(k, None)
                if v is not None:
                    self._in_buf.get(k).copy_(v)
        self._run("reset", workers, None)
        out = self._reset_buf.clone()
        return out if self._on_cpu else out.to(self.device)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        buf = self._in_buf
        for k in self._in_keys:
            buf.get(k).copy_(tensordict.get(k))
        self._run("step", list(range(self.batch_size[0])), None)
        out = self._next_buf.clone()
        return out if self._on_cpu else out.to(self.device)

    def _set_seed(self, seed: int) -> int:
        for i in range(self.batch_size[0]):
            seed = self._run("seed", [i], seed)[0]
        return seed

    def _run(self, cmd: str, workers: Sequence[int], arg) -> list:
        raise NotImplementedError


def env_meta(env: EnvBase) -> dict:
    if env.unstored_next_keys:
        raise ValueError(
            f"A SerialEnv / ParallelEnv sub-env stores {env.unstored_next_keys} of 'next' otherwise "
            "(NextObservationDelta); the batched env moves only the entries its specs name, so the "
            "deltas would be lost. Put the transform outside: "
            "TransformedEnv(ParallelEnv(n, make_env), NextObservationDelta()).")
    return {
        "batch_size": tuple(env.batch_size),
        "seeded": env.seeded,
        "observation_spec": env.observation_spec.cpu(),
        "full_action_spec": env.full_action_spec.cpu(),
        "full_reward_spec": env.full_reward_spec.cpu(),
        "full_done_spec": env.full_done_spec.cpu(),
        "full_state_spec": env.full_state_spec.cpu(),
    }


class WorkerRunner:
    """One sub-env bound to its row of the buffers (in-process for SerialEnv, inside a
    worker for ParallelEnv). Views and destination tensors are looked up once."""

    def __init__(self, env: EnvBase, bufs: tuple, keys: tuple, i: int) -> None:
        in_buf, next_buf, reset_buf = bufs
        in_keys, next_keys, reset_keys = keys
        in_v, next_v, reset_v = in_buf[i], next_buf[i], reset_buf[i]
        self.env = env
        self.step_in = in_v.select(*in_keys)
        self.reset_in = in_v.select(*in_keys, RESET_KEY)
        self.next_pairs = [(k, next_v.get(k)) for k in next_keys]
        self.reset_pairs = [(k, reset_v.get(k)) for k in reset_keys]

    def step(self) -> None:
        out = self.env._step_checked(self.step_in)
        for k, dst in self.next_pairs:
            dst.copy_(out.get(k))

    def reset(self) -> None:
        out = self.env.reset(self.reset_in)
        for k, dst in self.reset_pairs:
            dst.copy_(out.get(k))

    def run(self, cmd: str, arg):
        if cmd == "step":
            return self.step()
        if cmd == "reset":
            return self.reset()
        if cmd == "seed":
            return self.env.set_seed(arg)
        raise ValueError(f"Unknown command {cmd!r}.")


class SerialEnv(BatchedEnvBase):
    """``num_workers`` environments stepped one after the other in this process.

    Args:
        num_workers: number of sub-envs.
        create_env_fn: a callable returning an ``EnvBase`` (or a list of ``num_workers``
            callables).
        create_env_kwargs: keyword arguments for ``create_env_fn`` (or a list of them).
        device: device of the batched TensorDicts.
        check_actions: check actions against the batched spec at every step.

    The batch size is ``(num_workers, *sub_env.batch_size)``.
    """

    def __init__(
        self,
        num_workers: int,
        create_env_fn: Callable[..., EnvBase] | Sequence[Callable[..., EnvBase]],
        create_env_kwargs: dict | Sequence[dict] | None = None,
        device: torch.device | str = "cpu",
        check_actions: bool = False,
    ) -> None:
        self.check_actions = check_actions
        fns, kwargs = per_worker_args(num_workers, create_env_fn, create_env_kwargs)
        self._envs = [fn(**kw) for fn, kw in zip(fns, kwargs, strict=True)]
        self._setup(env_meta(self._envs[0]), num_workers, device)
        self._seeded = all(env.seeded for env in self._envs)  # sub-envs seeded by their maker keep it
        bufs = (self._in_buf, self._next_buf, self._reset_buf)
        keys = (self._in_keys, self._next_keys, self._reset_keys)
        self._runners = [WorkerRunner(env, bufs, keys, i) for i, env in enumerate(self._envs)]

    @property
    def envs(self) -> list[EnvBase]:
        return self._envs

    def _run(self, cmd: str, workers: Sequence[int], arg) -> list:
        return [self._runners[i].run(cmd, arg) for i in workers]

    def _close(self) -> None:
        for env in self._envs:
            env.close()


def per_worker_args(n: int, fn, kwargs) -> tuple[list, list]:
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise ValueError(
            f"A batched env needs num_workers >= 1 (an int), got {n!r}; for a single env "
            "use the env itself."
        )
    fns = list(fn) if isinstance(fn, Sequence) else [fn] * n
    if kwargs is None:
        kws = [{}] * n
    elif isinstance(kwargs, dict):
        kws = [kwargs] * n
    else:
        kws = list(kwargs)
    if len(fns) != n or len(kws) != n:
        raise ValueError(
            f"Expected {n} env constructors and kwargs, got {len(fns)} and {len(kws)}."
        )
    return fns, kws
