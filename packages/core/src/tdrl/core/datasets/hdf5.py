"""Reading HDF5 dataset files so that a damaged file is refused naming the file and the key.

h5py's own errors on a corrupted file (``KeyError: 'Unable to synchronously open object
(bad object header version number)'``, ``RuntimeError: ... check link existence ...``) name
neither; and a dataset whose header declares more rows than the file stores (a writer that
died, a partial copy) reads as fill values without any error. :func:`dataset` and
:func:`read_rows` turn the first into :class:`DatasetFormatError` naming ``file: key``;
:func:`check_stored` refuses the second with both row counts.
"""

from __future__ import annotations

import math
import os
from collections import Counter

import numpy as np

from tdrl.core._optional import require
from tdrl.core.datasets._transitions import DatasetFormatError

__all__ = ["H5_ERRORS", "h5py_module", "open_file", "dataset", "keys", "check_stored",
           "read_rows"]

H5_ERRORS = (OSError, KeyError, RuntimeError, ValueError, TypeError)
"""What h5py raises on a damaged file (its own exception classes derive from these)."""


def h5py_module(what: str):
    """``h5py``, or an error naming the ``offline`` extra."""
    return require("h5py", extra="offline", what=what)


def open_file(path: str | os.PathLike, what: str):
    """Open ``path`` read-only; :class:`DatasetFormatError` naming it if HDF5 refuses it
    (not HDF5, truncated: h5py compares the file's size with the end its superblock records)."""
    h5py = h5py_module(what)
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"No {what} file at {path!r}.")
    try:
        return h5py.File(path, "r")
    except H5_ERRORS as err:
        raise DatasetFormatError(f"{path!r} is not an HDF5 file or is damaged (truncated, "
                                 f"corrupted): {err}") from err


def keys(group, path: str) -> list[str]:
    """The member names of ``group``, or an error naming the file and the group."""
    try:
        return list(group.keys())
    except H5_ERRORS as err:
        raise DatasetFormatError(f"{path}: cannot list {group.name!r} (the file is "
                                 f"damaged): {err}") from err


def dataset(group, name: str, path: str, *, required: bool = True):
    """``group[name]`` (a dataset or a group; ``None`` when absent and not ``required``),
    with numeric data checked; a damaged entry raises naming ``path`` and the key."""
    h5py = h5py_module("HDF5 datasets")
    where = f"{group.name.rstrip('/')}/{name}"
    try:
        if name not in group:
            if required:
                raise DatasetFormatError(f"{path}: no {where!r}.")
            return None
        node = group[name]
        is_data = isinstance(node, h5py.Dataset)
        dtype, _ = (node.dtype, node.shape) if is_data else (None, None)  # a damaged header raises
    except H5_ERRORS as err:
        raise DatasetFormatError(f"{path}: cannot read {where!r} (the file is damaged): "
                                 f"{err}") from err
    if not isinstance(node, (h5py.Dataset, h5py.Group)):
        raise DatasetFormatError(f"{path}: {where!r} is a {type(node).__name__}, expected a "
                                 "dataset or a group (a damaged header?).")
    if is_data and (dtype.kind not in "biuf" or dtype.itemsize > 8):
        raise DatasetFormatError(f"{path}: {where!r} has dtype {dtype}, expected bool, "
                                 "integers or floats of at most 64 bits (a damaged header?).")
    return node


def check_stored(ds, path: str) -> None:
    """Refuse a dataset whose header declares more rows than the file stores.

    A contiguous dataset stores ``rows x row bytes``; a chunked one one chunk per tile of
    its shape. Unwritten rows would read as the fill value (zeros) with no error.
    """
    declared = int(ds.shape[0]) if ds.shape else 1
    if declared == 0:
        return
    row_bytes = ds.dtype.itemsize * math.prod(ds.shape[1:])
    try:
        if ds.chunks is None:
            held = int(ds.id.get_storage_size()) // max(row_bytes, 1)
        else:
            tiles = [math.ceil(n / c) for n, c in zip(ds.shape, ds.chunks, strict=True)]
            per_row_tile = math.prod(tiles[1:])
            counts = Counter(ds.id.get_chunk_info(i).chunk_offset[0] // ds.chunks[0]
                             for i in range(ds.id.get_num_chunks()))
            full = 0  # leading row tiles stored whole (a damaged header may declare 2**60 rows)
            while full < tiles[0] and counts.get(full, 0) >= per_row_tile:
                full += 1
            held = min(full * ds.chunks[0], declared)
    except H5_ERRORS as err:
        raise DatasetFormatError(f"{path}: cannot read the storage of {ds.name!r} (the file "
                                 f"is damaged): {err}") from err
    if held < declared:
        raise DatasetFormatError(
            f"{path}: {ds.name!r} declares {declared} rows in its header but the file stores "
            f"{held} (a partial write or copy; the rest would read as zeros).")


def read_rows(ds, start: int, stop: int, path: str) -> np.ndarray:
    """Rows ``[start, stop)`` of ``ds``; a read error (a damaged chunk, a failed checksum
    filter) raises naming the file, the key and the rows."""
    try:
        return np.asarray(ds[start:stop])
    except H5_ERRORS as err:
        raise DatasetFormatError(f"{path}: cannot read rows {start}:{stop} of {ds.name!r} "
                                 f"(the file is damaged): {err}") from err
