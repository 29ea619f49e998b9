"""Data-only files for replay storages: raw arrays described by JSON that tdrl writes.

Nothing here unpickles. A folder of leaves is a JSON description (per leaf: its nested key
as a list of strings, a dtype name from :data:`DTYPES`, the per-item shape and a file name
``leaf_<i>.bin``) and one raw little-endian file per leaf of ``rows * prod(shape)``
elements, opened with ``torch.from_file``. Everything read from disk is checked (format
tag, dtype in the allow-list, file names without path parts, sizes) and anything else is
refused with a :class:`ReplayFormatError` naming the file.

Atomic steps: :func:`write_json` writes a temporary file, optionally fsyncs it, and
``os.replace``-s it over the target; :func:`fsync_dir` makes a rename durable.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from tdrl.core.diskio import allocate, open_new, write_bytes
from tdrl.core.train.checkpoint import from_plain_data, to_plain_data

__all__ = ["ReplayFormatError", "DTYPES", "leaf_specs", "create_leaves", "open_leaves",
           "write_json", "read_json", "fsync_dir", "fsync_file", "build_td", "encode_state",
           "decode_state", "save_state", "load_state"]

DTYPES: dict[str, torch.dtype] = {
    name: getattr(torch, name)
    for name in ("float64", "float32", "float16", "bfloat16", "complex64", "complex128",
                 "int64", "int32", "int16", "int8", "uint8", "bool")
}
_NAMES = {v: k for k, v in DTYPES.items()}
_LEAF_FILE = re.compile(r"leaf_\d{1,6}\.bin")


class ReplayFormatError(ValueError):
    """A replay folder does not hold what tdrl writes (refused without running anything)."""


def fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str) -> None:
    """Make the entries of directory ``path`` (new files, renames) durable."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def write_json(path: str, obj: Any, sync: bool = True) -> None:
    """Replace ``path`` atomically with ``obj`` as JSON (temp file, fsync, rename)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
        if sync:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if sync:
        fsync_dir(os.path.dirname(os.path.abspath(path)))


def read_json(path: str, fmt: str) -> dict:
    """Read a JSON object written by tdrl with ``"format": fmt``; refuse anything else."""
    try:
        with open(path) as f:
            obj = json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ReplayFormatError(
            f"{path} is not tdrl replay metadata (not valid JSON: {err}). tdrl reads only the "
            "JSON and raw array files it writes; remove the folder or point to another one."
        ) from None
    if not isinstance(obj, dict) or obj.get("format") != fmt:
        found = obj.get("format") if isinstance(obj, dict) else type(obj).__name__
        raise ReplayFormatError(
            f"{path} has format {found!r}, expected {fmt!r}. Folders written by tdrl before "
            "this format (tensordict memmaps with pickled metadata) are not loaded, because "
            "loading them can run code; write the data again with this version."
        )
    return obj


def leaf_specs(td: TensorDictBase) -> list[dict]:
    """The JSON description of every leaf of ``td`` (batch dim 0 = rows)."""
    specs = []
    for i, (key, leaf) in enumerate(td.items(include_nested=True, leaves_only=True)):
        key = [key] if isinstance(key, str) else list(key)
        if not isinstance(leaf, torch.Tensor) or leaf.dtype not in _NAMES:
            what = type(leaf).__name__ if not isinstance(leaf, torch.Tensor) else leaf.dtype
            raise TypeError(
                f"Key {key} holds {what}; memory-mapped replay files hold tensors of dtypes "
                f"{sorted(DTYPES)}. Use ListStorage for other objects."
            )
        specs.append({"key": key, "dtype": _NAMES[leaf.dtype], "shape": list(leaf.shape[1:]),
                      "file": f"leaf_{i}.bin"})
    return specs


def _check_spec(spec: Any, where: str) -> tuple[tuple, torch.dtype, list, str]:
    bad = ReplayFormatError(f"{where}: malformed leaf description {spec!r}.")
    if not isinstance(spec, dict):
        raise bad
    key, dtype, shape, name = spec.get("key"), spec.get("dtype"), spec.get("shape"), spec.get("file")
    if (not isinstance(key, list) or not key or not all(isinstance(k, str) for k in key)
            or not isinstance(shape, list)
            or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape)
            or not isinstance(name, str) or not _LEAF_FILE.fullmatch(name)):
        raise bad
    if dtype not in DTYPES:
        raise ReplayFormatError(
            f"{where}: leaf {key} has dtype {dtype!r}; allowed dtypes are {sorted(DTYPES)}."
        )
    return tuple(key), DTYPES[dtype], shape, name


def _map(path: str, rows: int, shape: list, dtype: torch.dtype, shared: bool) -> torch.Tensor:
    numel = rows * math.prod(shape)
    if numel == 0:
        return torch.zeros((rows, *shape), dtype=dtype)
    return torch.from_file(path, shared=shared, size=numel, dtype=dtype).view(rows, *shape)


def create_leaves(folder: str, specs: list[dict], rows: int, sync: bool = True) -> dict:
    """Create zero-filled raw files for ``specs`` in ``folder``; return ``{key: tensor}``
    (shared memory maps of ``[rows, *shape]``)."""
    os.makedirs(folder, exist_ok=True)
    out = {}
    for spec in specs:
        key, dtype, shape, name = _check_spec(spec, folder)
        path = os.path.join(folder, name)
        nbytes = rows * math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        fd = open_new(path)  # no symlink followed
        try:
            allocate(fd, nbytes, path)  # real blocks now: a full disk is an OSError, not a SIGBUS later
        finally:
            os.close(fd)
        out[key] = _map(path, rows, shape, dtype, shared=True)
    if sync:
        fsync_dir(folder)
    return out


def open_leaves(folder: str, specs: Any, rows: int, shared: bool = True) -> dict:
    """Open the raw files described by ``specs`` after checking names, dtypes and sizes."""
    if not isinstance(specs, list):
        raise ReplayFormatError(f"{folder}: 'leaves' must be a list, got {type(specs).__name__}.")
    out = {}
    for spec in specs:
        key, dtype, shape, name = _check_spec(spec, folder)
        path = os.path.join(folder, name)
        if os.path.islink(path):
            raise ReplayFormatError(f"{path} is a symlink (leaf {list(key)}); tdrl writes its leaves as plain "
                                    "files and does not read or write through links.")
        if not os.path.isfile(path):
            raise ReplayFormatError(f"{path} is missing (leaf {list(key)}).")
        want = rows * math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        size = os.path.getsize(path)
        if size != want:
            raise ReplayFormatError(
                f"{path} holds {size} bytes; leaf {list(key)} ({rows} rows of {shape} "
                f"{dtype}) needs {want}. The folder is truncated or was written by something else."
            )
        out[key] = _map(path, rows, shape, dtype, shared=shared)
    return out


def build_td(leaves: dict, rows: int) -> TensorDictBase:
    """A TensorDict ``[rows]`` holding ``leaves`` (``{key tuple: tensor}``) under their keys."""
    td = TensorDict({}, batch_size=[rows])
    for key, leaf in leaves.items():
        td.set(key if len(key) > 1 else key[0], leaf)
    return td


# ---------------------------------------------------------------------- weights-only state
def encode_state(obj: Any) -> Any:
    """Turn TensorDicts into plain dicts so that ``torch.load(weights_only=True)`` reads it
    (the checkpoints' encoding, :func:`tdrl.core.train.checkpoint.to_plain_data`)."""
    try:
        return to_plain_data(obj)
    except TypeError as err:
        raise TypeError(f"{err} A dumped replay buffer is loaded without pickle.") from None


def decode_state(obj: Any) -> Any:
    return from_plain_data(obj)


def save_state(path: str, state: Any) -> None:
    """``torch.save`` the encoded ``state`` to ``path`` and fsync it."""
    buf = io.BytesIO()
    torch.save(encode_state(state), buf)
    write_bytes(path, buf.getbuffer())  # blocks reserved first: a full disk names the file


def load_state(path: str) -> Any:
    """Load what :func:`save_state` wrote, with ``weights_only=True`` (no code runs)."""
    try:
        return decode_state(torch.load(path, map_location="cpu", weights_only=True))
    except Exception as err:  # noqa: BLE001 - UnpicklingError, RuntimeError, EOFError...
        raise ReplayFormatError(
            f"{path} does not load as weights-only data ({type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else ''}). tdrl loads replay state with "
            "torch.load(weights_only=True) only; a file that needs pickle is refused."
        ) from None
