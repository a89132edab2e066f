"""Flotilla: a parallel file system for scientific computing, from Python.

>>> import flotilla, numpy as np
>>> client = flotilla.connect("127.0.0.1:7770")          # or FLOTILLA_META
>>> f = client.create("/matrix", subfiles=4, layout="stripe:64k")
>>> m = np.arange(1024 * 1024, dtype=np.float64).reshape(1024, 1024)
>>> f.write_from(m)                                        # one request, no copy
>>> block = np.empty((1024, 16))
>>> f.read_into(block, offset=8 * 100, file_strides=(8 * 1024, 8))  # columns 100..116
>>> f.close()

Files have a linear view (through their layout) and per-subfile forks (``file.fork(i)``);
both take every request shape (:class:`Shape`) and numpy views of any strides
(``read_into`` / ``write_from`` / ``read_array``), blocking or non-blocking (``*_nb``,
returning a :class:`Handle` with ``done()`` / ``wait()``, awaitable from asyncio). The GIL
is released while data moves. Errors are :class:`Error` subclasses that are also the
matching built-in exceptions (see :mod:`flotilla.errors`).

``flotilla://HOST:PORT/path`` URLs work in fsspec (and so pandas, xarray, zarr) through
:class:`flotilla.fs.FlotillaFileSystem`.
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

from . import errors
from ._native import (
    STRIDE_LEVELS_MAX,
    BatchNode,
    Client,
    DirEntry,
    EnwrichFile,
    File,
    Fork,
    Group,
    Handle,
    Shape,
    Stat,
)
from .errors import (
    AlreadyExistsError,
    ClosedError,
    Error,
    InvalidRequestError,
    IsADirectory,
    NoSpaceError,
    NotADirectory,
    NotEmptyError,
    NotFoundError,
    OverLimitError,
    PermissionDeniedError,
    ServerError,
    UnavailableError,
)

__version__ = "0.1.0"

#: The environment variable naming the metadata service when ``connect()`` gets no address.
META_ENV = "FLOTILLA_META"


def connect(meta: Optional[str] = None) -> Client:
    """Connects to the cluster whose metadata service is at ``meta`` ("HOST:PORT"; default:
    the ``FLOTILLA_META`` environment variable). Connections open on the first call."""
    return Client(meta)


def contiguous(file_offset: int, length: int, memory_offset: int = 0) -> Shape:
    """``length`` bytes at ``file_offset``, to or from ``memory_offset`` in the buffer."""
    return Shape.contiguous(file_offset, length, memory_offset)


def strided(
    file_offset: int,
    record_bytes: int,
    file_stride: int,
    count: int,
    memory_stride: Optional[int] = None,
    memory_offset: int = 0,
) -> Shape:
    """``count`` records of ``record_bytes``, ``file_stride`` / ``memory_stride`` bytes apart
    (memory default: packed). Strides may be negative."""
    return Shape.strided(file_offset, record_bytes, file_stride, count, memory_stride, memory_offset)


def nested(
    file_offset: int,
    record_bytes: int,
    levels: Sequence[Tuple[int, int, int]],
    memory_offset: int = 0,
) -> Shape:
    """Records repeated by ``levels`` of ``(file_stride, memory_stride, count)``, innermost
    first."""
    return Shape.nested(file_offset, record_bytes, list(levels), memory_offset)


def batched(nodes: Sequence[BatchNode]) -> Shape:
    """A vector of batch trees (Galley's nested-batched request)."""
    return Shape.batched(list(nodes))


def pieces(pieces: Sequence[Tuple[int, int, int]]) -> Shape:
    """A list request: ``(file_offset, memory_offset, length)`` triples."""
    return Shape.list(list(pieces))


def _register_fsspec() -> None:
    """Makes ``flotilla://`` URLs work in fsspec even without the installed entry point."""
    try:
        import fsspec
    except ImportError:
        return
    fsspec.register_implementation("flotilla", "flotilla.fs.FlotillaFileSystem", clobber=True)


_register_fsspec()

__all__ = [
    "META_ENV",
    "STRIDE_LEVELS_MAX",
    "AlreadyExistsError",
    "BatchNode",
    "Client",
    "ClosedError",
    "DirEntry",
    "EnwrichFile",
    "Error",
    "File",
    "Fork",
    "Group",
    "Handle",
    "InvalidRequestError",
    "IsADirectory",
    "NoSpaceError",
    "NotADirectory",
    "NotEmptyError",
    "NotFoundError",
    "OverLimitError",
    "PermissionDeniedError",
    "ServerError",
    "Shape",
    "Stat",
    "UnavailableError",
    "batched",
    "connect",
    "contiguous",
    "errors",
    "nested",
    "pieces",
    "strided",
]
