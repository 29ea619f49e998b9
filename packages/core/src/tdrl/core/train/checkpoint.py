"""Atomic checkpoints that load with ``torch.load(weights_only=True)``.

A checkpoint is a tree of plain data (tensors, dicts, lists, tuples, numbers, strings,
``None``). Anything else is encoded on save and decoded on load:

* ``TensorDict`` -> ``{"__tensordict__": ..., "batch_size": [...]}``;
* ``numpy`` arrays -> tensors (``{"__ndarray__": tensor}``); ``torch.Size`` -> list;
* RNG states of ``random``, ``numpy`` and ``torch`` (CPU and CUDA) via :func:`rng_state`.

Writes go to a temporary file in the same directory, are flushed and fsync'ed, then
``os.replace``'d over the target: a crash never leaves a half-written checkpoint. The
temporary file a killed save left behind is deleted by the next save of the same target
(one writer per target is assumed). :meth:`Checkpointer.load` falls back to the newest
checkpoint that loads, with a warning naming any file that does not.

The bytes are serialised in memory, their disk blocks reserved before writing
(:mod:`tdrl.core.diskio`: a full disk is an ``OSError`` naming the file and the bytes needed),
and their SHA-256 is written beside them (``step_<n>.pt.sha256``); :func:`load_checkpoint`
verifies it, so a flipped bit is an error naming the file instead of silently wrong weights.
"""

from __future__ import annotations

import glob
import io
import logging
import os
import random
import re
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from tdrl.core.diskio import ChecksumError, sha256_bytes, verify_sha256, write_bytes

__all__ = [
    "to_plain_data",
    "from_plain_data",
    "save_checkpoint",
    "load_checkpoint",
    "rng_state",
    "set_rng_state",
    "Checkpointer",
    "ChecksumError",
    "verify_checkpoint",
]

_TD, _ND, _SIZE = "__tensordict__", "__ndarray__", "__size__"
_log = logging.getLogger(__name__)


def _remove_stale_tmp(path: Path) -> None:
    """Delete the temporary files earlier, interrupted saves of ``path`` left behind."""
    for stale in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        try:
            stale.unlink()
            _log.info("Removed %s, left by an interrupted checkpoint save.", stale)
        except OSError:
            pass


def to_plain_data(obj: Any) -> Any:
    """``obj`` as plain data that ``torch.load(weights_only=True)`` reads: TensorDicts, numpy
    arrays and ``torch.Size`` encoded as tagged dicts (:func:`from_plain_data` decodes them)."""
    if isinstance(obj, TensorDictBase):
        return {_TD: to_plain_data(obj.to_dict()), "batch_size": list(obj.batch_size)}
    if isinstance(obj, torch.Size):
        return {_SIZE: list(obj)}
    if isinstance(obj, np.ndarray):
        return {_ND: torch.from_numpy(np.ascontiguousarray(obj))}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, dict):
        return {k: to_plain_data(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [to_plain_data(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(to_plain_data(v) for v in obj)
    if obj is None or isinstance(obj, (torch.Tensor, bool, int, float, str)):
        return obj
    raise TypeError(
        f"Cannot checkpoint an object of type {type(obj).__name__}: use tensors, dicts, lists, "
        "numbers, strings, TensorDicts or numpy arrays (call .state_dict() on modules, "
        "optimisers, buffers and collectors)."
    )


def from_plain_data(obj: Any) -> Any:
    """The inverse of :func:`to_plain_data`."""
    if isinstance(obj, dict):
        if _TD in obj:
            return TensorDict(from_plain_data(obj[_TD]), batch_size=obj["batch_size"])
        if _ND in obj:
            return obj[_ND].numpy()
        if _SIZE in obj:
            return torch.Size(obj[_SIZE])
        return {k: from_plain_data(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [from_plain_data(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(from_plain_data(v) for v in obj)
    return obj


def rng_state() -> dict:
    """RNG states of ``random``, ``numpy`` (legacy global) and ``torch`` as plain data."""
    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": {"version": version, "state": torch.tensor(internal, dtype=torch.int64),
                   "gauss_next": gauss},
        "numpy": {"name": str(name), "keys": torch.from_numpy(keys.astype(np.int64)),
                  "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore the states saved by :func:`rng_state`."""
    py = state["python"]
    random.setstate((py["version"], tuple(int(x) for x in py["state"].tolist()), py["gauss_next"]))
    npy = state["numpy"]
    np.random.set_state(
        (npy["name"], npy["keys"].numpy().astype(np.uint32), npy["pos"], npy["has_gauss"],
         npy["cached_gaussian"])
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(path: str | os.PathLike, state: dict) -> Path:
    """Atomically write ``state`` (plain data, TensorDicts, numpy arrays) to ``path``.

    Returns:
        The path written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_tmp(path)
    buf = io.BytesIO()
    torch.save(to_plain_data(state), buf)
    data = buf.getbuffer()
    digest = sha256_bytes(data)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    fd, tmp_sum = tempfile.mkstemp(prefix=f".{path.name}.sum.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write_bytes(tmp, data)
        write_bytes(tmp_sum, f"{digest}  {path.name}\n".encode())
        os.replace(tmp_sum, _sum_path(path))
        os.replace(tmp, path)
    except BaseException:
        for t in (tmp, tmp_sum):
            if os.path.exists(t):
                os.unlink(t)
        raise
    return path


def _sum_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def verify_checkpoint(path: str | os.PathLike) -> bool:
    """Compare ``path`` with the SHA-256 saved beside it; ``False`` when there is none (a
    checkpoint of an older tdrl, or a copy without it). Raises :class:`ChecksumError` on a
    mismatch."""
    path = Path(path)
    sums = _sum_path(path)
    if not sums.exists():
        return False
    words = sums.read_text().split()
    verify_sha256(str(path), words[0] if words else "", sums.name,
                  "Use an earlier checkpoint, or delete the .sha256 file to load it anyway.")
    return True


def load_checkpoint(path: str | os.PathLike, map_location: Any = "cpu") -> dict:
    """Load a checkpoint written by :func:`save_checkpoint` with ``weights_only=True``,
    after verifying its SHA-256 where one was saved (:class:`ChecksumError` on a mismatch)."""
    verify_checkpoint(path)
    payload = torch.load(path, map_location=map_location, weights_only=True)
    return from_plain_data(payload)


class Checkpointer:
    """Saves and restores a training run: anything with ``state_dict`` /
    ``load_state_dict`` (modules, optimisers, replay buffers, collectors, schedulers,
    target updaters), extra plain values, and the RNG states.

    Args:
        directory: where ``step_<n>.pt`` files go.
        keep: how many recent checkpoints to keep (older ones are deleted).

    Example:
        >>> ckpt = Checkpointer("runs/ckpt")
        >>> ckpt.save(step, model=model, optim=optim, buffer=rb, extra={"epoch": 3})
        >>> extra = ckpt.load(model=model, optim=optim, buffer=rb)   # latest
    """

    _PATTERN = re.compile(r"step_(\d+)\.pt$")

    def __init__(self, directory: str | os.PathLike, keep: int = 3) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}.")
        self.directory = Path(directory)
        self.keep = keep

    def checkpoints(self) -> list[Path]:
        """Existing checkpoints, oldest first."""
        if not self.directory.exists():
            return []
        found = [(int(m.group(1)), p) for p in self.directory.iterdir()
                 if (m := self._PATTERN.search(p.name))]
        return [p for _, p in sorted(found)]

    def latest(self) -> Path | None:
        ckpts = self.checkpoints()
        return ckpts[-1] if ckpts else None

    def save(self, step: int, extra: dict | None = None, **objects: Any) -> Path:
        """Write ``step_<step>.pt`` holding every object's ``state_dict()``, ``extra``,
        the step and the RNG states; prune old checkpoints."""
        state = {"step": int(step), "rng": rng_state(), "extra": extra or {}, "objects": {}}
        for name, obj in objects.items():
            if not hasattr(obj, "state_dict"):
                raise TypeError(f"{name!r} ({type(obj).__name__}) has no state_dict().")
            state["objects"][name] = obj.state_dict()
        path = save_checkpoint(self.directory / f"step_{int(step)}.pt", state)
        for old in self.checkpoints()[: -self.keep]:
            old.unlink(missing_ok=True)
            _sum_path(old).unlink(missing_ok=True)
        return path

    def _load_newest(self) -> tuple[Path, dict]:
        """The newest checkpoint that loads; a broken one (e.g. truncated by a full disk or
        a copy) is skipped with a warning naming it."""
        ckpts = self.checkpoints()
        if not ckpts:
            raise FileNotFoundError(f"No checkpoint (step_<n>.pt) in {self.directory}.")
        broken = []
        for path in reversed(ckpts):
            try:
                return path, load_checkpoint(path)
            except Exception as err:  # noqa: BLE001 - torch raises many types on bad files
                reason = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
                broken.append(f"{path} ({reason})")
                warnings.warn(f"Checkpoint {path} does not load ({reason}); trying the "
                              "previous one.", RuntimeWarning, stacklevel=3)
        raise RuntimeError(f"No checkpoint in {self.directory} loads: " + "; ".join(broken))

    def load(self, path: str | os.PathLike | None = None, restore_rng: bool = True,
             **objects: Any) -> dict:
        """Restore ``objects`` (by name) from ``path`` (default: the newest checkpoint that
        loads; broken newer ones are skipped with a ``RuntimeWarning`` naming them).

        Returns:
            ``{"step": int, "extra": dict}``.
        """
        if path is not None:
            path = Path(path)
            state = load_checkpoint(path)
        else:
            path, state = self._load_newest()
        missing = set(objects) - set(state["objects"])
        if missing:
            raise KeyError(
                f"Checkpoint {path} has no state for {sorted(missing)}; it holds "
                f"{sorted(state['objects'])}."
            )
        for name, obj in objects.items():
            obj.load_state_dict(state["objects"][name])
        if restore_rng:
            set_rng_state(state["rng"])
        return {"step": state["step"], "extra": state["extra"]}
