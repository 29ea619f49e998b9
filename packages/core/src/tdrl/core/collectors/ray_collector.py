"""A collector whose workers are Ray actors, so collection scales over a Ray cluster.

Each actor runs a single-process :class:`~tdrl.core.collectors.Collector`. Batches come
back through Ray's object store; policy weights are put there once per update
(``ray.put``) and every actor copies them into its policy. ``sync=True`` returns one batch
per actor, stacked ``(num_collectors, *env_batch, T)``; ``sync=False`` returns the first
batch ready ``(*env_batch, T)``. Faults (an env that raises, an actor that dies, a timeout)
surface as :class:`~tdrl.core.envs.WorkerError` carrying Ray's remote traceback.
"""

from __future__ import annotations

import importlib.util
import logging
import time
from collections.abc import Callable

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import InteractionType

from ..envs import EnvBase, WorkerError
from ..envs.parallel import DEFAULT_TIMEOUT_S
from ..envs.seeding import seed_from_torch, seed_if_unseeded
from ..workers import WARN_EVERY_S
from .single import Collector
from .contract import BatchCollector

__all__ = ["RayCollector"]

_log = logging.getLogger(__name__)


def cluster_cpus(ray) -> float | None:
    """The Ray cluster's CPUs now (``None`` if Ray cannot say)."""
    try:
        return float(ray.cluster_resources().get("CPU", 0.0))
    except Exception:  # noqa: BLE001 - informative only
        return None


def warn_unschedulable(ray, log: logging.Logger, who: str, n: int, options: dict, timeout,
                       advice: str = "", noun: str = "actors") -> float | None:
    """Warn (not raise: an autoscaling cluster may grow) when ``n`` actors with ``options``
    ask for more CPUs than the cluster has; returns the cluster's CPUs."""
    have = cluster_cpus(ray)
    wanted = n * float(options.get("num_cpus", 1))
    if have is not None and wanted > have:
        log.warning("%s: %d %s ask for %g CPUs in all, the Ray cluster has %g; the actors "
                    "beyond it wait to be scheduled (timeout=%s s).%s", who, n, noun, wanted, have,
                    timeout, advice)
    return have


def require_ray():
    if importlib.util.find_spec("ray") is None:
        raise ImportError("RayCollector needs Ray: pip install 'tdrl-core[ray]' (or ray>=2.40).")
    import ray

    return ray


class _CollectorActor:
    """Body of a Ray actor: one single-process collector."""

    def __init__(self, make_env, policy, kwargs: dict, idx: int, n: int, default_seed: int | None = None) -> None:
        torch.set_num_threads(1)
        self.collector = Collector(make_env, policy, **kwargs)
        seed_if_unseeded(self.collector.env, default_seed)  # the trainer's draw, for an unseeded env
        self.collector._traj_stride, self.collector._traj_offset = n, idx

    def next_batch(self) -> TensorDictBase:
        return self.collector.rollout()

    def update_weights(self, weights: TensorDictBase) -> bool:
        TensorDict.from_module(self.collector.policy).data.update_(weights)
        return True

    def set_seed(self, seed: int) -> int:
        return self.collector.set_seed(seed)

    def pid(self) -> int:
        import os

        return os.getpid()

    def shutdown(self) -> bool:
        self.collector.shutdown()
        return True


class RayCollector(BatchCollector):
    """Collectors as Ray actors.

    Args:
        create_env_fn: callable building the env inside each actor.
        policy: as in :class:`~tdrl.core.collectors.Collector` (serialised to each actor).
        num_collectors: number of actors.
        frames_per_batch: frames per yielded batch (``sync``: over all actors, split
            evenly; async: per actor batch).
        total_frames: stop after this many frames; ``-1`` never stops.
        sync: stack one batch from every actor (True) or return the first ready (False).
        remote_config: options of the actors (``ray.remote(**remote_config)``), default
            ``{"num_cpus": 1}``.
        ray_init_config: arguments of ``ray.init`` if Ray is not initialised yet (then
            :meth:`shutdown` also shuts Ray down).
        timeout: seconds to wait for a batch, a weight update or a seed before failing
            with a :class:`~tdrl.core.envs.WorkerError` naming the actors that did not
            answer (and the cluster's CPUs: an actor Ray cannot schedule never answers);
            default :data:`~tdrl.core.envs.parallel.DEFAULT_TIMEOUT_S` (300 s). ``None``
            waits without limit, logging a warning every minute. Actor deaths and errors
            are reported at once.
        Other arguments: as in :class:`~tdrl.core.collectors.Collector` (``seed`` seeds
        actor ``i`` with ``seed + 1000 * i``; ``None`` draws one from torch's default
        generator in the trainer, used by the actors whose env its maker left unseeded,
        :mod:`tdrl.core.envs.seeding`).
    """

    def __init__(
        self,
        create_env_fn: Callable[[], EnvBase],
        policy: Callable[[TensorDictBase], TensorDictBase] | None = None,
        *,
        num_collectors: int = 2,
        frames_per_batch: int,
        total_frames: int = -1,
        sync: bool = True,
        init_random_frames: int = 0,
        split_trajs: bool = False,
        exploration_type: InteractionType | str = InteractionType.RANDOM,
        device: torch.device | str | None = None,
        max_frames_per_traj: int | None = None,
        seed: int | None = None,
        remote_config: dict | None = None,
        ray_init_config: dict | None = None,
        timeout: float | None = DEFAULT_TIMEOUT_S,
        compact_obs: bool = False,
    ) -> None:
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds or None, got {timeout!r}.")
        ray = require_ray()
        self._ray = ray
        self._owns_ray = False
        if not ray.is_initialized():
            ray.init(**(ray_init_config or {}))
            self._owns_ray = True
        if isinstance(create_env_fn, EnvBase):
            raise TypeError("RayCollector needs a callable that builds the env in each actor.")
        n = int(num_collectors)
        if n < 1:
            raise ValueError(f"num_collectors must be >= 1, got {num_collectors}.")
        self.num_collectors = n
        self.sync = sync
        per_actor = -(-frames_per_batch // n) if sync else frames_per_batch
        self.frames_per_batch = per_actor * n if sync else per_actor
        self.total_frames = int(total_frames)
        if self.total_frames > 0 and self.total_frames % self.frames_per_batch:
            self.total_frames = -(-self.total_frames // self.frames_per_batch) * self.frames_per_batch
        self.split_trajs = split_trajs
        self.timeout = timeout
        self.frames = 0
        self._policy = policy
        self._closed = False
        kwargs = dict(frames_per_batch=per_actor, total_frames=-1,
                      init_random_frames=-(-init_random_frames // n) if sync else init_random_frames,
                      exploration_type=exploration_type, device=device,
                      max_frames_per_traj=max_frames_per_traj, compact_obs=compact_obs)
        self.compact_obs = bool(compact_obs)  # each actor's Collector drops ("next", obs)
        self._remote_config = dict(remote_config or {"num_cpus": 1})
        warn_unschedulable(ray, _log, "RayCollector", n, self._remote_config, timeout)
        actor_cls = ray.remote(**self._remote_config)(_CollectorActor)
        base = seed_from_torch(1000 * n) if seed is None else None  # one draw: the actors' generators start alike
        self._actors = [
            actor_cls.remote(create_env_fn, policy, dict(kwargs, seed=None if seed is None else seed + 1000 * i),
                             i, n, None if base is None else base + 1000 * i)
            for i in range(n)
        ]
        self._pending: dict = {}  # in-flight next_batch ref -> actor index (async)

    # ------------------------------------------------------------------ helpers
    def _not_answered(self, actors: list[int], what: str, answered: list[int]) -> WorkerError:
        self.shutdown()
        return WorkerError(
            f"RayCollector: actor(s) {actors} did not {what} within timeout={self.timeout} s"
            f" (answered: {answered}). An actor that never answers is often one Ray could "
            f"not schedule: {self.num_collectors} actors asking {self._remote_config} each, "
            f"the cluster has {cluster_cpus(self._ray)} CPUs. Otherwise the env or policy hangs; "
            "pass a larger timeout= if this legitimately takes longer."
        )

    def _wait(self, refs: list, what: str, num_returns: int, owners: list[int]) -> list:
        """``ray.wait`` with the collector's timeout (warning every minute when ``None``);
        raises naming the actors (``owners[j]`` owns ``refs[j]``) that did not answer."""
        ray, start = self._ray, time.monotonic()
        while True:
            left = (WARN_EVERY_S if self.timeout is None
                    else max(0.0, start + self.timeout - time.monotonic()))
            ready, pending = ray.wait(refs, num_returns=num_returns, timeout=left)
            if len(ready) >= num_returns:
                return ready
            late = [owners[refs.index(r)] for r in pending]
            if self.timeout is None:
                _log.warning("RayCollector: still waiting (timeout=None) for actors %s to %s "
                             "after %.0f s.", late, what, time.monotonic() - start)
                continue
            raise self._not_answered(late, what, sorted(set(owners) - set(late)))

    def _get(self, refs, what: str, owners: list[int] | None = None):
        ray = self._ray
        single = not isinstance(refs, list)
        refs_l = [refs] if single else refs
        owners = owners if owners is not None else list(range(len(refs_l)))
        try:
            self._wait(refs_l, what, len(refs_l), owners)
            out = ray.get(refs_l)
        except ray.exceptions.RayActorError as err:
            self.shutdown()
            raise WorkerError(f"A Ray collector actor died; cannot {what}:\n{err}") from None
        except ray.exceptions.RayTaskError as err:
            self.shutdown()
            raise WorkerError(f"A Ray collector raised while trying to {what}:\n{err}") from None
        return out[0] if single else out

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("This collector was shut down.")

    # ------------------------------------------------------------------ API
    def next_batch(self) -> TensorDictBase:
        """One batch: stacked over actors (sync) or the first ready (async)."""
        self._check_open()
        if self.sync:
            refs = [a.next_batch.remote() for a in self._actors]
            out = torch.stack(self._get(refs, "collect a batch"), 0)
        else:
            for i, a in enumerate(self._actors):
                if i not in self._pending.values():
                    self._pending[a.next_batch.remote()] = i
            refs = list(self._pending)
            ref = self._wait(refs, "collect a batch", 1, [self._pending[r] for r in refs])[0]
            i = self._pending.pop(ref)
            out = self._get(ref, "collect a batch", [i])
            self._pending[self._actors[i].next_batch.remote()] = i
        self.frames += self.frames_per_batch
        return out

    def update_policy_weights_(self, weights=None) -> None:
        """Broadcast new weights through the object store and wait until every actor has them.

        Args:
            weights: a module or a TensorDict of parameters; ``None`` reads the policy the
                collector was built with.

        Raises:
            WorkerError: an actor is dead, raised, or did not answer within ``timeout``.
        """
        self._check_open()
        src = self._policy if weights is None else weights
        if isinstance(src, torch.nn.Module):
            src = TensorDict.from_module(src)
        if not isinstance(src, TensorDictBase):
            raise TypeError("update_policy_weights_ needs a module or a TensorDict of parameters.")
        ref = self._ray.put(src.data.detach().clone().cpu())
        self._get([a.update_weights.remote(ref) for a in self._actors], "update the weights")

    def set_seed(self, seed: int) -> int:
        """Seed actor ``i``'s env with ``seed + 1000 * i``; returns the next free seed."""
        self._check_open()
        refs = [a.set_seed.remote(seed + 1000 * i) for i, a in enumerate(self._actors)]
        return max(self._get(refs, "set the seed"))

    @property
    def actors(self) -> list:
        return list(self._actors)

    def shutdown(self) -> None:
        """Kill the actors (and Ray itself if this collector started it); idempotent."""
        if self._closed:
            return
        self._closed = True
        for a in self._actors:
            try:
                self._ray.kill(a)
            except Exception:  # noqa: BLE001 - already dead
                pass
        self._pending.clear()
        if self._owns_ray:
            self._ray.shutdown()

    def __del__(self) -> None:
        try:
            self.shutdown()
        except Exception:  # noqa: BLE001 - interpreter teardown
            pass
