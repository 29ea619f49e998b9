"""An auto-batching inference server: many env workers, one policy forward per batch.

Env workers send the policy inputs of their current step (``policy.in_keys`` of the root);
the server gathers requests until it holds ``max_batch`` rows, or every worker that will ask
has asked, or ``max_wait_s`` passed since the first one, runs the policy once on the
concatenated rows (``torch.no_grad``, the collector's interaction type) and gives each
worker its rows of the output with the weights' version. ``update_weights`` copies new
weights into the served policy between two forwards and increments the version.

:class:`InferenceServer` is the batching core (the policy copy, its weights, the forward):
:meth:`~InferenceServer.run` takes plain ``{key: tensor}`` rows (what the thread and process
transports of :mod:`.inference_slab` keep in shared slabs), :meth:`~InferenceServer.forward`
a list of TensorDicts (the Ray transport, :mod:`.inference_ray`). The server runs in a thread
of the trainer process, so weights never leave it; a policy on a GPU is served there while
the env workers stay on the CPU.
"""

from __future__ import annotations

import copy
import threading

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import InteractionType, TensorDictModule, set_interaction_type

from ..envs.seeding import seed_if_unseeded
from .single import Collector, policy_device

__all__ = ["InferenceServer", "VERSION_KEY", "versioned", "worker_collector"]

VERSION_KEY = ("collector", "policy_version")


def worker_collector(make_env, policy, in_keys: list, frames: int, exploration: InteractionType,
                     seed: int | None, index: int, n_workers: int, local: bool,
                     default_seed: int | None = None) -> Collector:
    """The :class:`Collector` an env worker of every transport runs: its env, ``policy`` (the
    worker's stand-in for the server, or its own copy if ``local``), trajectory ids disjoint
    across the ``n_workers`` workers, the first root already reset (the first rollout's);
    raises ``KeyError`` if that root lacks one of the policy's ``in_keys``; ``default_seed`` seeds
    an env its maker left unseeded (:func:`~tdrl.core.envs.seeding.seed_if_unseeded`)."""
    collector = Collector(make_env, policy, frames_per_batch=frames, exploration_type=exploration,
                          seed=seed)
    seed_if_unseeded(collector.env, default_seed)
    try:
        collector._traj_stride, collector._traj_offset = n_workers, index
        collector._own_interaction = local  # otherwise the server sets it for its forward
        root = collector._td = collector._start()
        missing = [k for k in in_keys if k not in root.keys(True, True)]
        if missing:
            raise KeyError(f"The policy reads {missing}, which the env's root does not hold after "
                           f"reset; its keys are {sorted(map(str, root.keys(True, True)))}.")
    except BaseException:
        collector.shutdown()
        raise
    return collector


def versioned(batch: TensorDictBase, versions: list[int], env_batch: torch.Size) -> TensorDictBase:
    """``batch`` ``(*env_batch, T)`` with the weights' version of each step's action."""
    ver = torch.tensor(versions, dtype=torch.int64)
    batch.set(VERSION_KEY, ver.expand(*env_batch, len(versions)).clone())
    return batch


class InferenceServer:
    """The batching core: a private copy of the policy, its weights' version, one forward.

    Args:
        policy: a ``TensorDictModuleBase`` (its ``in_keys`` are what workers send); the
            server deep-copies it, so training the original never races a forward.
        max_batch: most rows in one forward (``None``: no limit).
        max_wait_s: longest wait, after the first request, for more requests.
        exploration_type: interaction type of the forward.
    """

    def __init__(self, policy, *, max_batch: int | None = None, max_wait_s: float = 0.002,
                 exploration_type: InteractionType = InteractionType.RANDOM) -> None:
        if max_batch is not None and (isinstance(max_batch, bool) or not isinstance(max_batch, int)
                                      or max_batch < 1):
            raise ValueError(f"max_batch must be an int >= 1 or None, got {max_batch!r}.")
        if not max_wait_s >= 0:
            raise ValueError(f"max_wait_s must be >= 0 seconds, got {max_wait_s!r}.")
        in_keys = getattr(policy, "in_keys", None)
        if not in_keys:
            raise TypeError("The inference server needs a TensorDict module with in_keys "
                            f"(e.g. a TensorDictModule), got {type(policy).__name__}.")
        self.in_keys = list(in_keys)
        self.policy = copy.deepcopy(policy)
        self._params = (TensorDict.from_module(self.policy).data
                        if isinstance(self.policy, torch.nn.Module) else None)
        self.device = policy_device(self.policy) or torch.device("cpu")
        # a plain TensorDictModule (string keys, one out-key) is served by calling its
        # module on the in-keys; a policy with a ``dict_call`` (ProbabilisticActor) runs that
        # on a plain dict; anything else gets a TensorDict
        plain = (type(self.policy) is TensorDictModule and len(self.policy.out_keys) == 1
                 and all(isinstance(k, str) for k in [*self.in_keys, *self.policy.out_keys]))
        self._module = self.policy.module if plain else None
        self._out_key = self.policy.out_keys[0] if plain else None
        self._acts: dict[int, object] = {}
        self.max_batch = max_batch
        self.max_wait_s = float(max_wait_s)
        self.exploration_type = exploration_type
        self.version = 0
        self.forwards = 0  # number of batched forwards (diagnostics)
        self.rows = 0  # rows served
        self._lock = threading.Lock()

    def update_weights(self, weights) -> int:
        """Copy ``weights`` (a module or a TensorDict of parameters) into the served policy.

        Returns:
            The new version (forwards after this call use these weights).
        """
        if self._params is None:
            raise TypeError("update_weights needs a torch.nn.Module policy.")
        if isinstance(weights, torch.nn.Module):
            weights = TensorDict.from_module(weights)
        with self._lock:
            self._params.update_(weights.data if hasattr(weights, "data") else weights)
            self.version += 1
            return self.version

    def run(self, inputs: dict, rows: int) -> tuple[dict, int]:
        """One policy call on plain rows.

        Args:
            inputs: ``{in_key: tensor [rows, ...]}`` (any device: moved to the policy's).
            rows: the number of rows.

        Returns:
            ``(outputs, version)``: ``{key: tensor [rows, ...]}`` for every entry the policy
            wrote (on the policy's device), and the weights' version the forward used.
        """
        dev = self.device
        if any(v.device != dev for v in inputs.values()):
            inputs = {k: v.to(dev) for k, v in inputs.items()}
        with self._lock, torch.no_grad(), set_interaction_type(self.exploration_type):
            version = self.version
            if self._module is not None:
                out = self._module(*[inputs[k] for k in self.in_keys])
                out = {self._out_key: out[0] if type(out) is tuple else out}
            else:
                act = self._dict_act(rows)
                if act is not None:
                    root = act(dict(inputs))
                    out = {k: v for k, v in root.items() if k not in inputs}
                else:
                    td = self.policy(TensorDict(dict(inputs), batch_size=[rows], device=dev))
                    out = {k: td.get(k) for k in td.keys(True, True) if k not in inputs}
        self.forwards += 1
        self.rows += rows
        return out, version

    def _dict_act(self, rows: int):
        if rows not in self._acts:
            if len(self._acts) > 64:
                self._acts.clear()
            dict_call = getattr(self.policy, "dict_call", None)
            self._acts[rows] = None if dict_call is None else dict_call(torch.Size([rows]), self.device)
        return self._acts[rows]

    def forward(self, inputs: list[TensorDictBase]) -> tuple[list[TensorDictBase], int]:
        """One policy call on the rows of every request.

        Args:
            inputs: one TensorDict per request (any batch size; rows are its flattened batch).

        Returns:
            ``(outputs, version)``: per request, the entries the policy wrote (same batch size
            as its input), and the weights' version the forward used.
        """
        flat = [td.reshape(-1) if td.batch_dims != 1 else td for td in inputs]
        sizes = [td.batch_size[0] for td in flat]
        big = flat[0] if len(flat) == 1 else torch.cat(flat, 0)
        home = big.device
        if home != self.device:
            big = big.to(self.device)
        before = set(big.keys(True, True))
        with self._lock, torch.no_grad(), set_interaction_type(self.exploration_type):
            out = self.policy(big.clone(False))
            version = self.version
        out = out.select(*[k for k in out.keys(True, True) if k not in before])
        if home != self.device:
            out = out.to(home)
        self.forwards += 1
        self.rows += big.batch_size[0]
        parts = out.split(sizes, 0) if len(sizes) > 1 else [out]
        return [p.reshape(td.batch_size) for p, td in zip(parts, inputs, strict=True)], version
