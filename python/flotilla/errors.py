"""Flotilla's exceptions.

Every error a Flotilla call raises is a :class:`flotilla.Error`, and also the built-in
exception a Python programmer would expect, so ``except FileNotFoundError`` and
``except flotilla.NotFoundError`` both work. ``errno`` holds the Linux errno.
"""

from __future__ import annotations

import errno as _errno


class Error(Exception):
    """Base class of every Flotilla error. ``errno`` is the Linux errno that matches it."""

    errno: int


class NotFoundError(Error, FileNotFoundError):
    """The path, file, subfile or fork does not exist (ENOENT)."""


class AlreadyExistsError(Error, FileExistsError):
    """The path already exists (EEXIST)."""


class PermissionDeniedError(Error, PermissionError):
    """Not allowed (EACCES, EPERM)."""


class IsADirectory(Error, IsADirectoryError):
    """A file operation on a directory (EISDIR)."""


class NotADirectory(Error, NotADirectoryError):
    """A directory operation on something else (ENOTDIR)."""


class NotEmptyError(Error, OSError):
    """The directory is not empty (ENOTEMPTY)."""


class NoSpaceError(Error, OSError):
    """A storage target is full (ENOSPC)."""


class UnavailableError(Error, ConnectionError):
    """A server or target cannot be reached (EHOSTDOWN)."""


class InvalidRequestError(Error, ValueError):
    """Bad input: a shape, stride, dtype, buffer or layout that cannot work (EINVAL)."""


class OverLimitError(Error, ValueError):
    """A request over a server limit (E2BIG); the message names the limit."""


class ClosedError(Error, ValueError):
    """A call on a closed client or file (EBADF)."""


class ServerError(Error, OSError):
    """An I/O or protocol failure (EIO and anything else)."""


_BY_ERRNO: dict[int, type[Error]] = {
    _errno.ENOENT: NotFoundError,
    _errno.EEXIST: AlreadyExistsError,
    _errno.EACCES: PermissionDeniedError,
    _errno.EPERM: PermissionDeniedError,
    _errno.EISDIR: IsADirectory,
    _errno.ENOTDIR: NotADirectory,
    _errno.ENOTEMPTY: NotEmptyError,
    _errno.ENOSPC: NoSpaceError,
    _errno.EHOSTDOWN: UnavailableError,
    _errno.EINVAL: InvalidRequestError,
    _errno.E2BIG: OverLimitError,
    _errno.EBADF: ClosedError,
}


def _from_errno(code: int, message: str) -> Error:
    """The exception for ``code`` (called by the native module)."""
    cls = _BY_ERRNO.get(code, ServerError)
    if issubclass(cls, OSError):
        error = cls(code, message)
    else:
        error = cls(message)
    error.errno = code
    return error


__all__ = [
    "Error",
    "NotFoundError",
    "AlreadyExistsError",
    "PermissionDeniedError",
    "IsADirectory",
    "NotADirectory",
    "NotEmptyError",
    "NoSpaceError",
    "UnavailableError",
    "InvalidRequestError",
    "OverLimitError",
    "ClosedError",
    "ServerError",
]
