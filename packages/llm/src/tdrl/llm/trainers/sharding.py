"""FSDP2 sharded training for the LLM trainers (``config.fsdp=True`` under ``torch.distributed``).

:func:`shard_model` wraps each decoder layer, then the root, with
``torch.distributed.fsdp.fully_shard``: every rank holds ``1/world_size`` of the weights,
gradients and AdamW state; a layer's weights are all-gathered for its forward and backward and
freed after (``reshard_after_forward``), gradients are reduce-scattered (averaged over ranks,
as DDP averages them). Generation runs the sharded model's forward as is (every rank must then
run the same number of forwards: :class:`tdrl.llm.generation.HFGenerator` stops only when all
ranks are done, see :func:`is_sharded`).

Checkpoints stay one file per rank (as under DDP): :func:`local_state` turns the sharded
(``DTensor``) weights and optimiser moments into this rank's plain local shards, and
:func:`load_local_model` / :func:`load_local_optimizer` put them back into the sharded model
and optimiser; a resume needs the same world size (checked).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["shard_model", "is_sharded", "local_state", "load_local_model", "load_local_optimizer",
           "full_model_state", "check_fsdp", "plain", "no_grad_sync"]


def check_fsdp(owner: str) -> None:
    """Raise ``ValueError`` unless a process group of more than one rank is up (``fsdp=True``
    single-process would shard over one rank: refused rather than silently run unsharded)."""
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        raise ValueError(f"{owner}.fsdp=True needs torch.distributed with 2 or more ranks (launch with "
                         "torchrun --nproc_per_node N); in one process use fsdp=False")


def _decoder_layers(model) -> list[torch.nn.Module]:
    """The repeated blocks of a ``transformers`` model (its ``_no_split_modules`` classes)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:  # not a transformers model: shard the children of its largest ModuleList
        lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
        layers = list(max(lists, key=len)) if lists else []
    return layers


def shard_model(model, owner: str = "fsdp"):
    """``fully_shard`` each decoder layer, then the whole model, over all ranks (in place; the
    model object is returned). Call before building the optimiser."""
    check_fsdp(owner)
    if is_sharded(model):  # e.g. the GRPO app's model after a sharded SFT warm-up
        return model
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    device = next(model.parameters()).device
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for layer in _decoder_layers(model):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def is_sharded(model) -> bool:
    """Whether ``model`` is wrapped by ``fully_shard``."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def _dtensor():
    from torch.distributed.tensor import DTensor

    return DTensor


def local_state(obj: Any) -> Any:
    """``obj`` (a state dict, nested) with every ``DTensor`` replaced by a copy of its local shard."""
    DTensor = _dtensor()
    if isinstance(obj, DTensor):
        return obj.to_local().detach().clone()
    if isinstance(obj, Mapping):
        return {k: local_state(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(local_state(v) for v in obj)
    return obj


def load_local_model(model, state: Mapping[str, torch.Tensor]) -> None:
    """Copy the local shards of :func:`local_state` (``model.state_dict()``) back into the
    sharded ``model``. Raises ``ValueError`` on a missing key or a shard of another shape (a
    checkpoint of another world size)."""
    DTensor = _dtensor()
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    if missing:
        raise ValueError(f"sharded checkpoint: no weights for {missing[:5]}{'...' if len(missing) > 5 else ''}")
    with torch.no_grad():
        for name, t in own.items():
            dst = t.to_local() if isinstance(t, DTensor) else t
            src = state[name]
            if dst.shape != src.shape:
                raise ValueError(f"sharded checkpoint: {name} shard has shape {tuple(src.shape)}, this rank holds "
                                 f"{tuple(dst.shape)} (saved with another number of ranks?)")
            dst.copy_(src)


def load_local_optimizer(optimizer: torch.optim.Optimizer, state: Mapping[str, Any]) -> None:
    """Load an optimiser state of :func:`local_state` into the optimiser of a sharded model:
    each per-parameter tensor shaped like its parameter's shard becomes a ``DTensor`` again."""
    DTensor = _dtensor()
    optimizer.load_state_dict(state)
    for group in optimizer.param_groups:
        for p in group["params"]:
            if not isinstance(p, DTensor):
                continue
            for k, v in optimizer.state.get(p, {}).items():
                if torch.is_tensor(v) and not isinstance(v, DTensor) and v.dim() > 0:
                    optimizer.state[p][k] = DTensor.from_local(v, p.device_mesh, p.placements, run_check=False,
                                                               shape=p.shape, stride=p.stride())


def full_model_state(model) -> dict[str, torch.Tensor]:
    """The whole (unsharded) state dict of a sharded model on CPU, on rank 0 (empty elsewhere).
    A collective: every rank calls it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def plain(t: torch.Tensor) -> torch.Tensor:
    """A ``DTensor`` (e.g. the gradient norm of sharded gradients) as a whole plain tensor."""
    DTensor = _dtensor()
    return t.full_tensor() if isinstance(t, DTensor) else t


@contextmanager
def no_grad_sync(model, world_size: int) -> Iterator[None]:
    """Accumulate gradients locally, without the cross-rank reduction (a micro-batch before
    the last): DDP's ``no_sync``, FSDP2's ``set_requires_gradient_sync(False)``; nothing in one process."""
    if world_size == 1:
        yield
    elif is_sharded(model):
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    else:
        with model.no_sync():
            yield
